"""The F1 probe: F1, precision and recall over the whole validation set, computed five ways at once.

The seed question: validation runs on W ranks, each sees its own shard; how do you log F1 over the
*entire* set? ``F1Probe`` uses the fixed predictions of ``IdDataset`` (no model involved) and logs:

=========  ===================================================================================
prefix     how
=========  ===================================================================================
``a_``     F1 of each batch, logged with ``sync_dist=True``: Lightning averages batch F1s (wrong)
``b_``     torchmetrics ``BinaryF1Score``/``BinaryPrecision``/``BinaryRecall`` objects passed to
           ``self.log``: their TP/FP/FN states are summed over ranks at ``compute()``
``c_``     ``self.all_gather`` of predictions and targets in ``on_validation_epoch_end``
``d_``     ``all_reduce`` (sum) of TP, FP, FN counts: constant memory
``e_``     like ``c_`` but sample ids are gathered too and duplicates (sampler padding) dropped
=========  ===================================================================================
"""

from __future__ import annotations

import torch
from torchmetrics.classification import BinaryF1Score, BinaryPrecision, BinaryRecall
from torchmetrics.functional.classification import binary_f1_score

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader, recorded_warnings, trainer_metrics


def scores_from_counts(tp: float, fp: float, fn: float) -> dict:
    """``{"f1", "precision", "recall"}`` from true-positive, false-positive and false-negative counts
    (0.0 where a denominator is 0, as scikit-learn's ``zero_division=0``)."""
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {"f1": f1, "precision": precision, "recall": recall}


def _counts(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``[TP, FP, FN]`` as a float64 tensor of shape (3,)."""
    return torch.stack(
        [
            ((preds == 1) & (target == 1)).sum(),
            ((preds == 1) & (target == 0)).sum(),
            ((preds == 0) & (target == 1)).sum(),
        ]
    ).double()


class F1Probe(pl.LightningModule):
    """Logs F1/precision/recall five ways (see the module docstring) and records the values it computed."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.b_f1 = BinaryF1Score()
        self.b_precision = BinaryPrecision()
        self.b_recall = BinaryRecall()
        self.preds, self.targets, self.ids = [], [], []
        self.seen_ids: list = []
        self.computed: dict = {}

    def validation_step(self, batch, batch_idx):
        preds, target = batch["pred"], batch["target"]
        self.seen_ids.append(batch_ids(batch))
        n = len(preds)
        # (a) a per-batch score, averaged by Lightning over batches and ranks.
        self.log("a_f1", binary_f1_score(preds, target), sync_dist=True, batch_size=n)
        # (b) metric objects: update here, Lightning calls compute() (which syncs) at epoch end.
        for metric in (self.b_f1, self.b_precision, self.b_recall):
            metric.update(preds, target)
        self.log("b_f1", self.b_f1, batch_size=n)
        self.log("b_precision", self.b_precision, batch_size=n)
        self.log("b_recall", self.b_recall, batch_size=n)
        self.preds.append(preds)
        self.targets.append(target)
        self.ids.append(batch["id"])

    def on_validation_epoch_end(self):
        preds, targets, ids = torch.cat(self.preds), torch.cat(self.targets), torch.cat(self.ids)
        # (c) gather every rank's predictions: all_gather returns shape (W, n_local); flatten.
        all_preds = self.all_gather(preds).reshape(-1)
        all_targets = self.all_gather(targets).reshape(-1)
        c = scores_from_counts(*_counts(all_preds, all_targets).tolist())
        # (d) sum the counts over ranks.
        d = scores_from_counts(*self.trainer.strategy.reduce(_counts(preds, targets), reduce_op="sum").tolist())
        # (e) gather ids too, keep each sample once.
        all_ids = self.all_gather(ids).reshape(-1)
        first = {}
        for position, sample_id in enumerate(all_ids.tolist()):
            first.setdefault(sample_id, position)
        keep = torch.tensor(sorted(first.values()), device=all_ids.device)
        e = scores_from_counts(*_counts(all_preds[keep], all_targets[keep]).tolist())
        for prefix, scores in (("c", c), ("d", d), ("e", e)):
            for name, value in scores.items():
                # Identical on every rank already; sync_dist=True only averages equal numbers.
                self.log(f"{prefix}_{name}", value, sync_dist=True)
        self.computed = {"c": c, "d": d, "e": e, "gathered_ids": all_ids.tolist()}
        self.preds, self.targets, self.ids = [], [], []


def f1_five_ways(info: RankInfo, n: int, batch_size: int = 3) -> dict:
    """Scenario: validate ``F1Probe`` over ``IdDataset(n)``.

    Record keys: ``seen_ids``, ``callback_metrics`` (``a_f1``, ``b_f1``, ``b_precision``, ``b_recall``,
    ``c_*``, ``d_*``, ``e_*``), ``logged_metrics``, ``progress_bar_metrics``, ``computed`` (the c/d/e
    scores this rank computed and the gathered ids), ``warnings``.
    """
    model = F1Probe()
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {"seen_ids": model.seen_ids, **trainer_metrics(trainer), "computed": model.computed, "warnings": warnings}
