"""The memory probe: peak memory of one rank for each way of getting a whole-set, best-threshold metric.

A rank streams ``n`` samples of ``NUM_LABELS`` scores and labels in batches and then produces the whole-set
numbers one of four ways (``recipe``):

==============  ============================================================================================
recipe          what the rank holds
==============  ============================================================================================
``gather``      its outputs (a list of batches, as ``validation_step`` outputs collected for
                ``on_validation_epoch_end``), then ``all_gather`` of scores and labels: every rank holds all
                W·n samples
``list_state``  torchmetrics ``MultilabelPrecisionRecallCurve(thresholds=None)``: list states keep every
                score; ``compute()`` gathers them from all ranks
``grid``        the same metric with ``thresholds=GRID_POINTS``: a ``(GRID_POINTS, NUM_LABELS, 2, 2)``
                confusion-matrix state, summed over ranks
``counts``      torchmetrics ``MultilabelStatScores`` at one fixed threshold: ``NUM_LABELS`` x 5 counts
==============  ============================================================================================

The peak is Linux's high-water mark of the rank's resident set (``VmHWM`` in ``/proc/self/status``), reset
just before the recipe runs (writing ``5`` to ``/proc/self/clear_refs``), minus the resident set at that
moment: bytes the recipe added at its peak. A warm-up run on 100 samples first keeps one-time costs (lazy
imports, the backend's first buffers) out of the figure. Data are drawn batch by batch inside the recipe, as a loader
would yield them. The process group is torch's own (no Trainer: the Trainer adds the same constant to
every recipe). Sources: torchmetrics/classification/precision_recall_curve.py, stat_scores.py;
proc(5) ``/proc/pid/clear_refs``.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torchmetrics.classification import MultilabelPrecisionRecallCurve, MultilabelStatScores

from ddpprobe.launch import RankInfo
from ddpprobe.probes.multilabel import NUM_LABELS

#: The recipes this probe measures, in the order of the module docstring.
RECIPES = ("gather", "list_state", "grid", "counts")

#: Grid points of the ``grid`` recipe.
GRID_POINTS = 100

#: Samples per batch.
BATCH = 10_000


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _batches(rank: int, n: int):
    """``(scores, labels)`` batches of this rank's ``n`` samples: float32 and int64, shape ``(B, NUM_LABELS)``."""
    generator = torch.Generator().manual_seed(rank)
    for start in range(0, n, BATCH):
        size = min(BATCH, n - start)
        labels = (torch.rand(size, NUM_LABELS, generator=generator) < 0.4).long()
        scores = (0.3 * labels + 0.7 * torch.rand(size, NUM_LABELS, generator=generator)).float()
        yield scores, labels


def _run(recipe: str, rank: int, world_size: int, n: int) -> float:
    """Run ``recipe`` and return a number it computed (label 0's best F1 or F1), so nothing is optimised away."""
    if recipe == "gather":
        outputs = list(_batches(rank, n))
        scores = torch.cat([s for s, _ in outputs])
        labels = torch.cat([y for _, y in outputs])
        gathered_scores = [torch.empty_like(scores) for _ in range(world_size)]
        gathered_labels = [torch.empty_like(labels) for _ in range(world_size)]
        dist.all_gather(gathered_scores, scores)
        dist.all_gather(gathered_labels, labels)
        return float(torch.cat(gathered_scores)[:, 0].mean() + torch.cat(gathered_labels)[:, 0].float().mean())
    if recipe in ("list_state", "grid"):
        metric = MultilabelPrecisionRecallCurve(
            num_labels=NUM_LABELS, thresholds=None if recipe == "list_state" else GRID_POINTS
        )
        for scores, labels in _batches(rank, n):
            metric.update(scores, labels)
        precision, recall, _ = metric.compute()  # per label: a list (list_state) or rows of a tensor (grid)
        p, r = precision[0], recall[0]
        return float((2 * p * r / (p + r).clamp_min(1e-12)).max())
    if recipe == "counts":
        metric = MultilabelStatScores(num_labels=NUM_LABELS, threshold=0.5, average=None)
        for scores, labels in _batches(rank, n):
            metric.update(scores, labels)
        tp, fp, _, fn, _ = metric.compute()[0].tolist()
        return 2 * tp / (2 * tp + fp + fn)
    raise ValueError(f"recipe={recipe!r}: use one of {RECIPES}")


def peak_memory(info: RankInfo, recipe: str, n: int) -> dict:
    """Scenario: this rank's peak added memory while producing whole-set metric numbers by ``recipe``.

    Args:
        recipe: one of :data:`RECIPES`.
        n: samples per rank (>= 1).

    Returns:
        ``{"recipe", "n", "peak_added_bytes", "baseline_bytes", "value"}``; bytes from ``/proc/self/status``
        (kiB there, times 1024).

    Raises:
        ValueError: an unknown ``recipe``.
    """
    if recipe not in RECIPES:
        raise ValueError(f"recipe={recipe!r}: use one of {RECIPES}")
    dist.init_process_group(
        info.backend, rank=info.rank, world_size=info.world_size, timeout=datetime.timedelta(seconds=info.pg_timeout)
    )
    _run(recipe, info.rank, info.world_size, min(n, 100))  # warm-up: lazy imports, first-use buffers
    dist.barrier()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current resident set
    baseline = _status_kib("VmRSS")
    value = _run(recipe, info.rank, info.world_size, n)
    peak = _status_kib("VmHWM")
    dist.barrier()
    dist.destroy_process_group()
    return {
        "recipe": recipe,
        "n": n,
        "peak_added_bytes": (peak - baseline) * 1024,
        "baseline_bytes": baseline * 1024,
        "value": value,
    }
