"""LightningModules of the forms in which the audit and the guard once explained a hazard wrongly (issue 33's
"What goes wrong today"), for tests/tooling/audit/test_audit_forms.py.

Each module makes one hazard a fact of tests/facts/ proves, on ``IdDataset`` data (sample ``i`` carries
``id == i`` and ``value == i * i``, ddpprobe/probes/data.py), so a test can compute from the ids what each rank
ran and what every value is. They are imported by name in the audit's rank processes, so every factory is a
top-level function.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader
from torchmetrics import MeanMetric, Metric

from ddpprobe._lightning import pl
from ddpprobe.probes.data import IdDataset
from tests.support.audit_modules import BIG, MeanModule, RankStrideSampler

# --- 1. a proven fact not used: strategy.reduce of an int64 tensor ---------------------------------------


class Int64ReduceModule(MeanModule):
    """Counts the rank's samples of value >= :data:`BIG` as an int64 tensor and logs
    ``trainer.strategy.reduce(count)`` (``reduce_op="mean"``) in ``on_validation_epoch_end``: the mean of
    integers is truncated toward zero (tests/facts/test_reductions_outside_log.py)."""

    def __init__(self):
        super().__init__()
        self.kept = 0

    def validation_step(self, batch, batch_idx):
        self.kept += int((batch["value"] >= BIG).sum())

    def on_validation_epoch_end(self):
        mean = self.trainer.strategy.reduce(torch.tensor(self.kept, dtype=torch.int64))
        self.log("val_kept", mean.float())
        self.kept = 0


def make_int64_reduce_model() -> Int64ReduceModule:
    return Int64ReduceModule()


class BoolReduceModule(MeanModule):
    """Keeps one bool per sample (``value >= BIG``) in ``validation_step`` and logs the share of such samples
    over every rank as ``trainer.strategy.reduce(flags).float().mean()`` (``reduce_op="mean"``) in
    ``on_validation_epoch_end``: the mean of bools over ranks is ``any`` per element, not the ranks' mean
    (tests/facts/test_reductions_outside_log.py)."""

    def __init__(self):
        super().__init__()
        self.flags: list = []

    def validation_step(self, batch, batch_idx):
        self.flags.append(batch["value"] >= BIG)

    def on_validation_epoch_end(self):
        share = self.trainer.strategy.reduce(torch.cat(self.flags))
        self.log("val_big_share", share.float().mean())
        self.flags = []


def make_bool_reduce_model() -> BoolReduceModule:
    return BoolReduceModule()


# --- 2. a report contradicting its own evidence ---------------------------------------------------------


def make_rank_stride_11_in_pairs() -> DataLoader:
    """``IdDataset(11)`` in batches of 2 through the rank-aware ``RankStrideSampler``, which Lightning shards
    again: samples run on no rank, and the single process's batches mix them with samples that ran."""
    return DataLoader(IdDataset(11), batch_size=2, sampler=RankStrideSampler(11))


class GatheredCountModule(MeanModule):
    """Gathers ``{"names": [...], "count": tensor}`` with ``self.all_gather`` in ``on_validation_epoch_end`` and
    logs the sum of the gathered ``count`` tensors (a leaf all_gather does move): every rank holds the whole
    set's count of samples of value >= :data:`BIG`."""

    def __init__(self):
        super().__init__()
        self.names: list = []

    def validation_step(self, batch, batch_idx):
        self.names += [f"sample{int(i)}" for i, v in zip(batch["id"], batch["value"]) if v >= BIG]

    def on_validation_epoch_end(self):
        gathered = self.all_gather({"names": self.names, "count": torch.tensor(float(len(self.names)))})
        self.log("val_count", gathered["count"].sum())
        self.names = []


def make_gathered_count_model() -> GatheredCountModule:
    return GatheredCountModule()


class StepSyncThenBranchGatherModule(MeanModule):
    """Logs each batch's mean ``value`` with ``on_step=True, sync_dist=True``; at its second batch rank 1 alone
    also calls ``self.all_gather``. Every rank's shard holds the same number of batches: the ranks part
    because of the branch, not because of the data."""

    def validation_step(self, batch, batch_idx):
        self.log("val_step_mean", batch["value"].float().mean(), on_step=True, on_epoch=False, sync_dist=True)
        if self.global_rank == 1 and batch_idx == 1:
            self.all_gather(torch.tensor(1.0))


def make_step_sync_then_branch_gather_model() -> StepSyncThenBranchGatherModule:
    return StepSyncThenBranchGatherModule()


# --- 4. a fix for a guessed cause -------------------------------------------------------------------------


class MetricsReadThenReduceModule(MeanModule):
    """Logs ``train_v`` (the batch's summed ``value``, ``on_epoch=True, sync_dist=True, reduce_fx="sum"``); in
    ``on_train_epoch_end`` rank 0 alone reads ``trainer.callback_metrics`` (which runs the epoch sync of
    ``train_v``), then every rank calls ``trainer.strategy.reduce`` of its rank + 1 (tests/facts/
    test_hidden_collectives_metrics_properties.py: the two sums are swapped without an error)."""

    def training_step(self, batch, batch_idx):
        self.log("train_v", batch["value"].float().sum(), on_epoch=True, sync_dist=True, reduce_fx="sum")
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:
            self.seen = dict(self.trainer.callback_metrics)
        self.extra = self.trainer.strategy.reduce(torch.tensor(float(self.global_rank + 1)), reduce_op="sum")


def make_metrics_read_then_reduce_model() -> MetricsReadThenReduceModule:
    return MetricsReadThenReduceModule()


class KeyOnRankOneModule(MeanModule):
    """Logs ``val_mean`` (sync_dist) on every rank and ``val_extra`` with ``sync_dist=True`` on rank 1 only."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if self.global_rank == 1:
            self.log("val_extra", batch["value"].float().max(), batch_size=len(batch["id"]), sync_dist=True)


def make_key_on_rank_one_model() -> KeyOnRankOneModule:
    return KeyOnRankOneModule()


# --- 5. reports a new user struggles to act on ----------------------------------------------------------


class NewUserModule(MeanModule):
    """As a new user writes one from the README: ``val_loss`` and ``val_acc`` logged with ``sync_dist=True`` in
    ``validation_step`` (each batch's mean ``value`` and its share of values >= :data:`BIG`), ``val_step``
    logged at every step without ``sync_dist`` (rank-local step values, not a problem), and in
    ``on_validation_epoch_end`` a gather of the epoch's outputs under ``if self.global_rank == 0``."""

    def validation_step(self, batch, batch_idx):
        value = batch["value"].float()
        self.log("val_loss", value.mean(), batch_size=len(value), sync_dist=True)
        self.log("val_acc", (value >= BIG).float().mean(), batch_size=len(value), sync_dist=True)
        self.log("val_step", value.mean(), on_step=True, on_epoch=False)

    def on_validation_epoch_end(self):
        if self.global_rank == 0:
            self.all_gather(torch.tensor(1.0))


def make_new_user_model() -> NewUserModule:
    return NewUserModule()


class AttributeErrorModule(MeanModule):
    """Reads an attribute it never set in ``validation_step`` (an ``AttributeError`` of the user's own)."""

    def validation_step(self, batch, batch_idx):
        return self.threshold * batch["value"].float().mean()


def make_attribute_error_model() -> AttributeErrorModule:
    return AttributeErrorModule()


#: The message of :func:`make_model_from_a_missing_checkpoint`'s own error.
MISSING_CHECKPOINT = "no checkpoint at /nonexistent/model.ckpt"


def make_model_from_a_missing_checkpoint() -> MeanModule:
    """A factory that takes no arguments and raises for its own reason (the file it loads is missing)."""
    raise FileNotFoundError(MISSING_CHECKPOINT)


# --- modules of entries no other module shows (the registry's self-test) ------------------------------------


class RankZeroSyncedKeyModule(MeanModule):
    """Logs ``val_mean`` (sync_dist) on every rank and ``val_top`` with ``sync_dist=True`` under ``if
    self.global_rank == 0`` (a value only rank 0 computes)."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if self.global_rank == 0:
            self.log("val_top", batch["value"].float().max(), batch_size=len(batch["id"]), sync_dist=True)


def make_rank_zero_synced_key_model() -> RankZeroSyncedKeyModule:
    return RankZeroSyncedKeyModule()


class RankZeroLocalKeyModule(MeanModule):
    """Logs ``val_mean`` (sync_dist) on every rank and ``val_top`` without ``sync_dist`` on rank 0 only."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if self.global_rank == 0:
            self.log("val_top", batch["value"].float().max(), batch_size=len(batch["id"]))


def make_rank_zero_local_key_model() -> RankZeroLocalKeyModule:
    return RankZeroLocalKeyModule()


class MetricsReadModule(MetricsReadThenReduceModule):
    """:class:`MetricsReadThenReduceModule` without the ``strategy.reduce``: rank 0's read of
    ``trainer.callback_metrics`` pairs with the other ranks' own epoch-end sync of ``train_v`` (the right value, by
    luck: tests/facts/test_hidden_collectives_metrics_properties.py)."""

    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:
            self.seen = dict(self.trainer.callback_metrics)


def make_metrics_read_model() -> MetricsReadModule:
    return MetricsReadModule()


class EpochEndMeanModule(MeanModule):
    """Sums each rank's ``value`` and counts its samples in ``validation_step``, then logs their quotient (the
    rank's own mean) once in ``on_validation_epoch_end`` with ``sync_dist=True``: Lightning averages the ranks'
    values without their sample counts (tests/facts/test_log_reductions.py), which differs from the whole set's
    mean when the shards hold different numbers of samples."""

    def __init__(self):
        super().__init__()
        self.total, self.count = 0.0, 0

    def validation_step(self, batch, batch_idx):
        self.total += float(batch["value"].float().sum())
        self.count += len(batch["id"])

    def on_validation_epoch_end(self):
        self.log("val_mean", torch.tensor(self.total / max(self.count, 1)), sync_dist=True)
        self.total, self.count = 0.0, 0


def make_epoch_end_mean_model() -> EpochEndMeanModule:
    return EpochEndMeanModule()


class PerBatchGatherModule(MeanModule):
    """Gathers each batch's summed ``value`` with ``self.all_gather`` in ``validation_step`` (one collective of
    the module's own per batch) and logs the gathered sum without ``sync_dist``: on shards of different batch
    counts the ranks that ran out leave the others waiting (tests/facts/test_uneven_shards.py)."""

    def validation_step(self, batch, batch_idx):
        gathered = self.all_gather(batch["value"].float().sum())
        self.log("val_gathered", gathered.sum(), batch_size=len(batch["id"]))


def make_per_batch_gather_model() -> PerBatchGatherModule:
    return PerBatchGatherModule()


class GatherOutputsModule(MeanModule):
    """Keeps each batch's ``value`` in ``validation_step`` and, in ``on_validation_epoch_end``, gathers the
    epoch's values (``self.all_gather(torch.cat(outputs))``) to log their mean: on shards of different sample
    counts the ranks gather tensors of different first dimensions, which gloo rejects
    (tests/facts/test_collectives.py)."""

    def __init__(self):
        super().__init__()
        self.outputs: list = []

    def validation_step(self, batch, batch_idx):
        self.outputs.append(batch["value"].float())

    def on_validation_epoch_end(self):
        gathered = self.all_gather(torch.cat(self.outputs))
        self.log("val_gathered_mean", gathered.mean())
        self.outputs = []


def make_gather_outputs_model() -> GatherOutputsModule:
    return GatherOutputsModule()


class OddIds(Metric):
    """The ids of the samples whose ``value`` is odd, kept as a ``"cat"`` list state of int64 tensors (one per
    batch that has any); ``compute()`` returns how many there are over every rank."""

    def __init__(self):
        super().__init__()
        self.add_state("ids", default=[], dist_reduce_fx="cat")

    def update(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        odd = ids[values % 2 == 1]
        if len(odd):
            self.ids.append(odd.long())

    def compute(self) -> torch.Tensor:
        ids = self.ids if isinstance(self.ids, torch.Tensor) else torch.cat(self.ids) if self.ids else None
        return torch.tensor(0.0) if ids is None else torch.tensor(float(ids.numel()))


class OddIdsModule(MeanModule):
    """Updates an :class:`OddIds` each batch and logs its ``compute()`` at epoch end on every rank. At W=2 on
    ``IdDataset(8)`` rank 0 holds the even ids only, so it never adds an entry: torchmetrics gathers its
    float32 placeholder against the other rank's int64 entries (tests/facts/
    test_hidden_collectives_torchmetrics_list_states.py)."""

    def __init__(self):
        super().__init__()
        self.odd = OddIds()

    def validation_step(self, batch, batch_idx):
        self.odd.update(batch["id"], batch["value"])

    def on_validation_epoch_end(self):
        self.log("val_odd", self.odd.compute())
        self.odd.reset()


def make_odd_ids_model() -> OddIdsModule:
    return OddIdsModule()


class UnsyncedMeanMetricModule(MeanModule):
    """Logs a ``torchmetrics.MeanMetric(sync_on_compute=False)`` of each batch's ``value`` as ``val_mean`` (the
    Metric object): its compute() never syncs, so each rank keeps its own shard's mean (tests/facts/
    test_collective_hazards_torchmetrics.py)."""

    def __init__(self):
        super().__init__()
        self.mean = MeanMetric(sync_on_compute=False)

    def validation_step(self, batch, batch_idx):
        self.mean.update(batch["value"].float())
        self.log("val_mean", self.mean)


def make_unsynced_mean_metric_model() -> UnsyncedMeanMetricModule:
    return UnsyncedMeanMetricModule()


class RankZeroMonitoredKeyModule(MeanModule):
    """Logs ``val_mean`` (sync_dist) on every rank and, in ``on_validation_epoch_end``, ``val_top`` without
    ``sync_dist`` under ``if self.global_rank == 0``, monitored by ``ModelCheckpoint``: the other ranks'
    checkpoint raises for the missing key and leaves rank 0 in its ``reduce_boolean_decision``
    (tests/facts/test_collective_hazards_callbacks.py)."""

    def on_validation_epoch_end(self):
        if self.global_rank == 0:
            self.log("val_top", torch.tensor(1.0))

    def configure_callbacks(self):
        return [pl.callbacks.ModelCheckpoint(monitor="val_top", mode="max", save_top_k=1)]


def make_rank_zero_monitored_key_model() -> RankZeroMonitoredKeyModule:
    return RankZeroMonitoredKeyModule()


# --- files the module's own code writes ------------------------------------------------------------------


class IdFileModule(MeanModule):
    """Keeps the ids of its validation batches and, in ``on_validation_epoch_end``, writes them one per line to
    ``val_ids.txt`` in the working directory: on every rank (``who="every rank"``: each rank writes its own
    share to the one path, tests/facts/test_what_ddp_keeps_equal.py), on global rank 0 only (``"rank 0"``), each
    rank to ``val_ids_rank<global_rank>.txt`` (``"per rank"``, the fix), or every rank to ``val_ids.txt`` in
    ``trainer.log_dir`` (``"log dir"``: rank 0 chose that folder and broadcast it)."""

    def __init__(self, who: str):
        super().__init__()
        self.who = who
        self.ids: list = []

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.ids += [int(i) for i in batch["id"]]

    def on_validation_epoch_end(self):
        if self.who == "rank 0" and self.global_rank != 0:
            return
        path = f"val_ids_rank{self.global_rank}.txt" if self.who == "per rank" else "val_ids.txt"
        if self.who == "log dir":
            path = os.path.join(self.trainer.log_dir, path)
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(f"{i}\n" for i in sorted(self.ids))
        self.ids = []


def make_one_path_file_model() -> IdFileModule:
    return IdFileModule("every rank")


def make_rank_zero_file_model() -> IdFileModule:
    return IdFileModule("rank 0")


def make_per_rank_file_model() -> IdFileModule:
    return IdFileModule("per rank")


def make_log_dir_file_model() -> IdFileModule:
    return IdFileModule("log dir")
