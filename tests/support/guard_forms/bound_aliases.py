"""The user's collectives through names bound before the guard attached: ``from torch.distributed import
all_reduce`` at the top of the script and ``torch.distributed.distributed_c10d.all_reduce``, each on rank 0
only in ``on_train_epoch_end``: without the guard rank 0 is alone in the all_reduce."""

import torch
from torch.distributed import all_reduce, distributed_c10d

from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader


class LitClassifier(_plain.LitClassifier):
    def __init__(self, alias: str):
        super().__init__()
        self.alias = alias

    def on_train_epoch_end(self):
        if self.global_rank == 0:
            total = torch.tensor([1.0])
            if self.alias == "from_import":
                all_reduce(total)
            else:
                distributed_c10d.all_reduce(total)


def train(info, alias: str, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(alias), train_dataloaders=loader())
    return {}
