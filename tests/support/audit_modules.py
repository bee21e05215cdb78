"""Small LightningModules and data for the tests of the audit's diagnoses (tests/tooling/audit/test_audit_diagnoses.py).

Each one makes one kind of DDP mistake (or none) on ``IdDataset`` data (sample ``i`` carries ``id == i`` and
``value == i * i``, ddpprobe/probes/data.py), so the test can compute from the ids which samples each rank
ran, which collectives each rank made and what every value should be. They are imported by name in the
audit's rank processes, so every factory is a top-level function.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset
from torchmetrics import Metric

from ddpprobe._lightning import pl
from ddpprobe.probes.common import rank_and_world_size
from ddpprobe.probes.data import IdDataset

#: The value threshold of :class:`BigValues`: samples whose ``value`` is at least this are kept.
BIG = 9.0


class MeanModule(pl.LightningModule):
    """Logs each batch's mean ``value`` as ``val_mean`` (``sync_dist=True``) and trains a linear layer with
    ``lr`` (0 keeps the weights, so W=1 and W=N validate the same weights)."""

    def __init__(self, lr: float = 0.0):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.lr = lr

    def validation_step(self, batch, batch_idx):
        self.log("val_mean", batch["value"].float().mean(), batch_size=len(batch["id"]), sync_dist=True)

    def training_step(self, batch, batch_idx):
        return (self.layer(batch["x"].float()).squeeze(-1) - batch["value"].float() / 50).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def make_mean_model() -> MeanModule:
    return MeanModule()


def make_fit_8() -> dict:
    """8 training and 8 validation samples (``IdDataset(8)``), batches of 2."""
    return {"train": DataLoader(IdDataset(8), batch_size=2), "val": DataLoader(IdDataset(8), batch_size=2)}


def make_ids_8() -> DataLoader:
    """``IdDataset(8)`` in batches of 2."""
    return DataLoader(IdDataset(8), batch_size=2)


def make_ids_9() -> DataLoader:
    """``IdDataset(9)`` in batches of 2: at W=2 ``DistributedSampler`` pads with one repeat of sample 0."""
    return DataLoader(IdDataset(9), batch_size=2)


class UnsyncedMeanModule(MeanModule):
    """Logs each batch's mean ``value`` as ``val_mean`` without ``sync_dist``: a per-sample mean kept
    rank-local, as a newcomer's ``val_acc`` is."""

    def validation_step(self, batch, batch_idx):
        self.log("val_mean", batch["value"].float().mean(), batch_size=len(batch["id"]))


def make_unsynced_mean_model() -> UnsyncedMeanModule:
    return UnsyncedMeanModule()


class RankBranchGatherModule(MeanModule):
    """In ``on_validation_epoch_end`` rank 0 alone calls ``self.all_gather`` (``if self.global_rank == 0``)."""

    def on_validation_epoch_end(self):
        if self.global_rank == 0:
            self.all_gather(torch.tensor(1.0))


def make_rank_branch_gather_model() -> RankBranchGatherModule:
    return RankBranchGatherModule()


class BigValues(Metric):
    """The sum of the values of at least :data:`BIG`, kept as a list state with one tensor per such sample
    and no ``dist_reduce_fx``: torchmetrics gathers a list state element by element unless its reduction
    is ``"cat"`` (torchmetrics/metric.py ``Metric._sync_dist``), so each rank makes as many gathers as it
    kept samples."""

    def __init__(self):
        super().__init__()
        self.add_state("big", default=[], dist_reduce_fx=None)

    def update(self, values: torch.Tensor) -> None:
        for v in values.float():
            if v >= BIG:
                self.big.append(v.reshape(1))

    def compute(self) -> torch.Tensor:
        if isinstance(self.big, torch.Tensor):
            return self.big.sum()
        return torch.cat(self.big).sum() if self.big else torch.tensor(0.0)


class ListStateModule(MeanModule):
    """Updates a :class:`BigValues` each batch and logs its ``compute()`` on every rank at epoch end."""

    def __init__(self):
        super().__init__()
        self.big = BigValues()

    def validation_step(self, batch, batch_idx):
        self.big.update(batch["value"])

    def on_validation_epoch_end(self):
        self.log("val_big", self.big.compute())
        self.big.reset()


def make_list_state_model() -> ListStateModule:
    return ListStateModule()


class RankOffsetModule(MeanModule):
    """Logs each batch's mean ``value`` plus ``self.global_rank`` as ``val_mean`` (``sync_dist=True``): a
    value that depends on the rank, not on which samples share a batch."""

    def validation_step(self, batch, batch_idx):
        value = batch["value"].float().mean() + self.global_rank
        self.log("val_mean", value, batch_size=len(batch["id"]), sync_dist=True)


def make_rank_offset_model() -> RankOffsetModule:
    return RankOffsetModule()


class RankStrideSampler(Sampler):
    """A user's own rank-aware sampler (not a ``DistributedSampler``): rank ``r`` of ``W`` yields
    ``r, r + W, ...``. Lightning wraps it in ``DistributedSamplerWrapper``, which shards its indices again
    (pytorch_lightning/trainer/connectors/data_connector.py ``_get_distributed_sampler``)."""

    def __init__(self, n: int):
        self.n = n

    def _indices(self) -> list:
        rank, world = rank_and_world_size()
        return list(range(rank, self.n, world))

    def __iter__(self):
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())


def make_rank_stride_11() -> DataLoader:
    """``IdDataset(11)`` in batches of 1 through :class:`RankStrideSampler`."""
    return DataLoader(IdDataset(11), batch_size=1, sampler=RankStrideSampler(11))


class NewcomerClassifier(pl.LightningModule):
    """A classifier as a new user writes it: ``self.log("val_acc", acc)`` of each batch's accuracy in
    ``validation_step``, without ``sync_dist``, and the epoch's training loss with ``sync_dist=True``;
    (x, y) tuples without ids."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(dim=1) == y).float().mean()
        self.log("val_acc", acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def make_newcomer_classifier() -> NewcomerClassifier:
    return NewcomerClassifier()


#: Training and validation samples of :func:`make_newcomer_data`, and its batch size.
NEWCOMER_TRAIN, NEWCOMER_VAL, NEWCOMER_BATCH = 26, 10, 2


def make_newcomer_data() -> dict:
    """Points in the plane labelled by the sign of their first coordinate: 26 to train on (shuffled), 10 to
    validate on, batches of 2; the validation points of odd index have the opposite label, so the ranks'
    shards (even and odd indices at W=2) score differently."""
    g = torch.Generator().manual_seed(0)
    x, xv = torch.randn(NEWCOMER_TRAIN, 2, generator=g), torch.randn(NEWCOMER_VAL, 2, generator=g)
    train = TensorDataset(x, (x[:, 0] > 0).long())
    flip = torch.arange(NEWCOMER_VAL) % 2
    val = TensorDataset(xv, (xv[:, 0] > 0).long() ^ flip)
    return {
        "train": DataLoader(train, batch_size=NEWCOMER_BATCH, shuffle=True),
        "val": DataLoader(val, batch_size=NEWCOMER_BATCH),
    }


def make_newcomer_data_with_predict() -> dict:
    """:func:`make_newcomer_data` with its validation loader also given as ``"predict"``."""
    data = make_newcomer_data()
    return {**data, "predict": data["val"]}


class MonitoredModule(MeanModule):
    """Logs ``val_score`` in ``on_validation_epoch_end`` without ``sync_dist``: the mean ``value`` of the
    rank's own samples, plus the epoch on a rank whose first sample id is even and minus it on the others
    (at W=2 rank 0's score rises every epoch, rank 1's falls), monitored by ``ModelCheckpoint`` and
    ``EarlyStopping`` (``mode="max"``, ``patience=1``). Keeps the weights (lr 0)."""

    def __init__(self):
        super().__init__()
        self.seen: list = []

    def validation_step(self, batch, batch_idx):
        self.seen.append(batch["value"].float())
        self.first = getattr(self, "first", None) if batch_idx else int(batch["id"][0])

    def on_validation_epoch_end(self):
        sign = 1 if self.first % 2 == 0 else -1
        score = torch.cat(self.seen).mean() + sign * self.current_epoch
        self.log("val_score", score)
        self.seen.clear()

    def configure_callbacks(self):
        return [
            pl.callbacks.ModelCheckpoint(monitor="val_score", mode="max", save_top_k=1),
            pl.callbacks.EarlyStopping(monitor="val_score", mode="max", patience=PATIENCE),
        ]


#: ``EarlyStopping(patience=...)`` of :class:`MonitoredModule`.
PATIENCE = 1


def make_monitored_model() -> MonitoredModule:
    return MonitoredModule()


class GatheredNamesModule(MeanModule):
    """Gathers ``{"names": [...], "count": tensor}`` with ``self.all_gather`` in ``on_validation_epoch_end``:
    the names of the rank's samples of value >= :data:`BIG` (a list of strings, which ``all_gather`` returns
    unchanged) and their count; logs and writes to ``logger.experiment`` how many names came back."""

    def __init__(self):
        super().__init__()
        self.names: list = []

    def validation_step(self, batch, batch_idx):
        self.names += [f"sample{int(i)}" for i, v in zip(batch["id"], batch["value"]) if v >= BIG]

    def on_validation_epoch_end(self):
        gathered = self.all_gather({"names": self.names, "count": torch.tensor(len(self.names))})
        self.log("val_names", float(len(gathered["names"])))
        self.logger.experiment.add_scalar("names", len(gathered["names"]), self.current_epoch)
        self.names = []


def make_gathered_names_model() -> GatheredNamesModule:
    return GatheredNamesModule()


class SleepingRankModule(MeanModule):
    """Rank 1 sleeps in ``on_validation_end``, after the epoch's values exist, until the world is killed;
    rank 0 finishes its stage."""

    def on_validation_end(self):
        import time

        while self.global_rank == 1:
            time.sleep(0.05)


def make_sleeping_rank_model() -> SleepingRankModule:
    return SleepingRankModule()


class RaisingRankModule(MeanModule):
    """Rank 1 raises ``ValueError`` in its second ``validation_step``; rank 0 goes on to the epoch's sync."""

    def validation_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 1:
            raise ValueError("a bad batch on rank 1")
        super().validation_step(batch, batch_idx)


def make_raising_rank_model() -> RaisingRankModule:
    return RaisingRankModule()
