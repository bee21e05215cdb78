"""F1 over the validation set done right under DDP: torchmetrics objects passed to ``self.log``.

``BinaryF1Score``, ``BinaryPrecision`` and ``BinaryRecall`` keep true/false positive and false negative
counts; ``self.log("val_f1", self.val_f1)`` makes Lightning call ``compute()`` at epoch end, which
sums the counts over ranks first (torchmetrics/metric.py ``Metric.sync``), so every rank gets the F1
of the whole set and no ``sync_dist`` is needed. ``self.print`` prints on rank 0 only.

``python -m ddpprobe audit examples.corrected_f1_module:make_model --data examples.corrected_f1_module:make_data``
passes (exit code 0) because N=12 divides by the world size (2, 3, 4, 6). With N not divisible by W,
``DistributedSampler`` pads the set with ``ceil(N/W)*W - N`` repeated samples, which the counts then
include: the audit flags that as "synced, differs from single-process" with the padding named as the
cause (drop duplicates by sample id, or use a set whose size divides by W, to fix it).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader
from torchmetrics.classification import BinaryF1Score, BinaryPrecision, BinaryRecall

from ddpprobe._lightning import pl  # pytorch_lightning, or lightning.pytorch if ddpprobe runs that: runs under both
from ddpprobe.probes.data import IdDataset

#: Samples in the validation set (divisible by 2, 3, 4 and 6, so the sampler adds no padding) and batch size.
N_SAMPLES = 12
BATCH_SIZE = 3


class CorrectedF1Module(pl.LightningModule):
    """F1, precision and recall over the whole validation set, synced by torchmetrics."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(2, 1)  # DDP needs parameters; predictions come from the data
        self.val_f1 = BinaryF1Score()
        self.val_precision = BinaryPrecision()
        self.val_recall = BinaryRecall()

    def validation_step(self, batch, batch_idx):
        preds, target = batch["pred"], batch["target"]
        for metric in (self.val_f1, self.val_precision, self.val_recall):
            metric.update(preds, target)
        self.log("val_f1", self.val_f1, batch_size=len(preds))
        self.log("val_precision", self.val_precision, batch_size=len(preds))
        self.log("val_recall", self.val_recall, batch_size=len(preds))

    def on_validation_epoch_end(self):
        self.print(f"epoch {self.current_epoch}: validation done")


def make_model() -> CorrectedF1Module:
    return CorrectedF1Module()


def make_data() -> DataLoader:
    """The validation loader: ``IdDataset(12)`` in order, batches of 3."""
    return DataLoader(IdDataset(N_SAMPLES), batch_size=BATCH_SIZE)
