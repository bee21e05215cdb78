"""F1 over the validation set, written the way the seed question writes it, with its DDP mistakes.

The model's predictions are ``IdDataset``'s fixed ``pred`` field (a stand-in for a classifier's output,
so the numbers are reproducible); ``target`` is the label. What the module does:

- ``validation_step`` keeps its rank's predictions and targets in a list, and logs the F1 of the
  batch with ``sync_dist=True`` (``val_f1_batch``): Lightning averages the batch F1s over batches and
  ranks, which is not the F1 of the set, because F1 is not decomposable.
- ``on_validation_epoch_end`` computes F1 from the list (plain torch, no scikit-learn) and logs it
  with ``self.log("val_f1", f1)``, no ``sync_dist``: under DDP the list holds this rank's shard only,
  so each rank logs a different F1 and the logger writes rank 0's. It also writes the F1 straight
  to ``self.logger.experiment`` (a no-op on every rank but 0) and prints it (once per rank).
- It defines ``validation_step_end``, which Lightning 2.x never calls.

``python -m ddpprobe audit examples.seed_f1_module:make_model --data examples.seed_f1_module:make_data``
flags ``val_f1`` as rank-divergent and ``val_f1_batch`` as differing from single-process (exit code 1).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl  # pytorch_lightning, or lightning.pytorch if ddpprobe runs that: runs under both
from ddpprobe.probes.data import IdDataset

#: Samples in the validation set and the batch size.
N_SAMPLES = 12
BATCH_SIZE = 3


def f1_from_tensors(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Binary F1 ``2TP / (2TP + FP + FN)`` of 0/1 tensors of equal shape (0.0 when TP is 0), float32 scalar."""
    tp = ((preds == 1) & (target == 1)).sum()
    fp = ((preds == 1) & (target == 0)).sum()
    fn = ((preds == 0) & (target == 1)).sum()
    return (2 * tp / (2 * tp + fp + fn)).float() if tp > 0 else torch.tensor(0.0)


class SeedF1Module(pl.LightningModule):
    """The seed question's module: F1 from rank-local outputs, logged without ``sync_dist``."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(2, 1)  # DDP needs parameters; predictions come from the data
        self.val_preds, self.val_targets = [], []

    def validation_step(self, batch, batch_idx):
        preds, target = batch["pred"], batch["target"]
        self.val_preds.append(preds)
        self.val_targets.append(target)
        self.log("val_f1_batch", f1_from_tensors(preds, target), sync_dist=True, batch_size=len(preds))
        return {"preds": preds, "target": target}

    def validation_step_end(self, outputs):  # Lightning 1.x hook: never called in 2.x
        return outputs

    def on_validation_epoch_end(self):
        preds, target = torch.cat(self.val_preds), torch.cat(self.val_targets)
        f1 = f1_from_tensors(preds, target)
        self.log("val_f1", f1)
        if self.logger is not None:
            self.logger.experiment.add_scalar("val_f1_epoch", float(f1), self.current_epoch)
        print(f"epoch {self.current_epoch}: val F1 = {float(f1):.4f}")
        self.val_preds.clear()
        self.val_targets.clear()


def make_model() -> SeedF1Module:
    return SeedF1Module()


def make_data() -> DataLoader:
    """The validation loader: ``IdDataset(12)`` in order, batches of 3."""
    return DataLoader(IdDataset(N_SAMPLES), batch_size=BATCH_SIZE)
