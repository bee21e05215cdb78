"""The gradient-accumulation probe: a value logged at step and epoch level while
``Trainer(accumulate_grad_batches=k)`` steps the optimizer every ``k`` micro-batches, written by a
``CSVLogger``.

``AccumulationProbe.training_step`` logs ``"v"`` (the batch mean of ``IdDataset``'s ``value``) with
``on_step=True, on_epoch=True, sync_dist=True`` and returns a loss equal to that same batch mean (its
gradient is zero: nothing learns). ``on_train_batch_end`` records what Lightning hands it as
``outputs["loss"]``. Sources: pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py
``update_train_step_metrics`` (returns early while ``fit_loop._should_accumulate()``), ``log_metrics`` (the
step written is ``epoch_loop._batches_that_stepped``); pytorch_lightning/loops/optimization/automatic.py
``ClosureResult.from_training_step_output`` (divides the loss by ``accumulate_grad_batches``);
pytorch_lightning/loops/training_epoch_loop.py ``_should_accumulate`` (the last batch of an epoch always
steps); pytorch_lightning/loops/fit_loop.py ``on_advance_end`` (the epoch row is written at the last step).
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader

#: The key ``AccumulationProbe`` logs; the logger sees ``v_step`` and ``v_epoch``.
LOGGED = "v"


class AccumulationProbe(pl.LightningModule):
    """Logs the batch mean of ``value`` as ``"v"`` (step and epoch, synced) and returns it as the loss."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.ids: list = []
        self.outputs_loss: list = []
        self.global_steps: list = []

    def training_step(self, batch, batch_idx):
        self.ids.append(batch_ids(batch))
        mean = batch["value"].mean()
        self.log(LOGGED, mean, on_step=True, on_epoch=True, sync_dist=True, batch_size=len(batch["id"]))
        return mean + self.layer(batch["x"]).sum() * 0.0

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.outputs_loss.append(float(outputs["loss"]))
        self.global_steps.append(self.trainer.global_step)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def accumulate_and_log(info: RankInfo, n: int, batch_size: int, accumulate_grad_batches: int) -> dict:
    """Scenario: fit ``AccumulationProbe`` for one epoch over ``IdDataset(n)`` (no validation) with
    ``accumulate_grad_batches``, ``log_every_n_steps=1`` and ``CSVLogger(save_dir=".")`` (the rank's folder;
    rank 0 writes ``lightning_logs/version_0/metrics.csv``).

    Record keys: ``ids`` (per micro-batch, the sample ids), ``outputs_loss`` (per micro-batch,
    ``float(outputs["loss"])`` in ``on_train_batch_end``), ``global_steps`` (``trainer.global_step`` there),
    ``optimizer_steps`` (``trainer.global_step`` after ``fit``).
    """
    model = AccumulationProbe()
    trainer = ddp_trainer(
        info,
        max_epochs=1,
        limit_val_batches=0,
        accumulate_grad_batches=accumulate_grad_batches,
        log_every_n_steps=1,
        logger=pl.loggers.CSVLogger(save_dir="."),
    )
    trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
    return {
        "ids": model.ids,
        "outputs_loss": model.outputs_loss,
        "global_steps": model.global_steps,
        "optimizer_steps": trainer.global_step,
    }
