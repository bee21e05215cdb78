"""A Metric logged as an object (``self.log("val_acc", self.val_acc)`` in ``validation_step``) and also printed on
rank 0 only: ``print(self.val_acc.compute())`` under ``if self.trainer.is_global_zero:`` in
``on_validation_epoch_end``, then ``reset()`` on every rank. Lightning's default sanity check runs the validation
loop first (``num_sanity_val_steps`` left at 2): rank 0's ``compute()`` syncs the states while the other ranks' next
collective is Lightning's epoch sync of the logged Metric after the hook (pytorch_lightning/loops/evaluation_loop.py
``_on_evaluation_epoch_end``), so rank 0 makes one state sync more than the others
(tests/facts/test_collective_hazards_torchmetrics.py)."""

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
        self.log("val_acc", self.val_acc)

    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            print(f"val acc {self.val_acc.compute():.3f}")
        self.val_acc.reset()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader(), val_dataloaders=loader())
    return {}
