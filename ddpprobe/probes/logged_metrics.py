"""The logging probes of facts in tests/facts/test_log_reductions.py and test_metric_precision_and_devices.py: a
logged torchmetrics object reset at each epoch end (and an unlogged one not), step-level ``reduce_fx`` across
ranks and its string aliases, batch sizes inferred from the batch, and float64 values.

- ``MetricResetProbe`` (on ``PlainFitProbe``, ddpprobe/probes/loggers_per_rank.py) feeds two
  ``torchmetrics.SumMetric`` objects every validation sample's ``value`` (``id ** 2``): ``logged`` is
  passed to ``self.log``, ``unlogged`` is only ``compute()``-d in ``on_validation_epoch_end``.
- ``StepReductionProbe`` logs, in its one training step, the rank's value ``(rank + 1) ** 2 + 0.5``
  once per ``reduce_fx`` string it is given (``on_step=True, on_epoch=False, sync_dist=True``).
- ``InferenceProbe`` logs each validation batch's mean ``value`` with ``sync_dist=True`` three ways: without
  ``batch_size`` (Lightning infers it), with ``batch_size=len(batch)``, with ``batch_size=1``; and a float64
  value ``1 + (rank + 1) * 1e-10`` that float32 cannot hold, an int8 and a bfloat16 value.
"""

from __future__ import annotations

import torch
import torchmetrics

from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, floats
from ddpprobe.probes.loggers_per_rank import PlainFitProbe
from ddpprobe.probes.training import regression_loader


class MetricResetProbe(PlainFitProbe):
    """Records, per epoch: ``logged_state`` / ``unlogged_state`` (each metric's local ``sum_value`` at
    ``on_validation_epoch_start``), ``unlogged_compute`` (``unlogged.compute()`` at
    ``on_validation_epoch_end``) and ``logged_value`` (``trainer.callback_metrics["logged_sum"]`` at
    ``on_train_epoch_end``, after that epoch's validation)."""

    def __init__(self):
        super().__init__()
        self.logged = torchmetrics.SumMetric()
        self.unlogged = torchmetrics.SumMetric()
        self.epochs: dict = {}

    def _epoch(self) -> dict:
        return self.epochs.setdefault(str(self.current_epoch), {})

    def on_validation_epoch_start(self):
        self._epoch().update(logged_state=float(self.logged.sum_value), unlogged_state=float(self.unlogged.sum_value))

    def validation_step(self, batch, batch_idx):
        self.logged.update(batch["value"])
        self.unlogged.update(batch["value"])
        self.log("logged_sum", self.logged, on_step=False, on_epoch=True)

    def on_validation_epoch_end(self):
        self._epoch()["unlogged_compute"] = float(self.unlogged.compute())

    def on_train_epoch_end(self):
        self._epoch()["logged_value"] = float(self.trainer.callback_metrics["logged_sum"])


def fit_metric_reset(info: RankInfo, n: int, val_n: int, batch_size: int, epochs: int) -> dict:
    """Scenario: ``trainer.fit`` a ``MetricResetProbe`` for ``epochs`` epochs, validating
    ``RegressionDataset(val_n)`` after each (no sanity check). Record: ``{"epochs": {epoch: {...}}}``."""
    model = MetricResetProbe()
    trainer = ddp_trainer(info, max_epochs=epochs, num_sanity_val_steps=0)
    trainer.fit(
        model,
        train_dataloaders=regression_loader(n, batch_size),
        val_dataloaders=regression_loader(val_n, batch_size),
    )
    return {"epochs": model.epochs}


def step_value(rank: int) -> float:
    """The number rank ``rank`` logs in ``StepReductionProbe``: ``(rank + 1) ** 2 + 0.5``."""
    return (rank + 1) ** 2 + 0.5


class StepReductionProbe(PlainFitProbe):
    """Logs ``step_value(rank)`` as ``"v_<fx>"`` for each ``reduce_fx`` string in ``reduce_fxs``
    (``on_step=True, on_epoch=False, sync_dist=True``); records ``callback_metrics`` at epoch end."""

    def __init__(self, reduce_fxs):
        super().__init__()
        self.reduce_fxs = tuple(reduce_fxs)
        self.at_epoch_end: dict = {}

    def training_step(self, batch, batch_idx):
        value = torch.tensor(step_value(self.global_rank), device=self.device)
        for fx in self.reduce_fxs:
            self.log(f"v_{fx}", value, on_step=True, on_epoch=False, sync_dist=True, reduce_fx=fx)
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self):
        self.at_epoch_end = floats(self.trainer.callback_metrics)


def fit_step_reductions(info: RankInfo, reduce_fxs) -> dict:
    """Scenario: one training step per rank of ``StepReductionProbe(reduce_fxs)``. Record:
    ``{"callback_metrics": {name: float}}`` as ``on_train_epoch_end`` read them."""
    model = StepReductionProbe(reduce_fxs)
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=regression_loader(2 * info.world_size, 2))
    return {"callback_metrics": model.at_epoch_end}


def float64_value(rank: int) -> float:
    """The float64 number rank ``rank`` logs in ``InferenceProbe``: ``1 + (rank + 1) * 1e-10``."""
    return 1.0 + (rank + 1) * 1e-10


def bfloat16_value(rank: int) -> float:
    """The bfloat16 number rank ``rank`` logs in ``InferenceProbe``: ``1 + rank * 2 ** -7`` (exact in
    bfloat16; the mean of ranks 0 and 1, ``1 + 2 ** -8``, is not)."""
    return 1.0 + rank * 2.0**-7


class InferenceProbe(PlainFitProbe):
    """See the module docstring; keys ``"inferred"``, ``"explicit"``, ``"unweighted"``, ``"f64"``, and
    ``"i8"`` (the int8 tensor ``rank + 1``) and ``"bf16"`` (the bfloat16 tensor ``bfloat16_value(rank)``)."""

    def validation_step(self, batch, batch_idx):
        mean = batch["value"].mean()
        self.log("inferred", mean, sync_dist=True)
        self.log("explicit", mean, sync_dist=True, batch_size=len(batch["id"]))
        self.log("unweighted", mean, sync_dist=True, batch_size=1)
        self.log(
            "f64",
            torch.tensor(float64_value(self.global_rank), dtype=torch.float64, device=self.device),
            sync_dist=True,
        )
        self.log("i8", torch.tensor(self.global_rank + 1, dtype=torch.int8, device=self.device), sync_dist=True)
        bf16 = torch.tensor(bfloat16_value(self.global_rank), dtype=torch.bfloat16, device=self.device)
        self.log("bf16", bf16, sync_dist=True)


def validate_inference(info: RankInfo, n: int, batch_size: int) -> dict:
    """Scenario: ``trainer.validate`` an ``InferenceProbe`` over ``RegressionDataset(n)``.

    Record keys: ``callback_metrics`` (name -> float, float64 kept), ``dtypes`` (name -> dtype string).
    """
    trainer = ddp_trainer(info)
    trainer.validate(InferenceProbe(), dataloaders=regression_loader(n, batch_size), verbose=False)
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "dtypes": {k: str(v.dtype) for k, v in sorted(trainer.callback_metrics.items())},
    }
