"""``dist.all_to_all`` whose input lists agree in their first tensor but not in their second (rank 1 sends
float64 there): the check of one tensor per list let it through."""

import torch
import torch.distributed as dist

from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader


class LitClassifier(_plain.LitClassifier):
    def on_train_epoch_end(self):
        world = self.trainer.world_size
        dtype = torch.float64 if self.global_rank == 1 else torch.float32
        sent = [torch.zeros(2)] + [torch.zeros(2, dtype=dtype) for _ in range(world - 1)]
        received = [torch.empty(2) for _ in range(world)]
        dist.all_to_all(received, sent)


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader())
    return {}
