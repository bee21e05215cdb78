"""The logger, log-line, progress-bar and profiler probes: what each rank's loggers,
``EarlyStopping`` messages, progress bar and profiler do under DDP.

- ``AllRankLogger`` is a user's ``Logger`` with no ``rank_zero_only`` anywhere: it keeps every
  ``log_metrics`` call and writes one line per call to ``all_rank_logger.txt`` in the rank's working
  directory. ``RankZeroLogger`` is the same with ``log_metrics`` decorated by ``rank_zero_only``, as the
  built-in loggers do (pytorch_lightning/loggers/csv_logs.py ``CSVLogger.log_metrics``).
- ``EpochValueProbe`` logs ``"v"`` = ``10 - epoch`` (``sync_dist=True``) in ``validation_step``, so
  ``EarlyStopping(monitor="v", mode="min")`` sees an improvement every epoch.
- ``PlainFitProbe`` trains a ``Linear(2, 1)`` and logs nothing (no hidden collective for the progress
  bar to run, see tests/facts/test_hidden_collectives_progress_bar.py).
"""

from __future__ import annotations

import logging

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, id_loader
from ddpprobe.probes.training import regression_loader
from ddpprobe.probes.validation import ValidationProbe

#: The file ``AllRankLogger`` writes in the rank's working directory, one line per ``log_metrics`` call.
LOGGER_FILE = "all_rank_logger.txt"


class AllRankLogger(pl.loggers.Logger):
    """A ``Logger`` without ``rank_zero_only``: every ``log_metrics(metrics, step)`` is kept in ``calls``
    (``{"metrics": {name: float}, "step": int}``) and written as a line to ``LOGGER_FILE``."""

    def __init__(self):
        super().__init__()
        self.calls: list = []
        self.saves = 0

    @property
    def name(self) -> str:
        return "all_rank"

    @property
    def version(self) -> int:
        return 0

    @property
    def experiment(self):
        """No experiment object: the logger is its own (what ``ValidationProbe`` records as the class)."""
        return self

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        call = {"metrics": {k: float(v) for k, v in sorted(metrics.items())}, "step": step}
        self.calls.append(call)
        with open(LOGGER_FILE, "a", encoding="utf-8") as f:
            f.write(f"{call}\n")

    def save(self) -> None:
        self.saves += 1


class RankZeroLogger(AllRankLogger):
    """``AllRankLogger`` whose ``log_metrics`` is decorated with ``rank_zero_only`` (a no-op on rank > 0)."""

    @pl.utilities.rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        super().log_metrics(metrics, step)


def validate_with_logger(info: RankInfo, n: int, batch_size: int, logs: list, rank_zero: bool = False) -> dict:
    """Scenario: ``trainer.validate`` a ``ValidationProbe(logs)`` over ``IdDataset(n)`` with an
    ``AllRankLogger`` (``RankZeroLogger`` when ``rank_zero``) as the Trainer's only logger.

    Record keys: ``calls`` (the logger's ``log_metrics`` calls), ``saves`` (its ``save()`` calls).
    """
    logger = RankZeroLogger() if rank_zero else AllRankLogger()
    trainer = ddp_trainer(info, logger=logger)
    trainer.validate(ValidationProbe(logs=logs), dataloaders=id_loader(n, batch_size), verbose=False)
    return {"calls": logger.calls, "saves": logger.saves}


class PlainFitProbe(pl.LightningModule):
    """``Linear(2, 1)`` trained with SGD on the MSE over ``RegressionDataset``; validates without logging."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(-1), batch["y"])

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class EpochValueProbe(PlainFitProbe):
    """``PlainFitProbe`` that logs ``"v"`` = ``10 - current_epoch`` with ``sync_dist=True`` in every
    ``validation_step``."""

    def validation_step(self, batch, batch_idx):
        self.log("v", 10.0 - self.current_epoch, sync_dist=True, batch_size=len(batch["id"]))


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


def early_stopping_messages(info: RankInfo, epochs: int, log_rank_zero_only: bool) -> dict:
    """Scenario: ``trainer.fit`` an ``EpochValueProbe`` for ``epochs`` epochs with
    ``EarlyStopping(monitor="v", mode="min", verbose=True, log_rank_zero_only=...)``.

    Record keys: ``messages`` (what the ``pytorch_lightning.callbacks.early_stopping`` logger emitted on
    this rank, in order).
    """
    kept = _Kept()
    logger = logging.getLogger(pl.callbacks.early_stopping.__name__)
    logger.addHandler(kept)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        stopping = pl.callbacks.EarlyStopping(
            monitor="v", mode="min", verbose=True, log_rank_zero_only=log_rank_zero_only
        )
        trainer = ddp_trainer(info, max_epochs=epochs, callbacks=[stopping], num_sanity_val_steps=0)
        trainer.fit(
            EpochValueProbe(), train_dataloaders=regression_loader(4, 2), val_dataloaders=regression_loader(4, 2)
        )
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
    return {"messages": kept.messages}


def fit_with_progress_bar(info: RankInfo, n: int, val_n: int, batch_size: int) -> dict:
    """Scenario: one epoch of ``trainer.fit`` a ``PlainFitProbe`` with the default ``TQDMProgressBar``.

    Record keys: ``disabled`` (the bar's ``is_disabled``), ``total_train_batches``, ``total_val_batches``
    (its totals once fit ended).
    """
    trainer = ddp_trainer(info, max_epochs=1, enable_progress_bar=True, num_sanity_val_steps=0)
    trainer.fit(
        PlainFitProbe(),
        train_dataloaders=regression_loader(n, batch_size),
        val_dataloaders=regression_loader(val_n, batch_size),
    )
    bar = trainer.progress_bar_callback
    return {
        "disabled": bar.is_disabled,
        "total_train_batches": bar.total_train_batches,
        "total_val_batches": bar.total_val_batches,
    }


def fit_with_profiler(info: RankInfo, n: int, batch_size: int) -> dict:
    """Scenario: one epoch of ``trainer.fit`` a ``PlainFitProbe`` with
    ``SimpleProfiler(dirpath=".", filename="perf")``: the profile lands in the rank's working directory.

    Record keys: ``global_rank``, ``local_rank`` (the Trainer's).
    """
    profiler = pl.profilers.SimpleProfiler(dirpath=".", filename="perf")
    trainer = ddp_trainer(info, max_epochs=1, profiler=profiler, limit_val_batches=0)
    trainer.fit(PlainFitProbe(), train_dataloaders=regression_loader(n, batch_size))
    return {"global_rank": trainer.global_rank, "local_rank": trainer.local_rank}
