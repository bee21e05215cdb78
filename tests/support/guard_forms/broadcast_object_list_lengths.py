"""``dist.broadcast_object_list`` of the class names from rank 0, the other ranks passing a list of another
length: the objects of the others' surplus places are never sent (or rank 0's are dropped)."""

import torch.distributed as dist

from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader


class LitClassifier(_plain.LitClassifier):
    def on_train_start(self):
        names = ["negative", "positive"] if self.global_rank == 0 else [None]
        dist.broadcast_object_list(names, src=0)
        self.class_names = names


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader())
    return {}
