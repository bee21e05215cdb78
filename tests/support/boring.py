"""Lightning's ``BoringModel`` and ``RandomDataset`` (pytorch_lightning/demos/boring_classes.py, 2.6), written
out here on the chosen Lightning package, so the tests that start from "the module Lightning's own tests use"
run the same module on every release of the version matrix and with either package.

Lightning's copy cannot serve there: on 2.0 and 2.1 ``import pytorch_lightning.demos.boring_classes`` runs
``demos/__init__.py``, which imports ``demos/transformer.py`` and with it ``requests``, a package those
releases do not depend on (from 2.2 it is imported inside the function that downloads); 1.9's
``BoringModel.loss`` takes ``(batch, preds)`` where 2.x takes ``(preds, labels)``; and
``pytorch_lightning.demos`` is not there at all when only the unified ``lightning`` package is installed.

Same layers, loss, optimizer and data as Lightning's: ``Linear(32, 2)``, the mean squared error to ones,
``SGD(lr=0.1)`` with a ``StepLR``, and ``DataLoader(RandomDataset(32, 64))`` (batch size 1) for every stage.
"""

import torch
from torch.utils.data import DataLoader, Dataset

from ddpprobe._lightning import pl


class RandomDataset(Dataset):
    """``length`` samples of ``size`` standard normal floats, drawn when the dataset is made."""

    def __init__(self, size: int, length: int):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class BoringModel(pl.LightningModule):
    """Lightning's ``BoringModel``: subclass it and override what a test is about."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def loss(self, preds: torch.Tensor, labels=None) -> torch.Tensor:
        if labels is None:
            labels = torch.ones_like(preds)
        return torch.nn.functional.mse_loss(preds, labels)

    def step(self, batch) -> torch.Tensor:
        return self.loss(self(batch))

    def training_step(self, batch, batch_idx):
        return {"loss": self.step(batch)}

    def validation_step(self, batch, batch_idx):
        return {"x": self.step(batch)}

    def test_step(self, batch, batch_idx):
        return {"y": self.step(batch)}

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return [optimizer], [lr_scheduler]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))
