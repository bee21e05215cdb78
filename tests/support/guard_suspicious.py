"""Scenarios for tests/tooling/guard/test_guard_never_a_false_stop.py: correct runs that look suspicious to a guard
that compares the ranks, each run with every check of ``CollectiveGuard()`` on (collectives, boundaries, state) or
without the guard.

One module, ``SuspiciousModule``, fits a ``Linear(1, 1)`` on ``AugmentedDataset`` (8 samples per rank, batches of
2, 2 epochs, validated every epoch on 4 samples per rank); each scenario (``KINDS``) turns on one thing a correct
run may do that differs between the ranks or draws random numbers:

``global_augmentation``
    the dataset adds noise from torch's, NumPy's and ``random``'s global generators at every read, after
    ``seed_everything(0)``.
``rank_generator``
    the dataset holds its own generators (``torch.Generator``, ``numpy.random.Generator``, ``random.Random``)
    seeded with the rank, and adds noise from them: each rank augments its own way.
``rank_files``
    the module keeps a file name holding its rank (``predictions_rank{r}.csv``, set in ``setup``) and writes its
    own predictions there at every validation epoch's end.
``rank_local_logs``
    the module logs values that differ between the ranks without ``sync_dist`` (the rank's own loss, its rank).
``rank_zero_only_logging``
    ``self.log(..., rank_zero_only=True)`` under ``if self.global_rank == 0`` (Lightning's documented way to log
    from rank 0 only) and a ``@rank_zero_only`` function writing to the logger's experiment.
``synced_callbacks``
    ``EarlyStopping`` and ``ModelCheckpoint`` monitoring ``val_loss``, logged with ``sync_dist=True`` and growing
    every epoch, so the run stops after its second epoch and keeps the first epoch's checkpoint.

Record keys: ``seen`` (every augmented sample the training steps saw, in order), ``random_after`` (a digest of
torch's, NumPy's and ``random``'s global states after the fit, and of the dataset's own generators),
``callback_metrics``, ``logged_metrics``, ``csv`` (the logger's ``metrics.csv`` on rank 0, None elsewhere),
``own_file`` (``[name, text]`` of the file this rank wrote, ``rank_files`` only), ``best_model`` (the best
checkpoint's path under the run's folder, ``synced_callbacks`` only), ``weights``, ``global_step``,
``pg_seq`` and ``checks`` (None without the guard).
"""

from __future__ import annotations

import hashlib
import os
import random

import numpy
import torch
from torch.utils.data import DataLoader, Dataset

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer, floats, seed_everything
from ddpprobe.trace import pg_seq

KINDS = (
    "global_augmentation",
    "rank_generator",
    "rank_files",
    "rank_local_logs",
    "rank_zero_only_logging",
    "synced_callbacks",
)


class AugmentedDataset(Dataset):
    """``n`` samples ``x[i] = i``, read with noise added: from the global generators (``seed=None``) or from
    generators of its own seeded with ``seed``."""

    def __init__(self, n: int, seed=None):
        self.x = torch.arange(float(n))
        self.seed = seed
        if seed is not None:
            self.generator = torch.Generator().manual_seed(seed)
            self.rng = numpy.random.default_rng(seed)
            self.py_random = random.Random(seed)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if self.seed is None:
            noise = torch.randn(()) + float(numpy.random.rand()) + random.random()
        else:
            noise = torch.randn((), generator=self.generator) + float(self.rng.random()) + self.py_random.random()
        return self.x[index] + noise


class SuspiciousModule(pl.LightningModule):
    def __init__(self, kind: str, out_dir: str):
        super().__init__()
        self.kind = kind
        self.out_dir = out_dir
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list = []
        self.predictions: list = []

    def setup(self, stage):
        if self.kind == "rank_files":
            self.predictions_path = os.path.join(self.out_dir, f"predictions_rank{self.global_rank}.csv")

    def _loss(self, batch):
        return (self.layer(batch[:, None] / 10.0) - 1.0).pow(2).mean()

    def training_step(self, batch, batch_idx):
        self.seen.extend(batch.tolist())
        loss = self._loss(batch)
        self.log("train_loss", loss, sync_dist=True)
        if self.kind == "rank_local_logs":
            self.log("rank_train_loss", loss, on_step=True, on_epoch=True)  # each rank's own value, no sync
            self.log("rank", float(self.global_rank))
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self._loss(batch)
        # grows every epoch (the added epoch number), so EarlyStopping(patience=0) stops after epoch 1
        self.log("val_loss", loss + float(self.current_epoch), sync_dist=True)
        if self.kind == "rank_local_logs":
            self.log("rank_val_loss", loss)
        if self.kind == "rank_files":
            self.predictions.extend(self.layer(batch[:, None] / 10.0).squeeze(-1).tolist())

    def on_validation_epoch_end(self):
        if self.kind == "rank_zero_only_logging" and self.global_rank == 0:
            self.log("rank_0_val_loss", self.trainer.callback_metrics["val_loss"], rank_zero_only=True)
            _note(self.logger, self.current_epoch)
        if self.kind == "rank_files" and not self.trainer.sanity_checking:
            with open(self.predictions_path, "a") as handle:
                handle.writelines(f"{self.current_epoch},{p:.6f}\n" for p in self.predictions)
        self.predictions = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pl.utilities.rank_zero_only
def _note(logger, epoch: int) -> None:
    logger.experiment.log_metrics({"noted_epoch": float(epoch)})


def _digest_of(*states) -> str:
    digest = hashlib.sha1()
    for state in states:
        digest.update(repr(state).encode())
    return digest.hexdigest()[:16]


def _random_after(dataset: AugmentedDataset) -> str:
    states = [torch.get_rng_state().tolist(), numpy.random.get_state()[1].tolist(), random.getstate()]
    if dataset.seed is not None:
        states += [
            dataset.generator.get_state().tolist(),
            dataset.rng.bit_generator.state,
            dataset.py_random.getstate(),
        ]
    return _digest_of(*states)


def _own_file(model: SuspiciousModule):
    path = getattr(model, "predictions_path", None)
    if path is None:
        return None
    with open(path) as handle:
        return os.path.basename(path), handle.read()


def run(info, kind: str, guard: bool = True) -> dict:
    """Scenario ``kind`` (:data:`KINDS`): ``seed_everything(0)``, then 2 epochs of ``SuspiciousModule`` over
    ``AugmentedDataset(8 * W)`` (shuffled by Lightning's DistributedSampler) in batches of 2, validated on
    ``AugmentedDataset(4 * W)`` every epoch, a ``CSVLogger`` logging every step; with ``CollectiveGuard()`` (every
    check on) when ``guard``."""
    assert kind in KINDS, kind
    seed_everything(0)
    out_dir = os.path.join(info.world_dir, "out")
    os.makedirs(out_dir, exist_ok=True)
    dataset = AugmentedDataset(8 * info.world_size, seed=info.rank if kind == "rank_generator" else None)
    model = SuspiciousModule(kind, out_dir)
    callbacks = [CollectiveGuard()] if guard else []
    if kind == "synced_callbacks":
        callbacks += [
            pl.callbacks.EarlyStopping(monitor="val_loss", patience=0),
            pl.callbacks.ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), monitor="val_loss", save_top_k=1),
        ]
    logger = pl.loggers.CSVLogger(info.rank_dir, name="csv")
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=3 if kind == "synced_callbacks" else 2,
        log_every_n_steps=1,
        logger=logger,
        enable_checkpointing=kind == "synced_callbacks",
        callbacks=callbacks,
    )
    trainer.fit(
        model,
        train_dataloaders=DataLoader(dataset, batch_size=2, shuffle=True),
        val_dataloaders=DataLoader(AugmentedDataset(4 * info.world_size), batch_size=2),
    )
    csv = None
    if info.rank == 0:
        with open(os.path.join(logger.log_dir, "metrics.csv")) as handle:
            csv = handle.read()
    guards = [c for c in callbacks if isinstance(c, CollectiveGuard)]
    checkpoint = next((c for c in callbacks if isinstance(c, pl.callbacks.ModelCheckpoint)), None)
    return {
        "seen": model.seen,
        "random_after": _random_after(dataset),
        "callback_metrics": floats(trainer.callback_metrics),
        "logged_metrics": floats(trainer.logged_metrics),
        "csv": csv,
        "own_file": _own_file(model),
        "best_model": None if checkpoint is None else os.path.relpath(checkpoint.best_model_path, out_dir),
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
        "global_step": trainer.global_step,
        "pg_seq": pg_seq() - (before or 0),
        "checks": guards[0].checks if guards else None,
    }
