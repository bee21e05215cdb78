"""The reduction probe: ``self.log`` with every ``reduce_fx``, step/epoch level, sync groups and value types.

``ReductionProbe`` follows a *log plan*, a list of ``log_spec(...)`` dicts (ddpprobe/probes/log_plan.py,
which lists the values an entry may log). For every batch (in ``training_step``, ``validation_step``
and ``test_step`` alike) each step-level entry logs one value; an entry with ``hook="epoch_end"`` is
logged once in ``on_validation_epoch_end`` (``metric_compute``: ``compute()`` of a separate
``MeanMetric`` fed every batch's values, logged as a plain tensor; its value is already the all-rank
mean, since ``compute`` syncs the state). Entries may log on some ranks only (``ranks``), through
``self.log_dict`` (``via``) and into a sub process group (``subgroup``).

Every batch logs ``batch_size=`` explicitly: the batch's length, or ``weights[rank][batch_idx]`` when
the scenario gives ``weights`` (to make ranks' batch sizes differ at the same step). After each batch
the probe records what ``trainer.logged_metrics`` and ``trainer.callback_metrics`` hold at that
moment, which is how a step-level value (``on_step=True``) can be read.
"""

from __future__ import annotations

import torch
import torch.distributed
from torchmetrics import MeanMetric, SumMetric

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, floats, id_loader, recorded_warnings, trainer_metrics
from ddpprobe.probes.log_plan import check_plan, log_entry, logs_here


class ReductionProbe(pl.LightningModule):
    """Logs per its plan (see the module docstring) and records what the Trainer's metric dicts hold.

    Args:
        plan: list of ``log_spec(...)`` dicts.
        weights: ``weights[rank][batch_idx]`` is the ``batch_size=`` this rank reports for that batch;
            ``None`` reports the batch's real length.
        subgroup_ranks: global ranks of a sub process group that ``setup`` creates on every rank with
            ``torch.distributed.new_group`` (a collective: all ranks must call it, members or not).
    """

    def __init__(self, plan=(), weights=None, subgroup_ranks=None):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.plan = check_plan(plan, type(self).__name__)
        self.weights = weights
        self.subgroup_ranks = subgroup_ranks
        self.subgroup = None
        self.mean_metric = MeanMetric()
        self.sum_metric = SumMetric()
        self.side_metric = MeanMetric()
        self.seen_ids: list = []
        self.reported_batch_sizes: list = []
        self.step_logged: list = []
        self.step_callback: list = []

    def setup(self, stage):
        if self.subgroup_ranks is not None:
            self.subgroup = torch.distributed.new_group(ranks=list(self.subgroup_ranks))

    def _value(self, what, batch):
        values = batch["value"]
        if what == "batch_mean":
            return values.mean()
        if what == "python_float":
            return float(values.mean())
        if what == "python_int":
            return int(batch["id"].sum())
        if what == "int_tensor":
            return batch["id"].sum()
        if what == "mean_metric":
            self.mean_metric.update(values)
            return self.mean_metric
        if what == "sum_metric":
            self.sum_metric.update(values)
            return self.sum_metric
        raise AssertionError(what)

    def _step(self, batch, batch_idx):
        ids = batch_ids(batch)
        self.seen_ids.append(ids)
        batch_size = len(ids) if self.weights is None else self.weights[self.global_rank][batch_idx]
        self.reported_batch_sizes.append(batch_size)
        self.side_metric.update(batch["value"])
        for entry in self.plan:
            if logs_here(entry, "step", self.global_rank):
                log_entry(self, entry, self._value(entry["what"], batch), batch_size, group=self.subgroup)
        # A loss for training_step; its gradient is zero, so nothing learns and nothing drifts.
        return self.layer(batch["x"]).sum() * 0.0

    def _record_step(self):
        self.step_logged.append(floats(self.trainer.logged_metrics))
        self.step_callback.append(floats(self.trainer.callback_metrics))

    def training_step(self, batch, batch_idx):
        return self._step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self._step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self._record_step()

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self._record_step()

    def on_test_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self._record_step()

    def on_validation_epoch_end(self):
        # `compute` of a metric is a collective: every rank calls it, whether it logs the result or not.
        computed = self.side_metric.compute() if any(e["hook"] == "epoch_end" for e in self.plan) else None
        for entry in self.plan:
            if logs_here(entry, "epoch_end", self.global_rank):
                log_entry(self, entry, computed, group=self.subgroup)
        self.side_metric.reset()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _record(trainer, model) -> dict:
    return {
        "global_rank": trainer.global_rank,
        "seen_ids": model.seen_ids,
        "reported_batch_sizes": model.reported_batch_sizes,
        "step_logged_metrics": model.step_logged,
        "step_callback_metrics": model.step_callback,
        **trainer_metrics(trainer),
    }


def validate_plan(
    info: RankInfo, n: int, batch_size: int, plan: list, weights=None, subgroup_ranks=None, expect_error: bool = False
) -> dict:
    """Scenario: ``trainer.validate`` a ``ReductionProbe`` over ``IdDataset(n)``.

    Record keys: ``global_rank``, ``seen_ids`` (per-batch id lists), ``reported_batch_sizes`` (the
    ``batch_size=`` logged per batch), ``step_logged_metrics`` / ``step_callback_metrics`` (one
    ``{name: float}`` per batch, read in ``on_validation_batch_end``), ``callback_metrics``,
    ``logged_metrics``, ``progress_bar_metrics`` (after the run), ``returned`` (what
    ``trainer.validate`` returned), ``warnings``. With ``expect_error`` an exception from
    ``trainer.validate`` is recorded as ``error = {"type", "message"}`` instead of failing the rank.
    """
    model = ReductionProbe(plan=plan, weights=weights, subgroup_ranks=subgroup_ranks)
    error, returned = None, []
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        try:
            returned = trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
        except Exception as exc:  # noqa: BLE001 - recorded for the fact to assert on
            if not expect_error:
                raise
            error = {"type": type(exc).__name__, "message": str(exc)}
    return {
        **_record(trainer, model),
        "returned": [floats(d) for d in returned],
        "warnings": warnings,
        "error": error,
    }


def fit_plan(info: RankInfo, n: int, batch_size: int, plan: list, weights=None) -> dict:
    """Scenario: ``trainer.fit`` a ``ReductionProbe`` for one epoch over ``IdDataset(n)`` (no validation).

    The plan is logged from ``training_step``. Record keys as ``validate_plan`` (without ``returned``
    and ``error``); ``step_*_metrics`` are read in ``on_train_batch_end``.
    """
    model = ReductionProbe(plan=plan, weights=weights)
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
        trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
    return {**_record(trainer, model), "warnings": warnings}


def validate_then_test(info: RankInfo, n: int, batch_size: int, plan: list) -> dict:
    """Scenario: ``trainer.validate`` then ``trainer.test`` (both ``verbose=True``) on one Trainer.

    Record keys: ``validate`` and ``test``, each ``{"returned", "callback_metrics", "logged_metrics",
    "progress_bar_metrics"}`` read right after that call. The results tables go to the rank's stdout.
    """
    model = ReductionProbe(plan=plan)
    trainer = ddp_trainer(info)
    record = {}
    for stage, run in (("validate", trainer.validate), ("test", trainer.test)):
        returned = run(model, dataloaders=id_loader(n, batch_size), verbose=True)
        record[stage] = {"returned": [floats(d) for d in returned], **trainer_metrics(trainer)}
    return record
