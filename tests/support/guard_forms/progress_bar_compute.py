"""``self.train_acc.compute()`` on every rank in ``on_train_epoch_end``, the loss logged ``on_epoch=True,
sync_dist=True`` and the default progress bar on: the bar reads the logged metrics on rank 0 only, before the
module's hook, and that read is the loss's epoch sync (tests/facts/test_hidden_collectives_progress_bar.py)."""

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
        self.train_acc = torchmetrics.classification.Accuracy(task="multiclass", num_classes=2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.train_acc.update(logits.argmax(dim=-1), y)
        self.log("train_loss", loss, on_epoch=True, sync_dist=True)
        return loss

    def on_train_epoch_end(self):
        acc = self.train_acc.compute()
        self.train_acc.reset()
        self.print(f"train acc {acc:.3f}")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(info, guard_timeout: float = 5.0) -> dict:
    trainer = ddp_trainer(
        info, max_epochs=1, enable_progress_bar=True, callbacks=[CollectiveGuard(timeout=guard_timeout)]
    )
    trainer.fit(LitClassifier(), train_dataloaders=loader())
    return {}
