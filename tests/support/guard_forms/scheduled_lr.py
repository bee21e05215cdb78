"""Correct: a learning rate every rank changes alike, through torch's ``StepLR`` that Lightning steps at each epoch's
end (halving 0.1 each epoch), with ``ModelCheckpoint`` writing the optimizer's state, then a second ``trainer.fit``
resuming from that checkpoint for one epoch more (``load_state_dict`` replaces the param groups). The guard watches
the param groups' sets (ddpprobe/guard/_writers.py): the scheduler's writes go through it, and the run must give
the same rates with the guard as without it."""

import os

import torch

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader

#: The rate of the first epoch, its factor per epoch, and the epochs of the first fit.
LR, GAMMA, EPOCHS = 0.1, 0.5, 3


class LitClassifier(_plain.LitClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)]


def train(info, guard: bool = True, guard_timeout: float = 5.0) -> dict:
    torch.manual_seed(0)
    rates = []
    for epochs, resume in ((EPOCHS, None), (EPOCHS + 1, "last")):
        callbacks = [pl.callbacks.ModelCheckpoint(dirpath=os.path.join(info.world_dir, "ckpt"), save_last=True)]
        if guard:
            callbacks.append(CollectiveGuard(timeout=guard_timeout))
        trainer = ddp_trainer(info, max_epochs=epochs, enable_checkpointing=True, callbacks=callbacks)
        ckpt = os.path.join(info.world_dir, "ckpt", "last.ckpt") if resume else None
        trainer.fit(LitClassifier(), train_dataloaders=loader(), ckpt_path=ckpt)
        rates.append(trainer.optimizers[0].param_groups[0]["lr"])
    return {"rates": rates, "global_step": trainer.global_step}
