"""The training-loop probes of tests/facts/test_training_step_returning_none.py,
test_estimated_stepping_batches.py, test_lr_find.py and test_callbacks.py: a ``training_step`` that returns
None, the estimated number of optimizer steps, ``lr_find``, ``SpikeDetection`` and ``ModelCheckpoint`` with a
step-level monitor or none.

Every module is ``PlainFitProbe`` (a ``Linear(2, 1)`` trained with SGD on ``RegressionDataset``,
ddpprobe/probes/loggers_per_rank.py) with one change each:

- ``NoneStepProbe`` returns None from ``training_step`` at one batch on the ranks it is told;
- ``SteppingProbe`` reads ``trainer.estimated_stepping_batches`` in ``configure_optimizers``;
- ``SpikeProbe`` returns the loss ``spike_loss(rank, batch_idx)`` (1.0, or 100.0 at one batch of one rank);
- ``StepMonitorProbe`` logs ``"v"`` = ``step_monitor_value(rank, batch_idx)`` with ``on_step=True,
  on_epoch=True, sync_dist=True`` (keys ``v_step`` and ``v_epoch``).
"""

from __future__ import annotations

import json
import os

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer
from ddpprobe.probes.loggers_per_rank import PlainFitProbe
from ddpprobe.probes.training import regression_loader


class NoneStepProbe(PlainFitProbe):
    """Returns None from ``training_step`` at batch ``none_at`` on the ranks in ``none_ranks``; records
    the batches its ``training_step`` started in ``steps``."""

    def __init__(self, none_ranks, none_at: int):
        super().__init__()
        self.none_ranks = set(none_ranks)
        self.none_at = none_at
        self.steps: list = []

    def training_step(self, batch, batch_idx):
        self.steps.append(batch_idx)
        if batch_idx == self.none_at and self.global_rank in self.none_ranks:
            return None
        return super().training_step(batch, batch_idx)


def fit_none_step(info: RankInfo, none_ranks, none_at: int, n: int, batch_size: int = 2) -> dict:
    """Scenario: one epoch of ``trainer.fit`` a ``NoneStepProbe``; what Lightning raises propagates (the
    launcher reports it per rank). Record keys: ``steps`` (batches started), ``global_step``."""
    model = NoneStepProbe(none_ranks, none_at)
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=regression_loader(n, batch_size))
    return {"steps": model.steps, "global_step": trainer.global_step}


class SteppingProbe(PlainFitProbe):
    """Reads ``self.trainer.estimated_stepping_batches`` in ``configure_optimizers`` (``estimated``)."""

    def configure_optimizers(self):
        self.estimated = self.trainer.estimated_stepping_batches
        return super().configure_optimizers()


def fit_stepping(info: RankInfo, n: int, batch_size: int, max_epochs: int, accumulate_grad_batches: int) -> dict:
    """Scenario: ``trainer.fit`` a ``SteppingProbe``. Record keys: ``estimated``, ``global_step`` (the
    optimizer steps taken), ``num_training_batches`` (the Trainer's, per epoch)."""
    model = SteppingProbe()
    trainer = ddp_trainer(
        info, max_epochs=max_epochs, accumulate_grad_batches=accumulate_grad_batches, limit_val_batches=0
    )
    trainer.fit(model, train_dataloaders=regression_loader(n, batch_size))
    return {
        "estimated": model.estimated,
        "global_step": trainer.global_step,
        "num_training_batches": trainer.num_training_batches,
    }


#: The rank and batch whose loss spikes in ``SpikeProbe``.
SPIKE_RANK, SPIKE_BATCH = 1, 3


def spike_loss(rank: int, batch_idx: int) -> float:
    """The loss ``SpikeProbe`` reports: 100.0 on rank ``SPIKE_RANK`` at batch ``SPIKE_BATCH``, else 1.0."""
    return 100.0 if (rank, batch_idx) == (SPIKE_RANK, SPIKE_BATCH) else 1.0


class SpikeProbe(PlainFitProbe):
    """``training_step`` returns ``spike_loss(rank, batch_idx)`` (carrying the layer's graph times 0)."""

    def __init__(self):
        super().__init__()
        self.steps: list = []

    def training_step(self, batch, batch_idx):
        self.steps.append(batch_idx)
        return super().training_step(batch, batch_idx) * 0 + spike_loss(self.global_rank, batch_idx)


def fit_spike(info: RankInfo, n: int, batch_size: int = 2) -> dict:
    """Scenario: one epoch of ``trainer.fit`` a ``SpikeProbe`` with ``SpikeDetection(window=2, warmup=1)``.

    Record keys: ``raised`` (class name or None), ``message`` (its text), ``steps`` (batches started),
    ``skip_file`` (the content of ``skip_batches.json`` in the rank's working directory, or None).
    """
    spike = pl.callbacks.SpikeDetection(window=2, warmup=1, exclude_batches_path=".")
    model = SpikeProbe()
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0, callbacks=[spike])
    raised = message = skip_file = None
    try:
        trainer.fit(model, train_dataloaders=regression_loader(n, batch_size))
    except RuntimeError as exc:
        raised, message = type(exc).__name__, str(exc)
    if os.path.exists("skip_batches.json"):
        with open("skip_batches.json", encoding="utf-8") as f:
            skip_file = json.load(f)
    return {"raised": raised, "message": message, "steps": model.steps, "skip_file": skip_file}


def step_monitor_value(rank: int, batch_idx: int) -> float:
    """What rank ``rank`` logs as ``"v"`` at batch ``batch_idx``: ``(rank + 1) * ((b - 2) ** 2 + b / 10)``
    (least at batch 2, then batch 1, on every rank)."""
    return (rank + 1) * ((batch_idx - 2) ** 2 + batch_idx / 10)


class StepMonitorProbe(PlainFitProbe):
    """Logs ``step_monitor_value(rank, batch_idx)`` as ``"v"`` (step and epoch, ``sync_dist=True``)."""

    def training_step(self, batch, batch_idx):
        value = torch.tensor(step_monitor_value(self.global_rank, batch_idx), device=self.device)
        self.log("v", value, on_step=True, on_epoch=True, sync_dist=True, batch_size=len(batch["id"]))
        return super().training_step(batch, batch_idx)


def _checkpoint_record(checkpoint, trainer) -> dict:
    score = checkpoint.best_model_score
    return {
        "best_model_path": os.path.basename(checkpoint.best_model_path),
        "best_model_score": None if score is None else float(score),
        "best_k_models": sorted(os.path.basename(p) for p in checkpoint.best_k_models),
        "global_step": trainer.global_step,
    }


def fit_checkpoint(
    info: RankInfo,
    n: int,
    batch_size: int,
    max_epochs: int,
    monitor=None,
    save_top_k: int = 1,
    every_n_train_steps=None,
) -> dict:
    """Scenario: ``trainer.fit`` a ``StepMonitorProbe`` with ``ModelCheckpoint(dirpath="checkpoints",
    monitor, save_top_k, mode="min", every_n_train_steps)``; ``dirpath`` is relative, so each rank names
    its own working directory and Lightning broadcasts rank 0's.

    Record keys: ``best_model_path`` and ``best_k_models`` (file names), ``best_model_score``,
    ``global_step``; the files themselves are the rank's ``RankResult.files``.
    """
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath="checkpoints",
        monitor=monitor,
        save_top_k=save_top_k,
        mode="min",
        every_n_train_steps=every_n_train_steps,
    )
    trainer = ddp_trainer(
        info, max_epochs=max_epochs, limit_val_batches=0, enable_checkpointing=True, callbacks=[checkpoint]
    )
    trainer.fit(StepMonitorProbe(), train_dataloaders=regression_loader(n, batch_size))
    return _checkpoint_record(checkpoint, trainer)


class LrProbe(PlainFitProbe):
    """``PlainFitProbe`` with its learning rate in ``self.lr`` (what ``lr_find`` updates); records each
    training step's loss in ``losses``."""

    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.lr = lr
        self.losses: list = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def find_lr(info: RankInfo, num_training: int, batch_size: int = 2) -> dict:
    """Scenario: ``Tuner(trainer).lr_find(LrProbe(), num_training=..., early_stop_threshold=None)`` over
    ``RegressionDataset(num_training * batch_size * world_size)`` (one epoch is ``num_training`` steps).

    Record keys: ``losses`` (this rank's loss at each step of the search), ``results_loss`` and
    ``results_lr`` (the finder's results on this rank), ``suggestion``, ``lr`` (the module's after).
    """
    model = LrProbe()
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
    loader = regression_loader(num_training * batch_size * info.world_size, batch_size)
    finder = pl.tuner.Tuner(trainer).lr_find(
        model, train_dataloaders=loader, num_training=num_training, early_stop_threshold=None
    )
    return {
        "losses": model.losses,
        "results_loss": [float(v) for v in finder.results["loss"]],
        "results_lr": [float(v) for v in finder.results["lr"]],
        "suggestion": finder.suggestion(),
        "lr": model.lr,
    }


#: The one rank whose ``"a"`` stops improving (not rank 0, so "rank 0 decides" and "any rank decides" differ).
STOPPING_RANK = 1


def two_monitor_values(rank: int, epoch: int) -> dict:
    """What rank ``rank`` logs (unsynced) at epoch ``epoch`` in ``TwoMonitorProbe``: ``"a"`` rises on rank
    ``STOPPING_RANK`` from epoch 1 on and falls on every other rank; ``"b"`` falls until epoch 2 and then
    stays on every rank."""
    a = 5.0 + epoch if rank == STOPPING_RANK else 5.0 - epoch
    return {"a": a, "b": 5.0 - min(epoch, 2)}


class TwoMonitorProbe(PlainFitProbe):
    """Logs ``two_monitor_values(rank, epoch)`` (``on_epoch=True``, no ``sync_dist``) from ``training_step``
    when ``in_training``, else from ``validation_step``; records the epochs its ``training_step`` ran."""

    def __init__(self, in_training: bool):
        super().__init__()
        self.in_training = in_training
        self.epochs: list = []

    def _log_values(self, batch):
        for key, value in two_monitor_values(self.global_rank, self.current_epoch).items():
            self.log(key, value, on_step=False, on_epoch=True, batch_size=len(batch["id"]))

    def training_step(self, batch, batch_idx):
        if self.current_epoch not in self.epochs:
            self.epochs.append(self.current_epoch)
        if self.in_training:
            self._log_values(batch)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if not self.in_training:
            self._log_values(batch)


def fit_two_early_stoppings(info: RankInfo, check_on_train_epoch_end: bool, max_epochs: int = 6) -> dict:
    """Scenario: ``trainer.fit`` a ``TwoMonitorProbe`` with ``EarlyStopping(monitor="a", patience=0)`` and
    ``EarlyStopping(monitor="b", patience=0)`` (mode min, ``check_on_train_epoch_end`` as given; the values
    logged in training when it is True, in validation otherwise).

    Record keys: ``epochs`` (the epochs training ran), ``stopped_epoch`` (each callback's, ``{"a", "b"}``).
    """
    callbacks = [
        pl.callbacks.EarlyStopping(
            monitor=key, patience=0, mode="min", check_on_train_epoch_end=check_on_train_epoch_end
        )
        for key in ("a", "b")
    ]
    model = TwoMonitorProbe(in_training=check_on_train_epoch_end)
    trainer = ddp_trainer(
        info,
        max_epochs=max_epochs,
        callbacks=callbacks,
        num_sanity_val_steps=0,
        limit_val_batches=0 if check_on_train_epoch_end else 1.0,
    )
    val = None if check_on_train_epoch_end else regression_loader(2 * info.world_size, 2)
    trainer.fit(model, train_dataloaders=regression_loader(2 * info.world_size, 2), val_dataloaders=val)
    return {"epochs": model.epochs, "stopped_epoch": {c.monitor: c.stopped_epoch for c in callbacks}}
