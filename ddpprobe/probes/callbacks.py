"""The callbacks probe: ``EarlyStopping`` and ``ModelCheckpoint`` monitoring a metric that is *not*
synchronized, so that each rank sees a different number and must still take the same decision.

``MonitoredRegressor`` trains a ``Linear(2, 1)`` with SGD (the loss is irrelevant) and, in every
``training_step``, logs ``"monitored"`` with ``sync_dist=False`` at epoch level. Its value is read from a
table the test chooses: ``values[rank][epoch]``, constant within an epoch, so the epoch mean on rank
``r`` is exactly ``values[r][epoch]``. Both callbacks then decide on each rank from that rank's number
and reduce the decision over ranks with ``trainer.strategy.reduce_boolean_decision``:

- ``EarlyStopping._run_early_stopping_check``: ``reduce_boolean_decision(should_stop, all=False)``,
  i.e. stop as soon as *any* rank wants to;
- ``ModelCheckpoint.check_monitor_top_k``: ``reduce_boolean_decision(improved)`` with the default
  ``all=True``, i.e. save only when *every* rank sees an improvement (the first save, while fewer
  than ``save_top_k`` checkpoints exist, is not reduced at all).

Sources: pytorch_lightning/callbacks/early_stopping.py, pytorch_lightning/callbacks/model_checkpoint.py,
pytorch_lightning/strategies/parallel.py ``ParallelStrategy.reduce_boolean_decision``,
pytorch_lightning/strategies/strategy.py ``Strategy.save_checkpoint`` (writes on global rank 0 only).
"""

from __future__ import annotations

import os

import torch

from ddpprobe._lightning import fabric, pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, id_loader, recorded_warnings

#: Name under which ``MonitoredRegressor`` logs the per-rank table value.
MONITORED = "monitored"


class MonitoredRegressor(pl.LightningModule):
    """A tiny regressor that logs ``values[global_rank][current_epoch]`` as ``"monitored"`` (unsynced).

    Args:
        values: ``values[r][e]``, the number rank ``r`` logs in epoch ``e`` (one row per rank, one
            column per epoch at least up to ``max_epochs``).
        sync_dist: passed to ``self.log``; with True every rank holds the all-rank mean of
            ``values[.][e]`` instead of its own number.
    """

    def __init__(self, values: list, sync_dist: bool = False):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.values = values
        self.sync_dist = sync_dist
        self.epochs_run: list = []
        self.tested_batches = 0

    def on_train_epoch_start(self):
        self.epochs_run.append(self.current_epoch)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch["x"] / 100.0).square().mean()
        value = torch.tensor(float(self.values[self.global_rank][self.current_epoch]))
        self.log(MONITORED, value, on_step=False, on_epoch=True, sync_dist=self.sync_dist, batch_size=len(batch["id"]))
        return loss

    def test_step(self, batch, batch_idx):
        self.tested_batches += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _MetricRecorder(pl.Callback):
    """Records ``callback_metrics["monitored"]`` at each training epoch end, before the monitoring
    callbacks (``EarlyStopping``, ``ModelCheckpoint``) run: what they see on this rank."""

    def __init__(self):
        self.seen: list = []

    def on_train_epoch_end(self, trainer, pl_module):
        value = trainer.callback_metrics.get(MONITORED)
        self.seen.append(None if value is None else float(value))


class RecordingCheckpointIO(fabric.plugins.TorchCheckpointIO):
    """``TorchCheckpointIO`` that also records every path it is asked to write, on this rank."""

    def __init__(self):
        super().__init__()
        self.saved: list = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.saved.append(str(path))
        super().save_checkpoint(checkpoint, path, storage_options=storage_options)


def _fit(
    info: RankInfo,
    values: list,
    max_epochs: int,
    n_per_rank: int,
    batch_size: int,
    callbacks: list,
    sync_dist: bool = False,
    **overrides,
):
    model = MonitoredRegressor(values, sync_dist=sync_dist)
    recorder = _MetricRecorder()
    trainer = ddp_trainer(info, max_epochs=max_epochs, callbacks=[recorder, *callbacks], **overrides)
    trainer.fit(model, train_dataloaders=id_loader(n_per_rank * info.world_size, batch_size))
    return trainer, model, recorder


def early_stopping(
    info: RankInfo,
    values: list,
    stopping_threshold: float = None,
    patience: int = 100,
    mode: str = "min",
    max_epochs: int = 3,
    n_per_rank: int = 2,
    batch_size: int = 2,
) -> dict:
    """Scenario: fit ``MonitoredRegressor(values)`` with ``EarlyStopping(monitor="monitored", ...)``.

    The check runs at each training epoch end (no validation loop: ``EarlyStopping.setup`` sets
    ``check_on_train_epoch_end``).

    Record keys: ``seen`` (``"monitored"`` as this rank's callbacks saw it, per epoch), ``epochs_run``
    (``current_epoch`` at each training epoch start), ``stopped_epoch`` (``EarlyStopping.stopped_epoch``:
    the epoch at which the stop was decided, 0 if never), ``should_stop`` and ``current_epoch``
    (the Trainer's, after ``fit``; ``current_epoch`` counts completed epochs), ``stopping_reason``
    (name of the ``EarlyStoppingReason`` this rank's callback recorded), ``stopping_reason_message``
    (both None on releases whose ``EarlyStopping`` has no ``stopping_reason``).
    """
    stopper = pl.callbacks.EarlyStopping(
        monitor=MONITORED, mode=mode, stopping_threshold=stopping_threshold, patience=patience, check_finite=True
    )
    trainer, model, recorder = _fit(info, values, max_epochs, n_per_rank, batch_size, [stopper])
    return {
        "seen": recorder.seen,
        "epochs_run": model.epochs_run,
        "stopped_epoch": stopper.stopped_epoch,
        "should_stop": trainer.should_stop,
        "current_epoch": trainer.current_epoch,
        # ``EarlyStopping.stopping_reason`` is new in 2.6 (absent up to 2.5.1): None on releases without it.
        "stopping_reason": stopper.stopping_reason.name if hasattr(stopper, "stopping_reason") else None,
        "stopping_reason_message": getattr(stopper, "stopping_reason_message", None),
    }


def model_checkpoint(
    info: RankInfo,
    values: list,
    mode: str = "min",
    max_epochs: int = 3,
    n_per_rank: int = 4,
    batch_size: int = 2,
    filename: str = None,
    sync_dist: bool = False,
    test_best: bool = False,
) -> dict:
    """Scenario: fit ``MonitoredRegressor(values, sync_dist)`` with ``ModelCheckpoint(monitor="monitored",
    save_top_k=1, dirpath=<this rank's folder>/checkpoints, filename=filename)`` (``None``: the default
    ``"{epoch}-{step}"``); with ``test_best``, then ``trainer.test(ckpt_path="best")`` on the same Trainer.

    Each rank passes its *own* folder as ``dirpath``; ``ModelCheckpoint.setup`` replaces it with rank
    0's (``trainer.strategy.broadcast``). Paths in the record are relative to the world folder
    (``"rank0/checkpoints/epoch=0-step=2.ckpt"``).

    Record keys: ``seen`` (per epoch, as above), ``dirpath_given``, ``dirpath`` (after ``fit``),
    ``best_model_score`` (float), ``best_model_path``, ``best_k_models`` (path -> score),
    ``saved`` (paths this rank's ``CheckpointIO`` was asked to write, in order), ``warnings``,
    ``best_exists`` (whether this rank sees a file at its ``best_model_path``, after ``fit``), and
    ``test`` (None without ``test_best``; else ``{"raised", "message", "ckpt_path", "tested_batches"}``:
    the exception ``trainer.test`` raised on this rank, or None, the checkpoint path the Trainer restored,
    and the test batches this rank ran).
    """
    given = os.path.join(info.rank_dir, "checkpoints")
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath=given, filename=filename, monitor=MONITORED, mode=mode, save_top_k=1
    )
    checkpoint_io = RecordingCheckpointIO()
    with recorded_warnings() as warnings:
        trainer, model, recorder = _fit(
            info,
            values,
            max_epochs,
            n_per_rank,
            batch_size,
            [checkpoint],
            sync_dist=sync_dist,
            enable_checkpointing=True,
            plugins=[checkpoint_io],
        )
    best_exists = bool(checkpoint.best_model_path) and os.path.exists(checkpoint.best_model_path)
    test = _test_best(trainer, model, info, n_per_rank, batch_size) if test_best else None

    def rel(path):
        return os.path.relpath(path, info.world_dir) if path else path

    if test is not None:
        test["ckpt_path"] = rel(test["ckpt_path"])

    return {
        "seen": recorder.seen,
        "dirpath_given": rel(given),
        "dirpath": rel(checkpoint.dirpath),
        "best_model_score": None if checkpoint.best_model_score is None else float(checkpoint.best_model_score),
        "best_model_path": rel(checkpoint.best_model_path),
        "best_k_models": {rel(k): float(v) for k, v in checkpoint.best_k_models.items()},
        "saved": [rel(p) for p in checkpoint_io.saved],
        "warnings": warnings,
        "best_exists": best_exists,
        "test": test,
    }


def _test_best(trainer, model, info: RankInfo, n_per_rank: int, batch_size: int) -> dict:
    """``trainer.test(model, ckpt_path="best")``, recording what it raised on this rank instead of raising."""
    raised = message = None
    try:
        trainer.test(
            model, dataloaders=id_loader(n_per_rank * info.world_size, batch_size), ckpt_path="best", verbose=False
        )
    except Exception as exc:  # noqa: BLE001 - what Lightning raises is the record
        raised, message = type(exc).__name__, str(exc)
    return {
        "raised": raised,
        "message": message,
        "ckpt_path": trainer.ckpt_path,
        "tested_batches": model.tested_batches,
    }


class _DecisionProbe(pl.LightningModule):
    def __init__(self, decision: bool):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.decision = decision
        self.reduced: dict = {}

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_epoch_end(self):
        reduce = self.trainer.strategy.reduce_boolean_decision
        self.reduced = {
            "default": reduce(self.decision),
            "all_true": reduce(self.decision, all=True),
            "all_false": reduce(self.decision, all=False),
        }


def reduce_decision(info: RankInfo, decisions: list) -> dict:
    """Scenario: rank ``r`` calls ``trainer.strategy.reduce_boolean_decision(decisions[r], ...)`` with
    the default, ``all=True`` and ``all=False``, in ``on_validation_epoch_end`` of a ``trainer.validate``.

    Record keys: ``decision`` (this rank's input), ``reduced`` (``{"default", "all_true", "all_false"}``).
    """
    model = _DecisionProbe(bool(decisions[info.rank]))
    trainer = ddp_trainer(info)
    trainer.validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return {"decision": model.decision, "reduced": model.reduced}
