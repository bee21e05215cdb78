"""``print(self.val_acc.compute())`` under ``if self.global_rank == 1:`` in ``on_validation_epoch_end``: the metric's
state sync on rank 1 only. Rank 0, the rank that prints an uncaught guard error, is in Lightning's own barrier
after the sanity check then, so the only line of the user's code on its stack is the script's ``trainer.fit``; the
collective that parts the ranks is rank 1's ``compute()``."""

import torch
import torchmetrics

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms._data import loader


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)
        self.val_acc = torchmetrics.classification.Accuracy(task="multiclass", num_classes=2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_acc.update(self.net(x).argmax(dim=-1), y)

    def on_validation_epoch_end(self):
        if self.global_rank == 1:
            print(f"val acc {self.val_acc.compute():.3f}")
        self.val_acc.reset()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader(), val_dataloaders=loader())
    return {}
