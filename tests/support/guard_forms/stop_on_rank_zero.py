"""A callback that stops training on rank 0 only: ``trainer.should_stop = True`` in its ``on_train_batch_end`` at
batch 1 under ``if trainer.is_global_zero`` ("rank 0 keeps the time budget"). Lightning does not sync
``should_stop`` set by hand (EarlyStopping decides through ``reduce_boolean_decision``): rank 0 would leave the
epoch while the others run their next batch. ``trainer.should_stop`` is the Trainer's, whose sets the guard does not
watch, so it names the hooks that ran since the flag was last equal. The guard comes after the callback in
``callbacks``, so its check at that batch's end sees the flag set."""

import torch

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader


class TimeBudget(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero and batch_idx == 1:
            trainer.should_stop = True


def train(info, guard_timeout: float = 5.0) -> dict:
    torch.manual_seed(0)
    trainer = ddp_trainer(info, max_epochs=2, callbacks=[TimeBudget(), CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(_plain.LitClassifier(), train_dataloaders=loader())
    return {"global_step": trainer.global_step}
