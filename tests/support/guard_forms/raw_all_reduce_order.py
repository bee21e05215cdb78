"""Two ``dist.all_reduce`` calls of the same shape and dtype in ``on_train_epoch_end``, in another order on
rank 1: without the guard each sum is the other's, silently. Compared by call site, they differ."""

import torch
import torch.distributed as dist

from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader


class LitClassifier(_plain.LitClassifier):
    def on_train_epoch_end(self):
        seen, correct = torch.tensor([1.0]), torch.tensor([2.0])
        if self.global_rank == 0:
            dist.all_reduce(seen)
            dist.all_reduce(correct)
        else:
            dist.all_reduce(correct)
            dist.all_reduce(seen)


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader())
    return {}
