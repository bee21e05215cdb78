"""``self.log("val_acc", ..., sync_dist=True)`` under ``if self.trainer.is_global_zero:`` in
``on_validation_epoch_end``: the key's sync on rank 0 only (tests/facts/test_collectives.py)."""

import torch

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms._data import loader


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)
        self.correct = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.correct.append((self.net(x).argmax(dim=-1) == y).float())

    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            self.log("val_acc", torch.cat(self.correct).mean(), sync_dist=True)
        self.correct.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader(), val_dataloaders=loader())
    return {}
