"""Small LightningModules modelled on public DDP bug reports, each a test input of ``ddpprobe audit``
(tests/tooling/audit/test_audit_evidence.py checks each verdict and cause against values computed from the data).

Run any of them, e.g.::

    M=examples.reported_cases; python -m ddpprobe audit $M:make_unpadded_mean_model --data $M:make_unpadded_11

The data carry their sample ``id`` and ``value`` (``id * id``, ddpprobe/probes/data.py), so a rank's
samples, and the numbers every reduction should give, can be computed without Lightning.

1. ``val_loss`` logged with ``sync_dist=True`` over a sampler that does not pad (11 samples, ranks hold
   6 and 5): Lightning's synced mean floors the count (upstream issue #21859).
3. A torchmetrics object logged ``on_step=True, on_epoch=True, sync_dist=True`` where rank 0's samples
   are all right and rank 1's all wrong: the step values are each rank's own.
4. An ``IterableDataset`` of 5 samples the user shards by ``i % W`` (ranks run 3 and 2 batches): the
   synced epoch mean floors the count; a synced step value leaves rank 0 alone in its last all_reduce;
   in ``fit`` rank 0's last backward all-reduces gradients while rank 1 syncs the epoch loss.
5. An ``IterableDataset`` every rank iterates in full (8 samples): a synced sum counts each sample W
   times, and a synced mean hides that the ranks repeat each other's work.
6. ``metric.compute()`` under ``if self.global_rank == 0``: rank 0 alone enters the metric's state sync.
7. A key named after the rank (``self.log(f"loss_rank{rank}", ..., sync_dist=True)``): every rank runs
   the same all_reduce, so nothing hangs, but each key's value is averaged with the other key's.
"""

from __future__ import annotations

import torch
import torch.distributed
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
from torchmetrics.classification import BinaryAccuracy

from ddpprobe._lightning import pl  # pytorch_lightning, or lightning.pytorch if ddpprobe runs that: runs under both
from ddpprobe.probes.data import IdDataset, sample_target, sample_value


def _rank_and_world() -> tuple:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class UnpaddedShardSampler(DistributedSampler):
    """Rank ``r`` of ``W`` gets indices ``r, r + W, ...`` and nothing more: no padding, so ranks can hold
    different numbers of samples (6 and 5 of 11 at W=2). A ``DistributedSampler`` subclass, so Lightning
    keeps it instead of injecting its own; rank and world size are read when iterated."""

    def __init__(self, dataset):
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=False)

    def _indices(self) -> list:
        rank, world = _rank_and_world()
        return list(range(rank, len(self.dataset), world))

    def __iter__(self):
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())


class ValueMeanModule(pl.LightningModule):
    """Logs each batch's mean ``value`` as ``key`` from ``validation_step`` (and ``training_step``) with
    ``sync_dist=True`` and the batch's size; options passed to ``self.log`` come from the constructor."""

    def __init__(self, key: str = "val_loss", **log_options):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.key, self.log_options = key, {"sync_dist": True, **log_options}

    def _value(self, batch):
        return batch["value"].float().mean()

    def validation_step(self, batch, batch_idx):
        self.log(self.key, self._value(batch), batch_size=len(batch["id"]), **self.log_options)

    def training_step(self, batch, batch_idx):
        loss = (self.layer(batch["x"].float()).mean() - 0.0) ** 2
        self.log(self.key, self._value(batch), batch_size=len(batch["id"]), **self.log_options)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


# --- 1. a sampler that does not pad: 11 samples on 2 ranks ------------------------------------------


def make_unpadded_mean_model() -> ValueMeanModule:
    return ValueMeanModule("val_loss")


def make_unpadded_11() -> DataLoader:
    """``IdDataset(11)`` in batches of 2 through :class:`UnpaddedShardSampler`."""
    dataset = IdDataset(11)
    return DataLoader(dataset, batch_size=2, sampler=UnpaddedShardSampler(dataset))


# --- 3. a metric object logged on_step and on_epoch: rank 0 right, rank 1 wrong ---------------------


class RightWrongDataset:
    """``n`` samples; even ids (rank 0's under a 2-rank ``DistributedSampler``) are predicted right,
    odd ids (rank 1's) wrong. Item: ``{"id", "pred", "target"}``."""

    def __init__(self, n: int = 8):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        target = sample_target(i)
        return {
            "id": torch.tensor(i),
            "target": torch.tensor(target),
            "pred": torch.tensor(target if i % 2 == 0 else 1 - target),
        }


class StepAccuracyModule(pl.LightningModule):
    """``self.log("val_acc", self.acc, on_step=True, on_epoch=..., sync_dist=True)`` in ``validation_step``."""

    def __init__(self, on_epoch: bool = True):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.acc = BinaryAccuracy()
        self.on_epoch = on_epoch

    def validation_step(self, batch, batch_idx):
        self.acc(batch["pred"], batch["target"])
        self.log("val_acc", self.acc, on_step=True, on_epoch=self.on_epoch, sync_dist=True, batch_size=len(batch["id"]))


def make_step_and_epoch_accuracy_model() -> StepAccuracyModule:
    return StepAccuracyModule(on_epoch=True)


def make_step_only_accuracy_model() -> StepAccuracyModule:
    return StepAccuracyModule(on_epoch=False)


def make_right_wrong_8() -> DataLoader:
    """:class:`RightWrongDataset` of 8 samples in batches of 2 (rank 0: ids 0, 2, 4, 6 at W=2)."""
    return DataLoader(RightWrongDataset(8), batch_size=2)


# --- 4. an iterable dataset the user shards by i % W: 5 samples -------------------------------------


class ShardedIterable(IterableDataset):
    """Samples ``0 .. n-1`` as ``IdDataset`` items; rank ``r`` of ``W`` yields those with ``i % W == r``
    (W=2, n=5: rank 0 yields 3, rank 1 yields 2). With ``shard=False`` every rank yields all ``n``."""

    def __init__(self, n: int = 5, shard: bool = True):
        self.items = IdDataset(n)
        self.shard = shard

    def __iter__(self):
        rank, world = _rank_and_world() if self.shard else (0, 1)
        for i in range(rank, len(self.items), world):
            yield self.items[i]


def make_sharded_iterable_5() -> DataLoader:
    """:class:`ShardedIterable` of 5 samples, batches of 1."""
    return DataLoader(ShardedIterable(5), batch_size=1)


def make_sharded_iterable_5_fit() -> dict:
    """The same for ``fit``: ``{"train": ...}``."""
    return {"train": DataLoader(ShardedIterable(5), batch_size=1)}


def make_epoch_mean_model() -> ValueMeanModule:
    """``val_mean``: epoch-level only (``on_step=False, on_epoch=True``), ``sync_dist=True``."""
    return ValueMeanModule("val_mean", on_step=False, on_epoch=True)


def make_step_synced_model() -> ValueMeanModule:
    """``val_step_mean``: ``on_step=True, on_epoch=False, sync_dist=True`` (one all_reduce per step)."""
    return ValueMeanModule("val_step_mean", on_step=True, on_epoch=False)


def make_step_and_epoch_synced_model() -> ValueMeanModule:
    """``val_both``: ``on_step=True, on_epoch=True, sync_dist=True`` (a sync per step and one at epoch end)."""
    return ValueMeanModule("val_both", on_step=True, on_epoch=True)


def make_train_loss_model() -> ValueMeanModule:
    """``train_loss``: epoch-level (``on_step=False, on_epoch=True``), ``sync_dist=True``, in training."""
    return ValueMeanModule("train_loss", on_step=False, on_epoch=True)


# --- 5. an iterable dataset every rank iterates in full: 8 samples ----------------------------------


def make_unsharded_iterable_8() -> DataLoader:
    """:class:`ShardedIterable` with ``shard=False``: every rank yields all 8 samples, batches of 2."""
    return DataLoader(ShardedIterable(8, shard=False), batch_size=2)


def make_synced_sum_model() -> ValueMeanModule:
    """``val_sum``: the batch means summed (``reduce_fx="sum"``), ``sync_dist=True``."""
    return ValueMeanModule("val_sum", reduce_fx="sum")


def make_synced_mean_model() -> ValueMeanModule:
    """``val_mean``: the batch-size-weighted mean (default), ``sync_dist=True``."""
    return ValueMeanModule("val_mean")


# --- 6. metric.compute() on rank 0 only -------------------------------------------------------------


class ComputeOnRankZeroModule(pl.LightningModule):
    """Updates a ``BinaryAccuracy`` every batch, then computes and logs it on rank 0 only."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.acc = BinaryAccuracy()

    def validation_step(self, batch, batch_idx):
        self.acc.update(batch["pred"], batch["target"])

    def on_validation_epoch_end(self):
        if self.global_rank == 0:
            value = self.acc.compute()
            self.log("val_acc", value)
        self.acc.reset()


def make_compute_on_rank_zero_model() -> ComputeOnRankZeroModule:
    return ComputeOnRankZeroModule()


def make_ids_12() -> DataLoader:
    """``IdDataset(12)`` in batches of 3."""
    return DataLoader(IdDataset(12), batch_size=3)


# --- 7. a different key on each rank, same collective --------------------------------------------


class KeyPerRankModule(ValueMeanModule):
    """Logs the batch mean as ``loss_rank<r>`` with ``sync_dist=True``: the ranks' all_reduces match in
    op, dtype and shape, so the run finishes, but ``loss_rank0`` is averaged with ``loss_rank1``."""

    def validation_step(self, batch, batch_idx):
        self.log(f"loss_rank{self.global_rank}", self._value(batch), batch_size=len(batch["id"]), sync_dist=True)


def make_key_per_rank_model() -> KeyPerRankModule:
    return KeyPerRankModule()


# --- predict: no padding, so ranks run different numbers of batches --------------------------------


class PredictValueModule(pl.LightningModule):
    """``predict_step`` returns each sample's ``value``; with ``gather=True`` it first calls
    ``self.all_gather`` on the batch (a collective per batch, on ranks that run different numbers of
    batches in predict)."""

    def __init__(self, gather: bool = False):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.gather = gather

    def predict_step(self, batch, batch_idx):
        values = batch["value"]
        if self.gather:
            values = self.all_gather(values).flatten()
        return values


def make_predict_model() -> PredictValueModule:
    return PredictValueModule()


def make_predict_gather_model() -> PredictValueModule:
    return PredictValueModule(gather=True)


def make_ids_5() -> DataLoader:
    """``IdDataset(5)`` in batches of 1."""
    return DataLoader(IdDataset(5), batch_size=1)


def values_of(ids) -> list:
    """The ``value`` of each sample id (for expected numbers in tests)."""
    return [sample_value(i) for i in ids]
