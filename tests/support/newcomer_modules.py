"""A new user's module, written from the README without reading ddpprobe's code, and the variants the user
tried after reading the audit's and the guard's reports: the modules under test of
tests/tooling/audit/test_audit_newcomer.py. The classes are copied as the user wrote them; only the module
layout is joined into one file (each variant's factory below), and ``pl`` is the package ddpprobe runs where the
user wrote ``import pytorch_lightning as pl``, so the same module is audited under either Lightning package.

- ``MyClassifier`` (``make_model``, ``make_data``: 64 training samples, batch 8; 101 validation samples,
  batch 10): ``train_loss`` logged ``on_epoch=True, sync_dist=True``; ``val_acc_batch`` logged with
  ``sync_dist=False``; ``val_f1`` computed by hand from rank-local lists in ``on_validation_epoch_end``; a
  plain ``print``; in ``on_train_epoch_end`` rank 0 alone reads ``trainer.callback_metrics`` and calls
  ``trainer.strategy.reduce``.
- ``make_data_n100``: the same with 100 validation samples (a size the world size divides).
- ``MyClassifierFix1`` (``make_model_fix1``): the ``strategy.reduce`` moved out of the branch, the read still
  on rank 0 only.
- ``MyClassifierFixed`` (``make_model_fix2``): torchmetrics objects, the read and the reduce on every rank,
  ``self.print``.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import BinaryAccuracy, BinaryF1Score

from ddpprobe._lightning import pl


def _synthetic(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.linspace(-1, 1, 8)
    y = ((x @ w + 0.5 * torch.randn(n, generator=g)) > 0).long()
    return TensorDataset(x, y)


class MyClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.val_preds = []
        self.val_targets = []

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self(x), y.float())
        self.log("train_loss", loss, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        preds = (self(x) > 0).long()
        acc = (preds == y).float().mean()
        self.log("val_acc_batch", acc, sync_dist=False)
        self.val_preds.append(preds)
        self.val_targets.append(y)

    def on_validation_epoch_end(self):
        preds = torch.cat(self.val_preds)
        target = torch.cat(self.val_targets)
        tp = ((preds == 1) & (target == 1)).sum().item()
        fp = ((preds == 1) & (target == 0)).sum().item()
        fn = ((preds == 0) & (target == 1)).sum().item()
        f1 = 2 * tp / max(2 * tp + fp + fn, 1)
        self.log("val_f1", f1)
        print(f"val F1 {f1:.4f}")
        self.val_preds.clear()
        self.val_targets.clear()

    def on_train_epoch_end(self):
        if self.global_rank == 0:
            loss = self.trainer.callback_metrics["train_loss"]
            mean_loss = self.trainer.strategy.reduce(loss, reduce_op="mean")
            self.print(f"epoch {self.current_epoch} train_loss {mean_loss.item():.4f}")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class MyClassifierFix1(MyClassifier):
    def on_train_epoch_end(self):
        if self.global_rank == 0:
            loss = self.trainer.callback_metrics["train_loss"]
        else:
            loss = torch.tensor(0.0)
        mean_loss = self.trainer.strategy.reduce(loss, reduce_op="mean")  # audit's fix: collective on every rank
        if self.global_rank == 0:
            self.print(f"epoch {self.current_epoch} train_loss {mean_loss.item():.4f}")


class MyClassifierFixed(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.val_acc = BinaryAccuracy()
        self.val_f1 = BinaryF1Score()

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self(x), y.float())
        self.log("train_loss", loss, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        preds = (self(x) > 0).long()
        self.val_acc.update(preds, y)
        self.val_f1.update(preds, y)
        self.log("val_acc", self.val_acc, batch_size=len(y))
        self.log("val_f1", self.val_f1, batch_size=len(y))

    def on_validation_epoch_end(self):
        self.print("validation epoch done")

    def on_train_epoch_end(self):
        loss = self.trainer.callback_metrics["train_loss"]  # read on every rank, then branch
        mean_loss = self.trainer.strategy.reduce(loss.clone(), reduce_op="mean")
        if self.global_rank == 0:
            self.print(f"epoch {self.current_epoch} train_loss {mean_loss.item():.4f}")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_model():
    torch.manual_seed(0)
    return MyClassifier()


def make_model_fix1():
    torch.manual_seed(0)
    return MyClassifierFix1()


def make_model_fix2():
    torch.manual_seed(0)
    return MyClassifierFixed()


def make_data():
    return {
        "train": DataLoader(_synthetic(64, 1), batch_size=8),
        "val": DataLoader(_synthetic(101, 2), batch_size=10),
    }


def make_data_n100():
    return {"train": DataLoader(_synthetic(64, 1), batch_size=8), "val": DataLoader(_synthetic(100, 2), batch_size=10)}
