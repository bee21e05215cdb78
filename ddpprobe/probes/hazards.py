"""The collective-hazards probe: ranks that do not make the same collective calls.

Every ``self.log(..., sync_dist=True)`` value, every torchmetrics ``Metric.compute()`` and every
``all_gather`` is a collective: each rank must enter the same ones, in the same order, with matching
tensors. These scenarios break that rule the ways users do, and record what each rank got:

=======================  ============================================================================
scenario                 what each rank does
=======================  ============================================================================
``log_keys``             logs its own list of keys with ``sync_dist=True`` (a per-rank *log plan*), in
                         ``validation_step`` and/or ``on_validation_epoch_end``
``metric_compute``       ``MeanMetric.compute()`` in ``on_validation_epoch_end``, on rank 0 only or on
                         every rank (then prints on rank 0 only)
``metric_on_step``       a ``SumMetric`` logged with ``on_step=True, on_epoch=True, sync_dist=True``,
                         with or without ``dist_sync_on_step=True``
``metric_collection``    a ``SumMetric`` logged alone and a ``MetricCollection`` logged with
                         ``log_dict``, with or without ``sync_on_compute=False``
``monitor_rank0_key``    ``ModelCheckpoint`` or ``EarlyStopping`` monitoring a key only rank 0 logs
                         (or, the fix, every rank logs)
=======================  ============================================================================

When a peer's failure makes the launcher raise, the ranks that completed still give their records:
``WorldError.records`` (None for a rank that gave none).

Sources: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultCollection.metrics``
(epoch values computed key by key, in the order the keys were first logged), ``_ResultMetric.compute``
(a mean is two syncs: the weighted sum, then the batch-size count), ``_Sync``;
lightning_fabric/utilities/distributed.py ``_sync_ddp`` (a barrier, then an all_reduce);
torchmetrics/metric.py ``Metric.forward``, ``Metric.sync``, ``Metric._sync_dist``, ``Metric.compute``.
"""

from __future__ import annotations

import os
import time

import torch
from torchmetrics import MeanMetric, MetricCollection, SumMetric

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, floats, id_loader, recorded_warnings, trainer_metrics

#: The key ``monitor_rank0_key`` logs and its callbacks monitor.
MONITORED = "val_score"

#: Callbacks ``monitor_rank0_key`` knows.
CALLBACKS = ("checkpoint", "early_stopping")

#: Where ``metric_compute`` calls ``compute()``.
COMPUTE_WHERE = ("rank0", "every_rank")


def _check_plan(name: str, plan, world_size: int) -> list:
    """A per-rank log plan: ``plan[r]`` is a list of ``[key, value]`` pairs, one row per rank."""
    if not isinstance(plan, (list, tuple)) or len(plan) != world_size:
        raise ValueError(f"{name} must list one row per rank ({world_size} rows), got {plan!r}")
    for rank, row in enumerate(plan):
        for entry in row:
            if not (
                isinstance(entry, (list, tuple))
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], (int, float))
            ):
                raise ValueError(f"{name}[{rank}] entry {entry!r}: use [key, number]")
    return [[(str(k), float(v)) for k, v in row] for row in plan]


class KeyPlanProbe(pl.LightningModule):
    """Logs, with ``sync_dist=True`` and the default ``reduce_fx="mean"``, the keys this rank's plan lists.

    Args:
        step_plan: ``step_plan[r]`` = ``[(key, value), ...]``: in every ``validation_step``, rank ``r``
            logs ``value`` (a constant) under ``key``, in this order (epoch level only, the
            ``validation_step`` default ``on_step=False, on_epoch=True``; ``batch_size`` = the batch's size).
        epoch_end_plan: the same for ``on_validation_epoch_end`` (logged once; batch size 1).
    """

    def __init__(self, step_plan: list, epoch_end_plan: list):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.step_plan = step_plan
        self.epoch_end_plan = epoch_end_plan
        self.seen_ids: list = []

    def validation_step(self, batch, batch_idx):
        ids = batch_ids(batch)
        self.seen_ids.append(ids)
        for key, value in self.step_plan[self.global_rank]:
            self.log(key, torch.tensor(value), sync_dist=True, batch_size=len(ids))

    def on_validation_epoch_end(self):
        for key, value in self.epoch_end_plan[self.global_rank]:
            self.log(key, torch.tensor(value), sync_dist=True, batch_size=1)


def log_keys(info: RankInfo, n: int, batch_size: int, step_plan: list = None, epoch_end_plan: list = None) -> dict:
    """Scenario: ``trainer.validate`` a ``KeyPlanProbe`` over ``IdDataset(n)`` in batches of ``batch_size``.

    Args:
        step_plan, epoch_end_plan: per-rank log plans (see ``KeyPlanProbe``); None logs nothing there.

    Record keys: ``seen_ids`` (batches of sample ids), the three metric
    dicts (``trainer_metrics``), ``warnings``.
    """
    empty = [[] for _ in range(info.world_size)]
    step = _check_plan("step_plan", empty if step_plan is None else step_plan, info.world_size)
    epoch_end = _check_plan("epoch_end_plan", empty if epoch_end_plan is None else epoch_end_plan, info.world_size)
    model = KeyPlanProbe(step, epoch_end)
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {"seen_ids": model.seen_ids, **trainer_metrics(trainer), "warnings": warnings}


class MeanComputeProbe(pl.LightningModule):
    """Updates a ``MeanMetric`` with each batch's ``value`` and computes it in ``on_validation_epoch_end``.

    Args:
        where: ``"rank0"``: ``if self.global_rank == 0: value = self.mean.compute(); print(value)``;
            ``"every_rank"``: ``value = self.mean.compute()`` on every rank, then ``self.print(value)``
            (prints on rank 0 only).
    """

    def __init__(self, where: str):
        super().__init__()
        if where not in COMPUTE_WHERE:
            raise ValueError(f"MeanComputeProbe(where={where!r}): use one of {COMPUTE_WHERE}")
        self.layer = torch.nn.Linear(2, 1)
        self.mean = MeanMetric()
        self.where = where
        self.computed = None
        self.seen_ids: list = []

    def validation_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        self.mean.update(batch["value"])

    def on_validation_epoch_end(self):
        if self.where == "rank0":
            if self.global_rank == 0:
                self.computed = float(self.mean.compute())
                print(f"mean value: {self.computed}")
        else:
            self.computed = float(self.mean.compute())
            self.print(f"mean value: {self.computed}")
        self.mean.reset()


def metric_compute(info: RankInfo, where: str, n: int, batch_size: int) -> dict:
    """Scenario: ``trainer.validate`` a ``MeanComputeProbe(where)`` over ``IdDataset(n)``.

    Record keys: ``computed`` (the float ``compute()`` returned on this rank, None where it
    was not called), ``seen_ids``.
    """
    model = MeanComputeProbe(where)
    ddp_trainer(info).validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {"computed": model.computed, "seen_ids": model.seen_ids}


class RecordingLogger(pl.loggers.Logger):
    """A logger that keeps every ``log_metrics`` call on *every* rank (no ``rank_zero_only``), so a
    record shows what the logger connector hands to loggers on each rank."""

    def __init__(self):
        super().__init__()
        self.calls: list = []

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        self.calls.append({"step": step, "metrics": floats(metrics)})

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class StepMetricProbe(pl.LightningModule):
    """Calls a ``SumMetric`` on each batch's ``value`` (``forward``: update the state and return the
    batch's own value) and logs the metric object with ``on_step=True, on_epoch=True, sync_dist=True``.

    Args:
        dist_sync_on_step: the ``SumMetric`` argument: sync the batch state across ranks in ``forward``.
    """

    def __init__(self, dist_sync_on_step: bool):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.total = SumMetric(dist_sync_on_step=dist_sync_on_step)
        self.seen_ids: list = []
        self.forward_values: list = []

    def validation_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        self.forward_values.append(float(self.total(batch["value"])))
        self.log("total", self.total, on_step=True, on_epoch=True, sync_dist=True, batch_size=len(batch["id"]))


def metric_on_step(info: RankInfo, dist_sync_on_step: bool, n: int, batch_size: int) -> dict:
    """Scenario: ``trainer.validate`` a ``StepMetricProbe`` with a ``RecordingLogger`` on every rank.

    Record keys: ``seen_ids``, ``forward_values`` (what ``self.total(batch_value)`` returned per batch),
    ``logged`` (this rank's ``log_metrics`` calls: ``[{"step", "metrics"}, ...]``), the three metric dicts.
    """
    model = StepMetricProbe(dist_sync_on_step)
    logger = RecordingLogger()
    trainer = ddp_trainer(info, logger=logger)
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {
        "seen_ids": model.seen_ids,
        "forward_values": model.forward_values,
        "logged": logger.calls,
        **trainer_metrics(trainer),
    }


class CollectionProbe(pl.LightningModule):
    """Updates a ``SumMetric`` (logged alone, ``self.log("alone_sum", ...)``) and a ``MetricCollection``
    of a ``SumMetric`` and a ``MeanMetric`` (logged with ``self.log_dict``) with each batch's ``value``.

    Args:
        sync_on_compute: the metrics' ``sync_on_compute`` argument (torchmetrics default True).
    """

    def __init__(self, sync_on_compute: bool):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.alone_sum = SumMetric(sync_on_compute=sync_on_compute)
        self.collection = MetricCollection(
            {"sum": SumMetric(sync_on_compute=sync_on_compute), "mean": MeanMetric(sync_on_compute=sync_on_compute)},
            prefix="coll_",
        )
        self.seen_ids: list = []

    def validation_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        self.alone_sum.update(batch["value"])
        self.collection.update(batch["value"])
        self.log("alone_sum", self.alone_sum)
        self.log_dict(self.collection)


def metric_collection(info: RankInfo, sync_on_compute: bool, n: int, batch_size: int) -> dict:
    """Scenario: ``trainer.validate`` a ``CollectionProbe(sync_on_compute)`` over ``IdDataset(n)``.

    Record keys: ``seen_ids``, the three metric dicts (``callback_metrics`` holds ``alone_sum``,
    ``coll_sum``, ``coll_mean``).
    """
    model = CollectionProbe(sync_on_compute)
    trainer = ddp_trainer(info)
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {"seen_ids": model.seen_ids, **trainer_metrics(trainer)}


class Rank0KeyRegressor(pl.LightningModule):
    """Trains a ``Linear(2, 1)`` (the loss is irrelevant) and, in ``validation_step``, logs
    ``values[current_epoch]`` as ``MONITORED`` on rank 0 only (under ``if self.global_rank == 0``,
    without ``sync_dist``), or, the fix, on every rank with ``sync_dist=True``.

    Args:
        values: the number logged in each epoch (one per epoch, up to ``max_epochs``).
        rank_zero_only: the ``self.log`` argument.
        every_rank: log on every rank (the fix) instead of on rank 0 only.
    """

    def __init__(self, values: list, rank_zero_only: bool, every_rank: bool):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.values = values
        self.rank_zero_only = rank_zero_only
        self.every_rank = every_rank
        self.epochs_run: list = []

    def on_train_epoch_start(self):
        self.epochs_run.append(self.current_epoch)

    def training_step(self, batch, batch_idx):
        return self.layer(batch["x"] / 100.0).square().mean()

    def validation_step(self, batch, batch_idx):
        value = torch.tensor(float(self.values[self.current_epoch]))
        if self.every_rank:
            self.log(MONITORED, value, sync_dist=True, batch_size=len(batch["id"]))
        elif self.global_rank == 0:
            self.log(MONITORED, value, rank_zero_only=self.rank_zero_only, batch_size=len(batch["id"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def monitor_rank0_key(
    info: RankInfo,
    callback: str,
    values: list,
    rank_zero_only: bool = False,
    every_rank: bool = False,
    hold_s: float = 0.0,
    n_per_rank: int = 2,
    batch_size: int = 2,
) -> dict:
    """Scenario: fit a ``Rank0KeyRegressor`` for ``len(values)`` epochs (a validation loop after each, no
    sanity check) with ``ModelCheckpoint(monitor=MONITORED, mode="min", save_top_k=1)``
    (``callback="checkpoint"``; ``dirpath`` = this rank's ``checkpoints`` folder, replaced by rank 0's)
    or ``EarlyStopping(monitor=MONITORED, mode="min", patience=1)`` (``callback="early_stopping"``).

    Args:
        hold_s: if ``fit`` raises on a rank other than 0 and ``hold_s > 0``, record the error
            instead of raising and stay alive (in the process group) for ``hold_s`` seconds before
            returning, so that rank 0, blocked in a collective this rank never enters, reaches its own
            process-group timeout instead of being ended with the world. Rank 0 always raises.

    Record keys: ``raised`` (``"Type: message"`` of what ``fit`` raised here, or None),
    ``epochs_run``, ``callback_metrics``, ``files`` (``.ckpt`` files under the world folder, relative
    to it, sorted), ``best_model_score`` (ModelCheckpoint), ``stopped_epoch`` (EarlyStopping),
    ``should_stop``.
    """
    if callback not in CALLBACKS:
        raise ValueError(f"callback={callback!r}: use one of {CALLBACKS}")
    model = Rank0KeyRegressor(values, rank_zero_only=rank_zero_only, every_rank=every_rank)
    if callback == "checkpoint":
        watcher = pl.callbacks.ModelCheckpoint(
            dirpath=os.path.join(info.rank_dir, "checkpoints"), monitor=MONITORED, mode="min", save_top_k=1
        )
    else:
        watcher = pl.callbacks.EarlyStopping(monitor=MONITORED, mode="min", patience=1)
    loader = id_loader(n_per_rank * info.world_size, batch_size)
    trainer = ddp_trainer(
        info,
        max_epochs=len(values),
        callbacks=[watcher],
        num_sanity_val_steps=0,
        enable_checkpointing=callback == "checkpoint",
    )
    raised = None
    try:
        trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader)
    except Exception as exc:  # noqa: BLE001 - with hold_s, what fit raised is the record
        if hold_s <= 0 or info.rank == 0:
            raise
        raised = f"{type(exc).__name__}: {exc}"
        time.sleep(hold_s)
    files = sorted(
        os.path.relpath(os.path.join(root, name), info.world_dir)
        for root, _, names in os.walk(info.world_dir)
        for name in names
        if name.endswith(".ckpt")
    )
    score = getattr(watcher, "best_model_score", None)
    return {
        "raised": raised,
        "epochs_run": model.epochs_run,
        "callback_metrics": floats(trainer.callback_metrics),
        "files": files,
        "best_model_score": None if score is None else float(score),
        "stopped_epoch": getattr(watcher, "stopped_epoch", None),
        "should_stop": trainer.should_stop,
    }
