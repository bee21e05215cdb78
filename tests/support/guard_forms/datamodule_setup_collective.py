"""A ``LightningDataModule`` whose ``setup`` counts the samples over the ranks with ``dist.all_reduce`` on
rank 0 only (``if self.trainer.is_global_zero``): Lightning runs the datamodule's ``setup`` before any
callback's ``setup`` (pytorch_lightning/trainer/call.py ``_call_setup_hook``), so a guard that attached there
saw nothing; checked from the Trainer's first collective on, rank 0's all_reduce meets the other ranks' next
collective, Lightning's ``post_setup`` barrier."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms._plain import LitClassifier


class CountedData(pl.LightningDataModule):
    def setup(self, stage):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=generator)
        self.data = TensorDataset(x, (x[:, 0] > 0).long())
        if self.trainer.is_global_zero:
            total = torch.tensor([len(self.data)])
            dist.all_reduce(total)
            print(f"{int(total)} samples over the ranks")

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=4)


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), datamodule=CountedData())
    return {}
