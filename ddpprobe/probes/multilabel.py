"""The multi-label probe: per-label F1, precision and recall at the threshold that gives the best F1,
computed the ways users do it under DDP.

The original question logs, for each of several label columns, F1, precision and recall at a threshold
*chosen on the data* (the one with the best F1). A threshold chosen on part of the data is a different
threshold, so under DDP the question is which part each recipe chooses it on. ``MultilabelProbe`` has no
model: sample ``i`` carries fixed scores and labels (``sample_scores(i)``, ``sample_labels(i)``), and the
probe logs, per label ``k`` and ``name`` in ``f1``/``precision``/``recall``/``threshold``:

=============  ===========================================================================================
key            how
=============  ===========================================================================================
``a_*``        best threshold on the rank's own outputs in ``on_validation_epoch_end``, logged without
               ``sync_dist`` (the original code): each rank keeps its own shard's numbers
``b_*``        best threshold on each batch, logged with ``sync_dist=True`` (the usual advice): Lightning
               averages the batches' numbers, weighted by batch size, over batches and ranks
``c_*``        ``self.all_gather`` of scores and labels, threshold chosen on the gathered (padded) set
``e_*``        like ``c_`` with the sample ids gathered too and ``DistributedSampler``'s padding duplicates
               dropped: the single-process answer
``d_*``        torchmetrics ``MultilabelPrecisionRecallCurve(thresholds=None)``: its list states (every
               score) are gathered at ``compute()``, so it equals ``c_``
``g_*``        the same metric with a fixed grid (``thresholds=GRID``): constant memory, the best threshold
               is one of the grid's, so the numbers are approximate
=============  ===========================================================================================

Sources: torchmetrics/classification/precision_recall_curve.py ``MultilabelPrecisionRecallCurve`` (list
states when ``thresholds=None``, a ``(len(thresholds), num_labels, 2, 2)`` confusion-matrix state
otherwise); pytorch_lightning/core/module.py ``LightningModule.all_gather``.
"""

from __future__ import annotations

import random

import torch
from torchmetrics.classification import MultilabelPrecisionRecallCurve

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader, recorded_warnings, trainer_metrics

#: Number of label columns.
NUM_LABELS = 3

#: Number of points of the fixed threshold grid of the ``g_`` metric: ``linspace(0, 1, GRID)``.
GRID = 5

#: Fixed scores and labels for 64 samples (a seeded draw, the same in every process and version).
#: Label ``k`` of a sample is 1 with probability 0.4; its score leans towards the label but overlaps.
#: Scores are ``(m + 0.5) / 1000`` for an integer ``m``: never on a grid point, never equal by accident.
_rng = random.Random(20262365)
LABELS = [[1 if _rng.random() < 0.4 else 0 for _ in range(NUM_LABELS)] for _ in range(64)]
SCORES = [[(min(999, int(1000 * (0.3 * y + 0.7 * _rng.random()))) + 0.5) / 1000 for y in row] for row in LABELS]
del _rng

#: The names logged per label, and the prefixes of the recipes (see the module docstring).
NAMES = ("f1", "precision", "recall", "threshold")
RECIPES = ("a", "b", "c", "d", "e", "g")


def sample_scores(sample_id: int) -> list:
    """The ``NUM_LABELS`` scores in (0, 1) of sample ``sample_id``."""
    return SCORES[sample_id % len(SCORES)]


def sample_labels(sample_id: int) -> list:
    """The ``NUM_LABELS`` binary labels of sample ``sample_id``."""
    return LABELS[sample_id % len(LABELS)]


def _tensors(ids: torch.Tensor) -> tuple:
    """``(scores, labels)`` of shape ``(len(ids), NUM_LABELS)``: float32 and int64."""
    ids = ids.tolist()
    return (
        torch.tensor([sample_scores(i) for i in ids], dtype=torch.float32),
        torch.tensor([sample_labels(i) for i in ids], dtype=torch.long),
    )


def _scores(tp: float, fp: float, fn: float) -> tuple:
    """``(f1, precision, recall)`` from counts, 0.0 where a denominator is 0 (scikit-learn's ``zero_division=0``)."""
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return (2 * tp / (2 * tp + fp + fn) if tp else 0.0), precision, recall


def best_threshold(scores: torch.Tensor, labels: torch.Tensor, candidates=None) -> dict:
    """The threshold with the best F1 for one label column, predicting ``score >= threshold``.

    Args:
        scores: shape ``(M,)``, float.
        labels: shape ``(M,)``, 0/1.
        candidates: thresholds to try; default every distinct score (what ``precision_recall_curve``
            tries). Ties go to the lowest threshold.

    Returns:
        ``{"f1", "precision", "recall", "threshold"}`` as floats; all 0.0 when ``M == 0``.
    """
    if candidates is None:
        candidates = sorted(set(scores.tolist()))
    best = {"f1": 0.0, "precision": 0.0, "recall": 0.0, "threshold": 0.0}
    found = False
    for threshold in candidates:
        predicted = scores >= threshold
        tp = float((predicted & (labels == 1)).sum())
        fp = float((predicted & (labels == 0)).sum())
        fn = float((~predicted & (labels == 1)).sum())
        f1, precision, recall = _scores(tp, fp, fn)
        if not found or f1 > best["f1"]:
            best = {"f1": f1, "precision": precision, "recall": recall, "threshold": float(threshold)}
            found = True
    return best


def best_from_curve(precision: torch.Tensor, recall: torch.Tensor, thresholds: torch.Tensor) -> dict:
    """The best-F1 point of a precision-recall curve as torchmetrics returns it (``precision`` and ``recall``
    one longer than ``thresholds``, their last point dropped). Ties go to the lowest threshold."""
    precision, recall = precision[: len(thresholds)].double(), recall[: len(thresholds)].double()
    denominator = precision + recall
    f1 = torch.where(
        denominator > 0, 2 * precision * recall / denominator.clamp_min(1e-12), torch.zeros_like(denominator)
    )
    k = int(torch.argmax(f1))  # the first maximum
    return {
        "f1": float(f1[k]),
        "precision": float(precision[k]),
        "recall": float(recall[k]),
        "threshold": float(thresholds[k]),
    }


class MultilabelProbe(pl.LightningModule):
    """Logs every recipe of the module docstring for each label and records what it computed."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.d_curve = MultilabelPrecisionRecallCurve(num_labels=NUM_LABELS, thresholds=None)
        self.g_curve = MultilabelPrecisionRecallCurve(num_labels=NUM_LABELS, thresholds=GRID)
        self.scores, self.labels, self.ids = [], [], []
        self.seen_ids: list = []
        self.computed: dict = {}

    def validation_step(self, batch, batch_idx):
        scores, labels = _tensors(batch["id"])
        self.seen_ids.append(batch_ids(batch))
        for k in range(NUM_LABELS):
            for name, value in best_threshold(scores[:, k], labels[:, k]).items():
                self.log(f"b_{name}_{k}", value, sync_dist=True, batch_size=len(scores))
        self.d_curve.update(scores, labels)
        self.g_curve.update(scores, labels)
        self.scores.append(scores)
        self.labels.append(labels)
        self.ids.append(batch["id"])

    def on_validation_epoch_end(self):
        scores, labels, ids = torch.cat(self.scores), torch.cat(self.labels), torch.cat(self.ids)
        gathered_scores = self.all_gather(scores).reshape(-1, NUM_LABELS)
        gathered_labels = self.all_gather(labels).reshape(-1, NUM_LABELS)
        gathered_ids = self.all_gather(ids).reshape(-1)
        first: dict = {}
        for position, sample_id in enumerate(gathered_ids.tolist()):
            first.setdefault(sample_id, position)
        keep = torch.tensor(sorted(first.values()))
        d_precision, d_recall, d_thresholds = self.d_curve.compute()
        g_precision, g_recall, g_thresholds = self.g_curve.compute()
        per_recipe = {recipe: [] for recipe in ("a", "c", "d", "e", "g")}
        for k in range(NUM_LABELS):
            per_recipe["a"].append(best_threshold(scores[:, k], labels[:, k]))
            per_recipe["c"].append(best_threshold(gathered_scores[:, k], gathered_labels[:, k]))
            per_recipe["e"].append(best_threshold(gathered_scores[keep, k], gathered_labels[keep, k]))
            per_recipe["d"].append(best_from_curve(d_precision[k], d_recall[k], d_thresholds[k]))
            per_recipe["g"].append(best_from_curve(g_precision[k], g_recall[k], g_thresholds))
        for recipe, per_label in per_recipe.items():
            for k, scores_k in enumerate(per_label):
                for name, value in scores_k.items():
                    # a_ is the original code: no sync_dist, each rank keeps its own number. The others are
                    # identical on every rank already; sync_dist=True only averages equal numbers.
                    self.log(f"{recipe}_{name}_{k}", value, sync_dist=recipe != "a")
        self.computed = {recipe: per_label for recipe, per_label in per_recipe.items()}
        self.computed["gathered_ids"] = gathered_ids.tolist()
        self.scores, self.labels, self.ids = [], [], []
        self.d_curve.reset()
        self.g_curve.reset()


def best_threshold_recipes(info: RankInfo, n: int, batch_size: int = 3) -> dict:
    """Scenario: validate ``MultilabelProbe`` over ``IdDataset(n)``.

    Record keys: ``seen_ids`` (per batch), ``callback_metrics`` (``{recipe}_{name}_{label}``, see the module
    docstring), ``logged_metrics``, ``progress_bar_metrics``, ``computed`` (``{recipe: [per label {"f1",
    "precision", "recall", "threshold"}]}`` for a, c, d, e, g, and ``gathered_ids``), ``warnings``.
    """
    model = MultilabelProbe()
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {"seen_ids": model.seen_ids, **trainer_metrics(trainer), "computed": model.computed, "warnings": warnings}
