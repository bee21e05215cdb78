"""A module written from the README as a new user would write it: a classifier with a torchmetrics
``Accuracy``, the loss logged with ``sync_dist=True``, and the validation accuracy printed by rank 0 at the
epoch's end (``compute()`` under ``if self.trainer.is_global_zero``, the hazard of
tests/facts/test_collective_hazards_torchmetrics.py), run with the README's ``CollectiveGuard()``."""

import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from ddpprobe._lightning import pl
from ddpprobe.probes.common import ddp_trainer


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)
        self.accuracy = torchmetrics.classification.Accuracy(task="multiclass", num_classes=2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.accuracy.update(self.net(x).argmax(dim=-1), y)

    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            print(f"validation accuracy: {self.accuracy.compute():.3f}")
        self.accuracy.reset()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4)


def fit(info) -> dict:
    """Scenario: ``trainer.fit`` one epoch of ``LitClassifier`` with ``CollectiveGuard()`` (timeout: half the
    world's process-group timeout). Record: ``{}``."""
    from ddpprobe.guard import CollectiveGuard

    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=info.pg_timeout / 2)])
    trainer.fit(LitClassifier(), train_dataloaders=_loader(), val_dataloaders=_loader())
    return {}
