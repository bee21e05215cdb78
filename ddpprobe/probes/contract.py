"""Probes for what DDP keeps equal across ranks and what it leaves to the user's code (the DDP contract,
ddpprobe/contract/): an optimizer or scheduler setting computed from a rank-local value, a plain tensor attribute
beside a registered buffer, a dataset each rank builds apart, and the first step against one process.

``ContractProbe`` is a ``Linear(3, 1, bias=False)`` with fixed initial weights ``INITIAL_WEIGHT`` on every rank, fit
by SGD on ``LineDataset``: sample ``i`` is ``x = [i, 1, i % 2]``, ``y = i % 3`` (and its ``id``), a loss of squared
errors averaged (``loss="mean"``) or summed (``loss="sum"``) over the batch.
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer

#: The weights every rank builds (the test computes the expected steps from them).
INITIAL_WEIGHT = (0.5, -0.25, 1.0)
#: The learning rate of rank 0; ``lr_from_rank`` gives rank ``r`` ``BASE_LR * (1 + r)``.
BASE_LR = 0.01


def line_sample(i: int) -> tuple:
    """``(x, y)`` of sample ``i``: ``([i, 1, i % 2], i % 3)`` as floats."""
    return [float(i), 1.0, float(i % 2)], float(i % 3)


class LineDataset(torch.utils.data.Dataset):
    """``n`` samples; item ``i`` is ``{"id": i, "x": (3,) float32, "y": (1,) float32}`` (:func:`line_sample`)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        x, y = line_sample(i)
        return {"id": i, "x": torch.tensor(x), "y": torch.tensor([y])}


class ContractProbe(pl.LightningModule):
    """Records per rank: the ids of each training batch, the gradient before the first optimizer step (after
    DDP's all-reduce), the weights after each step, the learning rate at each step, and ``rank_attr`` /
    ``rank_buffer`` (a plain tensor attribute and a registered buffer, both ``[global_rank]`` from ``__init__``
    when ``attr_from_rank``) at ``on_fit_start`` and at the end.

    Args:
        loss: ``"mean"`` or ``"sum"`` of the batch's squared errors.
        lr_from_rank: rank ``r``'s SGD learning rate is ``BASE_LR * (1 + r)`` (else ``BASE_LR`` on every rank).
        gamma_from_rank: a ``StepLR(step_size=1)`` whose ``gamma`` is ``0.5 / (1 + r)`` on rank ``r`` (else none).
        rank: the rank building the module (the attribute and the buffer are built from it).
    """

    def __init__(self, loss: str = "mean", lr_from_rank: bool = False, gamma_from_rank: bool = False, rank: int = 0):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1, bias=False)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor([INITIAL_WEIGHT]))
        self.loss, self.lr_from_rank, self.gamma_from_rank = loss, lr_from_rank, gamma_from_rank
        self.rank_attr = torch.tensor([float(rank)])
        self.register_buffer("rank_buffer", torch.tensor([float(rank)]))
        self.register_buffer("seen", torch.zeros(1))
        self.ids, self.first_grad, self.weights, self.lrs, self.attrs = [], None, [], [], {}
        self.seen_at_step, self.seen_after_step = [], []

    def on_fit_start(self):
        self.attrs["fit_start"] = {"attr": self.rank_attr.tolist(), "buffer": self.rank_buffer.tolist()}

    def training_step(self, batch, batch_idx):
        self.ids.append([int(i) for i in batch["id"]])
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        self.seen_at_step.append(float(self.seen))
        self.seen += batch["y"].sum()  # a running total kept in a buffer, updated outside any module's forward
        errors = (self.layer(batch["x"]) - batch["y"]) ** 2
        return errors.mean() if self.loss == "mean" else errors.sum()

    def on_before_optimizer_step(self, optimizer):
        if self.first_grad is None:
            self.first_grad = self.layer.weight.grad.flatten().tolist()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.weights.append(self.layer.weight.detach().flatten().tolist())
        self.seen_after_step.append(float(self.seen))

    def on_fit_end(self):
        self.attrs["fit_end"] = {"attr": self.rank_attr.tolist(), "buffer": self.rank_buffer.tolist()}

    def configure_optimizers(self):
        lr = BASE_LR * (1 + self.global_rank) if self.lr_from_rank else BASE_LR
        optimizer = torch.optim.SGD(self.parameters(), lr=lr)
        if not self.gamma_from_rank:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5 / (1 + self.global_rank))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def contract_fit(
    info: RankInfo,
    n: int = 8,
    batch_size: int = 2,
    steps: int = 2,
    loss: str = "mean",
    lr_from_rank: bool = False,
    gamma_from_rank: bool = False,
) -> dict:
    """Scenario: fit ``ContractProbe`` for ``steps`` optimizer steps on ``LineDataset(n)``, batches of
    ``batch_size``.

    Record keys: ``ids`` (per step), ``first_grad`` (3 floats), ``weights`` (per step, 3 floats), ``lrs`` (per step,
    the learning rate the step used), ``attrs`` (``{"fit_start"|"fit_end": {"attr", "buffer"}}``), ``seen_at_step``
    and ``seen_after_step`` (per step, the buffer ``seen`` as ``training_step`` starts, and after the batch: each
    step adds the batch's targets to it in ``training_step``).
    """
    model = ContractProbe(loss, lr_from_rank, gamma_from_rank, rank=info.rank)
    loader = torch.utils.data.DataLoader(LineDataset(n), batch_size=batch_size)
    trainer = ddp_trainer(info, max_steps=steps, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=loader)
    return {
        "ids": model.ids,
        "first_grad": model.first_grad,
        "weights": model.weights,
        "lrs": model.lrs,
        "attrs": model.attrs,
        "seen_at_step": model.seen_at_step,
        "seen_after_step": model.seen_after_step,
    }


class SplitDataModule(pl.LightningDataModule):
    """``setup`` splits ``LineDataset(n)`` with ``torch.utils.data.random_split`` into a validation part of ``val``
    samples and the rest, with the rank's own random state (no generator given): what a user's
    ``random_split`` does in a process that was not seeded alike."""

    def __init__(self, n: int, val: int, batch_size: int):
        super().__init__()
        self.n, self.val, self.batch_size = n, val, batch_size

    def setup(self, stage):
        _, self.val_set = torch.utils.data.random_split(LineDataset(self.n), [self.n - self.val, self.val])

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val_set, batch_size=self.batch_size)


class _IdRecorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.ids = []

    def validation_step(self, batch, batch_idx):
        self.ids += [int(i) for i in batch["id"]]


def split_apart(info: RankInfo, n: int = 12, val: int = 6, batch_size: int = 3, draw_seed: int = 100) -> dict:
    """Scenario: ``torch.manual_seed(draw_seed + rank)`` (each rank's own random state, as fresh processes have),
    then validate with ``SplitDataModule(n, val, batch_size)``.

    Record keys: ``ids`` (the sample ids this rank validated, in order), ``val_set`` (the ids of this rank's
    validation subset, in its order).
    """
    torch.manual_seed(draw_seed + info.rank)
    data = SplitDataModule(n, val, batch_size)
    model = _IdRecorder()
    trainer = ddp_trainer(info)
    trainer.validate(model, datamodule=data, verbose=False)
    return {"ids": model.ids, "val_set": [int(i) for i in data.val_set.indices]}


class _OwnLoaderSchedule(pl.LightningModule):
    """Sizes a ``OneCycleLR`` by ``len(self.train_dataloader())``, the loader the module builds itself (``N / b``
    batches), as Lightning 1.x examples did; records the Trainer's counts and the learning rate after each step."""

    def __init__(self, n: int, batch_size: int):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1, bias=False)
        self.n, self.batch_size = n, batch_size
        self.lrs, self.counts = [], {}

    def train_dataloader(self):
        return torch.utils.data.DataLoader(LineDataset(self.n), batch_size=self.batch_size)

    def training_step(self, batch, batch_idx):
        return ((self.layer(batch["x"]) - batch["y"]) ** 2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def configure_optimizers(self):
        own = len(self.train_dataloader())
        self.counts = {"own_loader": own, "estimated_stepping_batches": int(self.trainer.estimated_stepping_batches)}
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=own)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def own_loader_schedule(info: RankInfo, n: int = 16, batch_size: int = 2) -> dict:
    """Scenario: fit ``_OwnLoaderSchedule(n, batch_size)`` for one epoch.

    Record keys: ``own_loader`` (``len(self.train_dataloader())``), ``estimated_stepping_batches``,
    ``num_training_batches`` (the Trainer's), ``lrs`` (the learning rate after each step).
    """
    model = _OwnLoaderSchedule(n, batch_size)
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
    trainer.fit(model)
    return {**model.counts, "num_training_batches": int(trainer.num_training_batches), "lrs": model.lrs}


class _ShareWriter(pl.LightningModule):
    """Collects the ids of its test batches and, in ``on_test_epoch_end``, writes them sorted, one ``"%04d"`` per
    line, to ``path`` (the same path on every rank) or, with ``per_rank``, to ``path`` + ``".rank<global_rank>"``."""

    def __init__(self, path: str, per_rank: bool):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.path, self.per_rank = path, per_rank
        self.ids = []
        self.written = None
        self.lines_written = 0

    def test_step(self, batch, batch_idx):
        self.ids += [int(i) for i in batch["id"]]

    def on_test_epoch_end(self):
        self.written = f"{self.path}.rank{self.global_rank}" if self.per_rank else self.path
        with open(self.written, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{i:04d}\n" for i in sorted(self.ids)))
        self.lines_written = len(self.ids)


def write_test_ids(info: RankInfo, path: str, n: int = 10, batch_size: int = 2, per_rank: bool = False) -> dict:
    """Scenario: test ``_ShareWriter`` on ``LineDataset(n)``; each rank writes the ids it tested to ``path`` (or to
    its own ``path.rank<r>`` with ``per_rank``), as a user's ``on_test_epoch_end`` writes its outputs to a file.

    Record keys: ``ids`` (the ids this rank tested, in order), ``written`` (the path it wrote, None where it wrote
    none), ``lines_written`` (the lines it wrote there).
    """
    model = _ShareWriter(path, per_rank)
    loader = torch.utils.data.DataLoader(LineDataset(n), batch_size=batch_size)
    trainer = ddp_trainer(info)
    trainer.test(model, dataloaders=loader, verbose=False)
    return {"ids": model.ids, "written": model.written, "lines_written": model.lines_written}
