"""A learning-rate drop written as a ``@rank_zero_only`` helper: at the start of epoch 1 rank 0 halves its rate and
the other ranks keep theirs. No collective differs: DDP averages the gradients, then each rank applies them with
its own rate, and the weights part from the first step of epoch 1. 32 samples in batches of 4: at W = 2, 4 batches
a rank and epoch, so epoch 1's first optimizer step is step 5."""

import torch

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader


@pl.utilities.rank_zero_only
def halve(optimizer) -> None:
    for group in optimizer.param_groups:
        group["lr"] /= 2


class LitClassifier(_plain.LitClassifier):
    def on_train_epoch_start(self):
        if self.current_epoch == 1:
            halve(self.optimizers().optimizer)


def train(info, guard_timeout: float = 5.0) -> dict:
    torch.manual_seed(0)
    trainer = ddp_trainer(info, max_epochs=3, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader())
    return {"global_step": trainer.global_step}
