"""The metric-checkpoint probe: a torchmetrics metric with ``persistent(True)`` saved by ``ModelCheckpoint``
during a DDP ``fit``, then loaded by ``trainer.validate(ckpt_path=...)`` in a new DDP world.

``CheckpointedSumProbe`` holds ``self.total = SumMetric()`` with ``self.total.persistent(True)``, so its
state (``sum_value``) is part of the module's ``state_dict``. In ``training_step`` it adds the batch's
summed ``value`` (``id ** 2``) to it; nothing logs it, so nothing resets it. ``ModelCheckpoint`` saves at
the end of the epoch: ``Trainer.save_checkpoint`` builds the checkpoint on every rank
(pytorch_lightning/trainer/connectors/checkpoint_connector.py ``dump_checkpoint``) and writes rank 0's
(``Strategy.save_checkpoint``, global rank 0 only); ``Metric.state_dict`` copies the rank's *local* state,
unsynced (torchmetrics/metric.py ``Metric.state_dict``). A new run loads the file on every rank
(``Strategy.load_checkpoint``, ``Metric._load_from_state_dict``).

With ``fix=True`` the module does what Lightning 1.x did with fault-tolerant training, before 2.0 dropped
the logic (Lightning #12193): ``on_save_checkpoint`` writes the state synced over all ranks
(``Metric.sync``/``unsync``, a collective on every rank), and ``on_load_checkpoint`` drops the metric's
keys on every rank but 0, which keep the metric's defaults.
"""

from __future__ import annotations

import os

import torch
from torchmetrics import SumMetric

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader

#: The checkpoint's file name (without ``.ckpt``) in the scenario's ``ckpt_dir``.
CKPT_NAME = "fit"
#: The metric's state key in the module's ``state_dict``.
STATE_KEY = "total.sum_value"


class CheckpointedSumProbe(pl.LightningModule):
    """``SumMetric`` with ``persistent(True)`` updated with each training batch's summed ``value``; records
    ``train_ids``, ``fit_local_state`` (``total.sum_value`` at the end of the training epoch),
    ``loaded_state`` (``total.sum_value`` at ``on_validation_start``, after a checkpoint was loaded) and
    ``computed`` (``total.compute()`` in ``on_validation_epoch_end``, on every rank)."""

    def __init__(self, fix: bool = False):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.total = SumMetric()
        self.total.persistent(True)
        self.fix = fix
        self.train_ids: list = []
        self.fit_local_state = None
        self.loaded_state = None
        self.computed = None

    def training_step(self, batch, batch_idx):
        self.train_ids.append(batch_ids(batch))
        self.total.update(batch["value"].sum())
        return self.layer(batch["x"] / 100.0).square().mean()

    def on_train_epoch_end(self):
        self.fit_local_state = float(self.total.sum_value)

    def on_save_checkpoint(self, checkpoint):
        if self.fix:
            self.total.sync()
            checkpoint["state_dict"][STATE_KEY] = self.total.sum_value.detach().clone()
            self.total.unsync()

    def on_load_checkpoint(self, checkpoint):
        if self.fix and self.global_rank != 0:
            checkpoint["state_dict"].pop(STATE_KEY, None)

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_start(self):
        self.loaded_state = float(self.total.sum_value)

    def on_validation_epoch_end(self):
        self.computed = float(self.total.compute())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_and_checkpoint(info: RankInfo, ckpt_dir: str, fix: bool = False, n: int = 10, batch_size: int = 2) -> dict:
    """Scenario: one epoch of ``trainer.fit(CheckpointedSumProbe(fix))`` over ``IdDataset(n)`` with
    ``ModelCheckpoint(dirpath=ckpt_dir, filename=CKPT_NAME)``.

    Record keys: ``train_ids``, ``fit_local_state`` (this rank's ``sum_value`` at the end of the epoch),
    ``saved_state`` (``state_dict[STATE_KEY]`` in the file rank 0 wrote, read by every rank after ``fit``).
    """
    model = CheckpointedSumProbe(fix=fix)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename=CKPT_NAME)
    trainer = ddp_trainer(info, max_epochs=1, enable_checkpointing=True, callbacks=[checkpoint])
    trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
    path = os.path.join(ckpt_dir, CKPT_NAME + ".ckpt")
    trainer.strategy.barrier()
    saved = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return {
        "train_ids": model.train_ids,
        "fit_local_state": model.fit_local_state,
        "saved_state": float(saved[STATE_KEY]),
    }


def load_and_compute(info: RankInfo, ckpt_dir: str, fix: bool = False, n: int = 10, batch_size: int = 2) -> dict:
    """Scenario, in a new world: ``trainer.validate(CheckpointedSumProbe(fix), ckpt_path=...)`` of the file
    ``fit_and_checkpoint`` wrote; ``validation_step`` does not touch the metric.

    Record keys: ``loaded_state`` (this rank's ``sum_value`` after the checkpoint was loaded),
    ``computed`` (``compute()`` on every rank at the end of validation).
    """
    model = CheckpointedSumProbe(fix=fix)
    path = os.path.join(ckpt_dir, CKPT_NAME + ".ckpt")
    ddp_trainer(info).validate(model, dataloaders=id_loader(n, batch_size), ckpt_path=path, verbose=False)
    return {"loaded_state": model.loaded_state, "computed": model.computed}
