"""Per-label F1, precision and recall at the best threshold over the *whole* validation set under DDP.

The corrected version of examples/multilabel_original_module.py. In ``on_validation_epoch_end`` every rank
gathers the scores, labels and sample ids of all ranks (``self.all_gather``: every rank holds all N samples,
O(N·W) memory, see benchmarks/memory.md), drops the duplicates ``DistributedSampler`` padding added (the same
sample id twice), and chooses each label's threshold on that set: the single-process numbers, identical on
every rank. It logs them with ``self.log`` on every rank (the logger, on rank 0, gets the same numbers) and
prints once with ``self.print``. Proven by tests/facts/test_multilabel_best_threshold_f1.py (recipe ``e``).

A torchmetrics ``MultilabelPrecisionRecallCurve(thresholds=None)`` gives the same threshold on the padded set
(recipe ``d``), which differs when N does not divide by W; ``thresholds=<grid>`` keeps memory constant but can
only choose grid points (recipe ``g``).

``M=examples.multilabel_corrected_module; python -m ddpprobe audit $M:make_model --data $M:make_data``
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl  # pytorch_lightning, or lightning.pytorch if ddpprobe runs that: runs under both
from ddpprobe.probes.multilabel import NUM_LABELS
from examples.multilabel_original_module import BATCH_SIZE, N_SAMPLES, MultilabelScores, best_threshold_metrics


class CorrectedMultilabelModule(pl.LightningModule):
    """Best-threshold metrics per label on the gathered, de-duplicated set; logged with ``self.log``."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(NUM_LABELS, NUM_LABELS)
        self.outputs = []

    def validation_step(self, batch, batch_idx):
        self.outputs.append((batch["id"], batch["scores"], batch["labels"]))

    def on_validation_epoch_end(self):
        ids = self.all_gather(torch.cat([i for i, _, _ in self.outputs])).reshape(-1)
        scores = self.all_gather(torch.cat([s for _, s, _ in self.outputs])).reshape(-1, NUM_LABELS)
        labels = self.all_gather(torch.cat([y for _, _, y in self.outputs])).reshape(-1, NUM_LABELS)
        first = {}
        for position, sample_id in enumerate(ids.tolist()):
            first.setdefault(sample_id, position)  # drop the sampler's padding duplicates
        keep = torch.tensor(sorted(first.values()))
        scores, labels = scores[keep].cpu().numpy(), labels[keep].cpu().numpy()
        for k in range(NUM_LABELS):
            metrics = best_threshold_metrics(labels[:, k], scores[:, k])
            for name in ("f1", "precision", "recall"):
                # The same number on every rank already: no sync_dist needed (it would average equal numbers).
                self.log(f"val_{name}_{k}", float(metrics[name]))
            self.print(f"label {k}: F1 {metrics['f1']:.4f} at threshold {metrics['threshold']:.4f}")
        self.outputs.clear()


def make_model() -> CorrectedMultilabelModule:
    return CorrectedMultilabelModule()


def make_data() -> DataLoader:
    """The validation loader: ``MultilabelScores(11)`` in order, batches of 3."""
    return DataLoader(MultilabelScores(N_SAMPLES), batch_size=BATCH_SIZE)
