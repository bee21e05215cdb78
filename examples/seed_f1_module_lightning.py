"""The seed question's F1 module (``examples/seed_f1_module.py``) written with the unified ``lightning``
package: ``import lightning as L`` and ``L.LightningModule``, as the Lightning docs write it.

``M=examples.seed_f1_module_lightning; python -m ddpprobe audit $M:make_model --data $M:make_data``
reads the package from the module's base class and runs ``lightning.pytorch``'s Trainer; its verdicts
are those of the ``pytorch_lightning`` version (tests/tooling/audit/test_audit_lightning.py checks that).
Needs ``pip install lightning`` (the ``lightning`` extra of this project).
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from ddpprobe.probes.data import IdDataset

#: Samples in the validation set and the batch size (as in examples/seed_f1_module.py).
N_SAMPLES = 12
BATCH_SIZE = 3


def f1_from_tensors(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Binary F1 ``2TP / (2TP + FP + FN)`` of 0/1 tensors of equal shape (0.0 when TP is 0), float32 scalar."""
    tp = ((preds == 1) & (target == 1)).sum()
    fp = ((preds == 1) & (target == 0)).sum()
    fn = ((preds == 0) & (target == 1)).sum()
    return (2 * tp / (2 * tp + fp + fn)).float() if tp > 0 else torch.tensor(0.0)


class SeedF1Module(L.LightningModule):
    """F1 from rank-local outputs logged without ``sync_dist``, a per-batch F1 with ``sync_dist=True``,
    a direct ``logger.experiment`` write, a ``print``, and the removed ``validation_step_end`` hook."""

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
