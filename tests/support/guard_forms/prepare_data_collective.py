"""``prepare_data`` (run by Lightning on local rank 0 only, the other ranks waiting in its barrier without a
timeout, pytorch_lightning/trainer/connectors/data_connector.py) that also makes a collective: a barrier
"so every rank sees the downloaded file". Rank 0 is alone in it."""

import torch.distributed as dist

from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain
from tests.support.guard_forms._data import loader


class LitClassifier(_plain.LitClassifier):
    def prepare_data(self):
        dist.barrier()  # wait until the data is there


class FixedLitClassifier(_plain.LitClassifier):
    def prepare_data(self):
        pass  # Lightning's own barrier after prepare_data already makes the other ranks wait


def train(info, guard_timeout: float = 3.0, barrier: bool = True) -> dict:
    guard = CollectiveGuard(timeout=guard_timeout)
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[guard])
    trainer.fit(LitClassifier() if barrier else FixedLitClassifier(), train_dataloaders=loader())
    return {"checks": guard.checks}
