"""Per-label F1, precision and recall at the best threshold, written the way the original question does.

The original question has several label columns and, per column, computes F1, precision and recall at the
threshold that gives the best F1 on the validation set, then writes each with
``self.logger.experiment.add_scalar`` and prints it. Under DDP each rank's ``on_validation_epoch_end`` sees
only the outputs its own ``validation_step`` collected (its shard, padded by ``DistributedSampler``), so each
rank chooses its own threshold on its own shard; ``logger.experiment`` is a no-op on every rank but 0, so
the logger gets rank 0's numbers; every rank prints its own.

The "model" is the data: sample ``i`` carries fixed scores and labels (ddpprobe/probes/multilabel.py
``sample_scores``/``sample_labels``), so the numbers are reproducible. The facts behind this example are in
tests/facts/test_multilabel_best_threshold_f1.py; the corrected version is
examples/multilabel_corrected_module.py.

``M=examples.multilabel_original_module; python -m ddpprobe audit $M:make_model --data $M:make_data``
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import precision_recall_curve
from torch.utils.data import DataLoader, Dataset

from ddpprobe._lightning import pl  # pytorch_lightning, or lightning.pytorch if ddpprobe runs that: runs under both
from ddpprobe.probes.multilabel import NUM_LABELS, sample_labels, sample_scores

#: Samples in the validation set (not divisible by 2: the sampler pads) and the batch size.
N_SAMPLES = 11
BATCH_SIZE = 3


class MultilabelScores(Dataset):
    """Item ``i``: ``{"id": i, "scores": (NUM_LABELS,) float32, "labels": (NUM_LABELS,) int64}`` (this module
    ignores ``id``; the corrected one uses it to drop the sampler's padding duplicates)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {
            "id": torch.tensor(i),
            "scores": torch.tensor(sample_scores(i)),
            "labels": torch.tensor(sample_labels(i)),
        }


def best_threshold_metrics(labels: np.ndarray, scores: np.ndarray) -> dict:
    """F1, precision, recall and threshold at the best-F1 point of scikit-learn's precision-recall curve."""
    precision, recall, thresholds = precision_recall_curve(labels, scores)
    precision, recall = precision[:-1], recall[:-1]
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(total), where=total > 0)
    k = int(np.argmax(f1))
    return {"f1": f1[k], "precision": precision[k], "recall": recall[k], "threshold": thresholds[k]}


class OriginalMultilabelModule(pl.LightningModule):
    """Best-threshold metrics per label from rank-local outputs, written to ``logger.experiment`` and printed."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(NUM_LABELS, NUM_LABELS)  # DDP needs parameters; scores come from the data
        self.outputs = []

    def validation_step(self, batch, batch_idx):
        self.outputs.append((batch["scores"], batch["labels"]))

    def on_validation_epoch_end(self):
        scores = torch.cat([s for s, _ in self.outputs]).numpy()
        labels = torch.cat([y for _, y in self.outputs]).numpy()
        for k in range(NUM_LABELS):
            metrics = best_threshold_metrics(labels[:, k], scores[:, k])
            for name in ("f1", "precision", "recall"):
                if self.logger is not None:
                    self.logger.experiment.add_scalar(f"val_{name}_{k}", float(metrics[name]), self.current_epoch)
            print(f"label {k}: F1 {metrics['f1']:.4f} at threshold {metrics['threshold']:.4f}")
        self.outputs.clear()


def make_model() -> OriginalMultilabelModule:
    return OriginalMultilabelModule()


def make_data() -> DataLoader:
    """The validation loader: ``MultilabelScores(11)`` in order, batches of 3."""
    return DataLoader(MultilabelScores(N_SAMPLES), batch_size=BATCH_SIZE)
