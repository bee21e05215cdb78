"""From two worlds' records (W=1 and W=N) to one row per logged key with a verdict. Pure Python: no
torch, no Lightning, so the rules can be read (and tested) on their own."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

#: The verdicts, in the words the report uses.
SYNCED_EQUAL = "synced, equals single-process"
SYNCED_DIFFERS = "synced, differs from single-process"
RANK_DIVERGENT = "rank-divergent (not synced)"
SOME_RANKS_ONLY = "logged on some ranks only (collective-mismatch hazard)"
STEP_LEVEL = "step-level, not compared with single-process"
NOT_AT_SINGLE = "not logged in the single-process run"

#: Lightning 1.x hooks removed in 2.0, and what 2.x does with a module that still defines one.
#: Source: pytorch_lightning/trainer/configuration_validator.py (``*_epoch_end`` raise
#: ``NotImplementedError``; ``*_step_end`` are no longer looked up, so they are never called);
#: Lightning-AI/pytorch-lightning PR #16520 (epoch_end) and #16791 (step_end).
REMOVED_HOOKS = {
    "training_epoch_end": "raises NotImplementedError in fit; use on_train_epoch_end and keep outputs yourself",
    "validation_epoch_end": "raises NotImplementedError in fit/validate; use on_validation_epoch_end",
    "test_epoch_end": "raises NotImplementedError in test; use on_test_epoch_end",
    "training_step_end": "silently never called; move its code into training_step",
    "validation_step_end": "silently never called; move its code into validation_step",
    "test_step_end": "silently never called; move its code into test_step",
}

#: Verdicts that make the audit fail when the key is epoch-level.
PROBLEMS = (SYNCED_DIFFERS, RANK_DIVERGENT, SOME_RANKS_ONLY)

#: What a rank-divergent value means downstream.
#: Sources: lightning_fabric/loggers/logger.py ``rank_zero_experiment`` and every logger's
#: ``@rank_zero_only log_metrics``; pytorch_lightning/callbacks/model_checkpoint.py
#: ``check_monitor_top_k`` (``reduce_boolean_decision``: save only if every rank agrees) and
#: ``format_checkpoint_name`` (file name and ``best_model_score`` from rank 0's value);
#: pytorch_lightning/callbacks/early_stopping.py (``reduce_boolean_decision(all=False)``: any rank stops all).
RANK_DIVERGENT_MEANING = (
    "each rank keeps its own shard's value; the logger writes rank 0's value only; ModelCheckpoint names "
    "files and keeps best_model_score from rank 0's value but saves only when every rank's own value agrees; "
    "EarlyStopping stops all ranks when any rank's value says stop. Fix: sync_dist=True for a decomposable "
    "mean, or a torchmetrics object / all_gather / all_reduce of counts for F1-like scores"
)


@dataclasses.dataclass(frozen=True)
class KeyRow:
    """One logged key.

    Attributes:
        key: the name given to ``self.log``.
        hooks: the hooks it was logged from (``"validation_step"``, ``"on_validation_epoch_end"``, ...).
        on_step, on_epoch, sync_dist: the ``self.log`` options, resolved as Lightning resolves them
            for the hook (``on_step``/``on_epoch`` defaults depend on the hook).
        reduce_fx: ``"mean"`` (default), ``"sum"``, ``"max"``, ... or a callable's name.
        metric_object: a ``torchmetrics.Metric`` was logged (it syncs its own state at ``compute()``).
        single: ``callback_metrics[key]`` after the single-process run (None if absent).
        per_rank: ``callback_metrics[key]`` on each rank of the W=N run, ordered by rank.
        logged_on: ranks whose module called ``self.log(key, ...)`` at W=N.
        verdict: one of the verdict constants of this module.
        cause: why (for ``SYNCED_DIFFERS``: sampler padding and/or a non-decomposable metric;
            for ``RANK_DIVERGENT``: what that means for the logger and callbacks), or "".
        problem: the verdict counts toward a failing audit (epoch-level keys only).
    """

    key: str
    hooks: list
    on_step: bool
    on_epoch: bool
    sync_dist: bool
    reduce_fx: str
    metric_object: bool
    single: Optional[float]
    per_rank: list
    logged_on: list
    verdict: str
    cause: str
    problem: bool


def as_float(value) -> Optional[float]:
    """A recorded value back to a float (records hold ``"nan"``/``"inf"`` as strings)."""
    if value is None:
        return None
    return float(value)


def close(a: Optional[float], b: Optional[float], rtol: float, atol: float) -> bool:
    """``a`` equals ``b`` to ``rtol``/``atol`` (two NaNs are equal; None equals only None)."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def padding_duplicates(dataset_size: Optional[int], world_size: int) -> Optional[int]:
    """Samples ``DistributedSampler(drop_last=False)`` repeats so every rank gets as many:
    ``ceil(N / W) * W - N``. Source: torch/utils/data/distributed.py ``DistributedSampler.__init__``."""
    if dataset_size is None:
        return None
    return math.ceil(dataset_size / world_size) * world_size - dataset_size


def loader_kind(hook: str, stage: str) -> str:
    """Which loader a hook's values come from: ``"train"``, ``"val"`` or ``"test"``."""
    if "train" in hook:
        return "train"
    if "validation" in hook:
        return "val"
    if "test" in hook:
        return "test"
    return {"fit": "train", "validate": "val", "test": "test"}[stage]


def _differs_cause(row_calls: list, kind: str, duplicates: Optional[int], dataset_size, world_size: int,
                   stage: str, limit_batches) -> str:
    causes = []
    if duplicates:
        causes.append(
            f"sampler padding: DistributedSampler repeats {duplicates} sample(s) of the {kind} set "
            f"(N={dataset_size}, W={world_size}: ceil(N/W)*W - N = {duplicates}), so the ranks evaluate "
            f"{dataset_size + duplicates} samples, not {dataset_size}"
        )
    metric_object = any(c["metric_object"] for c in row_calls)
    per_batch = any(c["on_epoch"] and c["hook"].endswith("_step") for c in row_calls)
    at_epoch_end = any(c["hook"].startswith("on_") and c["hook"].endswith("epoch_end") for c in row_calls)
    if not metric_object and per_batch and any(c["reduce_fx"] == "mean" for c in row_calls):
        causes.append(
            "a per-batch value averaged over batches and ranks: W changes which samples share a batch, so a "
            "non-decomposable metric (F1, precision, AUC, a median) averages to a different number"
        )
    elif not metric_object and at_epoch_end:
        causes.append(
            "a per-rank value averaged over ranks (sync_dist mean): a non-decomposable metric computed on each "
            "shard and then averaged is not the metric over the whole set"
        )
    if stage == "fit":
        causes.append("training at W ranks averages gradients over W batches per step, so the weights (and "
                      "anything computed from them) can differ from the single-process run")
    if limit_batches is not None:
        causes.append(f"limit_batches={limit_batches} keeps the first batches of each rank's shard, a different "
                      "subset of samples at each W")
    if len(causes) == 1 and not duplicates and not metric_object:
        causes[0] += " (no padding at this W and nothing else changes, so this is the cause)"
    return "; ".join(causes) or "unknown: no padding and no averaging found; compare the per-rank records"


def rows(single: dict, world: list, world_size: int, stage: str, limit_batches=None,
         rtol: float = 1e-5, atol: float = 1e-6) -> list:
    """One ``KeyRow`` per key logged in either run, in first-logged order.

    Args:
        single: the W=1 rank record of ``audit_rank``.
        world: the W=N rank records, ordered by rank.
        rtol, atol: tolerance for "equal" (float32 sums in a different order differ by ~1e-7 relative).
    """
    names: list = []
    for record in [single, *world]:
        for call in record["log_calls"]:
            if call["name"] not in names:
                names.append(call["name"])
    out = []
    for name in names:
        calls_per_rank = [[c for c in rec["log_calls"] if c["name"] == name] for rec in world]
        single_calls = [c for c in single["log_calls"] if c["name"] == name]
        all_calls = [c for calls in calls_per_rank for c in calls] or single_calls
        logged_on = [r for r, calls in enumerate(calls_per_rank) if calls]
        on_epoch = any(c["on_epoch"] for c in all_calls)
        on_step = any(c["on_step"] for c in all_calls)
        sync_dist = any(c["sync_dist"] for c in all_calls)
        metric_object = any(c["metric_object"] for c in all_calls)
        hooks = list(dict.fromkeys(c["hook"] for c in all_calls))
        single_value = as_float(single["callback_metrics"].get(name))
        per_rank = [as_float(rec["callback_metrics"].get(name)) for rec in world]
        kind = loader_kind(hooks[0], stage)
        sizes = world[0]["loaders"].get(kind) or [{}]
        dataset_size = sizes[0].get("dataset_size")
        duplicates = padding_duplicates(dataset_size, world_size)
        agree = all(close(v, per_rank[0], rtol, atol) for v in per_rank)

        cause = ""
        if len(logged_on) != len(world):
            verdict = SOME_RANKS_ONLY
            cause = (f"self.log({name!r}) ran on rank(s) {logged_on} only; with sync_dist=True the other ranks "
                     "never join its all_reduce (a hang or a mismatched collective), and callbacks monitoring it "
                     "fail on the ranks without it")
        elif not agree:
            verdict = RANK_DIVERGENT
            cause = RANK_DIVERGENT_MEANING
        elif not on_epoch:
            verdict = STEP_LEVEL
            cause = "callback_metrics holds the last step's value, which depends on how the data is sharded"
        elif not single_calls:
            verdict = NOT_AT_SINGLE
        elif close(per_rank[0], single_value, rtol, atol):
            verdict = SYNCED_EQUAL
        else:
            verdict = SYNCED_DIFFERS
            cause = _differs_cause(all_calls, kind, duplicates, dataset_size, world_size, stage, limit_batches)
        if verdict in (SYNCED_EQUAL, SYNCED_DIFFERS) and not (sync_dist or metric_object) and len(world) > 1:
            cause = ("the ranks agree although it is neither logged with sync_dist=True nor a torchmetrics "
                     "object (synced in the module's own code, or equal by chance)" + ("; " + cause if cause else ""))
        out.append(KeyRow(
            key=name, hooks=hooks, on_step=on_step, on_epoch=on_epoch, sync_dist=sync_dist,
            reduce_fx="/".join(dict.fromkeys(c["reduce_fx"] for c in all_calls)), metric_object=metric_object,
            single=single_value, per_rank=per_rank, logged_on=logged_on, verdict=verdict, cause=cause,
            problem=verdict in PROBLEMS and (on_epoch or verdict == SOME_RANKS_ONLY),
        ))
    return out
