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
STEP_SYNCED = "step values synced (equal on every rank)"
STEP_RANK_LOCAL = "step values rank-local (the logger gets rank 0's)"
NOT_AT_SINGLE = "not logged in the single-process run"
NOT_IN_WORLD = "not logged in the distributed run"
NO_VALUE = "no value on any rank (the stage did not complete)"
NOT_STORED = "no value under this key, at W=1 or on any rank (nothing to compare)"

#: The upstream issue of the floored batch-size count in the synced epoch mean (the suite's strict xfail in
#: tests/facts/test_log_reductions.py,
#: test_the_synced_epoch_mean_is_the_batch_size_weighted_mean_even_when_the_count_does_not_divide_by_world_size).
FLOORED_COUNT_ISSUE = "https://github.com/Lightning-AI/pytorch-lightning/issues/21859"

#: Verdicts that make the audit fail when the key is epoch-level.
PROBLEMS = (SYNCED_DIFFERS, RANK_DIVERGENT, SOME_RANKS_ONLY, STEP_RANK_LOCAL, NO_VALUE, NOT_IN_WORLD, NOT_STORED)

#: What a rank-divergent value means downstream.
#: Sources: lightning_fabric/loggers/logger.py ``rank_zero_experiment`` and every logger's
#: ``@rank_zero_only log_metrics``; pytorch_lightning/callbacks/model_checkpoint.py
#: ``check_monitor_top_k`` (``reduce_boolean_decision``: save only if every rank agrees) and
#: ``format_checkpoint_name`` (file name and ``best_model_score`` from rank 0's value);
#: pytorch_lightning/callbacks/early_stopping.py (``reduce_boolean_decision(all=False)``: any rank stops all).
RANK_DIVERGENT_MEANING = (
    "each rank keeps its own shard's value; the logger writes rank 0's value only; ModelCheckpoint names "
    "files and keeps best_model_score from rank 0's value but saves only when every rank's own value agrees; "
    "EarlyStopping stops all ranks when any rank's value says stop"
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
        level: ``"epoch"`` (the value in ``callback_metrics`` after the stage) or ``"step"`` (the values
            logged at each step; ``single``/``per_rank`` hold the last step's).
        fixes: fix lines, each naming the fact test that shows the fix works.
        evidence: the numbers the cause was proven from (``{"name": value}``).
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
    level: str = "epoch"
    fixes: list = dataclasses.field(default_factory=list)
    evidence: dict = dataclasses.field(default_factory=dict)


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
    if "predict" in hook:
        return "predict"
    return {"fit": "train", "validate": "val", "test": "test", "predict": "predict"}[stage]


def _key_logs(logs: list, name: str) -> list:
    return [entry for entry in logs if entry["key"] == name]


def _weighted(logs: list) -> Optional[tuple]:
    """``(sum of value * batch_size, sum of batch_size)`` of one key's epoch-level log events, or None
    when a value or batch size is unknown."""
    total, count = 0.0, 0
    for entry in logs:
        if entry.get("value") is None or entry.get("batch_size") is None:
            return None
        total += entry["value"] * entry["batch_size"]
        count += entry["batch_size"]
    return total, count


def differs_cause(
    name: str,
    calls: list,
    measured: float,
    single: float,
    world_logs: list,
    single_logs: list,
    counts,
    world_size: int,
    stage: str,
    limit_batches,
    rtol: float,
    atol: float,
) -> tuple:
    """Why a synced epoch value differs from single-process, from what the ranks recorded.

    Args:
        world_logs: per rank, the ``log`` trace events of the W=N run; ``single_logs``: those at W=1.
        counts: the :class:`~ddpprobe.audit._evidence.Counts` of the key's loop, or None.

    Returns:
        ``(cause, fixes, evidence)``. A cause is named only when the records prove it: duplicated
        samples that the ranks really ran (padding) or every rank running every sample (unsharded);
        the floored count of the upstream bug when recomputing the synced mean from the logged values
        and batch sizes with a floored count gives the measured value and the correct count does not;
        a non-decomposable metric when the ranks ran exactly the single process's samples with the
        same weights and the per-batch (or per-rank) values still average to another number.
        Otherwise ``"unknown"``, with the evidence.
    """
    causes, fixes, evidence = [], [], {"measured": measured, "single-process": single}
    metric_object = any(c["metric_object"] for c in calls)
    mean = all(c["reduce_fx"] == "mean" for c in calls)
    sync_dist = any(c["sync_dist"] for c in calls)
    same_samples = False
    if counts is not None:
        evidence.update(
            {
                "samples per rank": counts.samples,
                "batches per rank": counts.batches,
                "duplicates": counts.duplicates if counts.identified else "unknown",
            }
        )
        if counts.unsharded:
            causes.append(
                f"unsharded data: every rank ran all {counts.samples[0]} samples of the {counts.loop} "
                f"set (identified by {counts.by}), so each sample counts {world_size} times"
            )
            fixes.append("shard_iterable")
            if not mean and close(measured, world_size * single, rtol, atol):
                causes[-1] += f"; the synced {calls[0]['reduce_fx']} is {world_size} x the single-process value"
        elif counts.duplicates:
            sampler = counts.sampler or "the sampler"
            causes.append(
                f"repeated samples: the ranks ran {sum(counts.samples)} samples, {counts.duplicates} of "
                f"them repeats ({', '.join(f'{k} x{v}' for k, v in counts.duplicated.items())}); "
                f"{sampler} pads each rank to the same length"
            )
            fixes.append("dedupe")
        same_samples = bool(counts.identified and counts.duplicates == 0 and counts.missing_vs_single == 0)
    per_rank = [_key_logs(logs, name) for logs in world_logs]
    per_rank = [[e for e in logs if e["on_epoch"]] for logs in per_rank]
    single_key = [e for e in _key_logs(single_logs, name) if e["on_epoch"]]
    tensor_mean = mean and sync_dist and not metric_object
    at_step = any(c["hook"].endswith("_step") for c in calls)
    weighted = [_weighted(logs) for logs in per_rank]
    if tensor_mean and at_step and all(w is not None for w in weighted):
        total = sum(w[0] for w in weighted)
        count = sum(w[1] for w in weighted)
        correct = total / count if count else None
        floored_count = count // world_size
        floored = (total / world_size) / floored_count if floored_count else None
        evidence.update(
            {
                "batch-size totals per rank": [w[1] for w in weighted],
                "recomputed synced mean": correct,
                "with floored count": floored,
            }
        )
        if floored is not None and close(measured, floored, rtol, atol) and not close(measured, correct, rtol, atol):
            causes.append(
                f"the upstream floored-count bug ({FLOORED_COUNT_ISSUE}): the ranks' batch-size totals "
                f"{[w[1] for w in weighted]} sum to {count}, which does not divide by W={world_size}; Lightning "
                f"averages the int64 count in integers (floor({count}/{world_size}) = {floored_count}), so every "
                f"rank gets {floored:.6g} instead of the recomputed {correct:.6g}"
            )
            fixes.append("mean_metric")
            if close(correct, single, rtol, atol):
                causes[-1] += " (which equals single-process: this is the whole difference)"
        elif correct is not None and close(measured, correct, rtol, atol):
            single_w = _weighted(single_key)
            if (
                same_samples
                and single_w is not None
                and single_w[1] == count
                and not close(correct, single, rtol, atol)
            ):
                causes.append(
                    f"non-decomposable: the ranks ran exactly the single process's samples with the same weights "
                    f"(batch sizes sum to {count}), yet the logged per-batch values average to {correct:.6g} at "
                    f"W={world_size} and {single:.6g} at W=1: each batch's value depends on which samples share the "
                    "batch (F1, precision, AUC, a median), so no average of them is the whole set's value"
                )
                fixes.append("metric_object")
    elif (
        tensor_mean
        and not at_step
        and all(len(logs) == 1 for logs in per_rank)
        and all(logs[0].get("value") is not None for logs in per_rank)
    ):
        values = [logs[0]["value"] for logs in per_rank]
        unweighted = sum(values) / len(values)
        evidence["per-rank values"] = values
        if close(measured, unweighted, rtol, atol) and counts is not None and counts.identified:
            weighted_by_samples = sum(v * n for v, n in zip(values, counts.samples)) / max(sum(counts.samples), 1)
            evidence["sample-weighted mean of per-rank values"] = weighted_by_samples
            if len(set(counts.samples)) > 1 and close(weighted_by_samples, single, rtol, atol):
                causes.append(
                    f"an unweighted mean over ranks of per-rank values, with unequal sample counts "
                    f"{counts.samples}: weighting each rank by its samples gives single-process"
                )
                fixes.append("mean_metric")
            elif same_samples:
                causes.append(
                    f"non-decomposable: each rank's value is computed on its own shard at epoch end and the ranks' "
                    f"values average to {unweighted:.6g} (weighted by samples {weighted_by_samples:.6g}), while "
                    f"the same samples give {single:.6g} in one process: the metric of a set is not an average of "
                    "its parts' metrics"
                )
                fixes.append("metric_object")
    if stage == "fit":
        causes.append(
            "also: training at W ranks averages gradients over W batches per step, so the weights (and "
            "anything computed from them) can differ from the single-process run"
        )
    if limit_batches is not None:
        causes.append(
            f"also: limit_batches={limit_batches} keeps the first batches of each rank's shard, a "
            "different subset of samples at each W"
        )
    proven = [c for c in causes if not c.startswith("also:")]
    if not proven:
        shown = ", ".join(f"{k} {v if not isinstance(v, float) else format(v, '.6g')}" for k, v in evidence.items())
        causes.insert(0, f"unknown: no repeated or unsharded samples and no recomputation explains it ({shown})")
    return "; ".join(causes), list(dict.fromkeys(fixes)), evidence


def _step_values(logs: list, name: str) -> list:
    return [e.get("step_value", e.get("value")) for e in _key_logs(logs, name) if e["on_step"]]


def rows(
    single: dict,
    world: list,
    world_size: int,
    stage: str,
    limit_batches=None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    *,
    world_logs: Optional[list] = None,
    single_logs: Optional[list] = None,
    counts: Optional[dict] = None,
    completed: bool = True,
    collectives: Optional[list] = None,
    ended: Optional[list] = None,
) -> list:
    """One ``KeyRow`` per key logged in either run, in first-logged order (plus a ``level="step"`` row
    for each key logged with ``on_step=True``).

    Args:
        single: the W=1 rank record of ``audit_rank``.
        world: the W=N rank records, ordered by rank.
        rtol, atol: tolerance for "equal" (float32 sums in a different order differ by ~1e-7 relative).
        world_logs, single_logs: the ``log`` trace events per W=N rank and at W=1.
        counts: ``{loop: Counts}`` of the W=N run.
        completed: every W=N rank finished its stage.
        collectives: each W=N rank's traced collectives (a key that agrees across ranks without
            sync_dist is explained by the module's own collectives in its hook, when there are some).
        ended: how each W=N rank's stage ended (``"end"``, ``"raised"``, None): a key a rank never logged
            because it stopped first is not blamed on the logging.
    """
    world_logs = world_logs if world_logs is not None else [[] for _ in world]
    single_logs = single_logs or []
    counts = counts or {}
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
        key_counts = counts.get(kind)
        agree = all(close(v, per_rank[0], rtol, atol) for v in per_rank)
        common = dict(
            key=name,
            hooks=hooks,
            on_step=on_step,
            on_epoch=on_epoch,
            sync_dist=sync_dist,
            reduce_fx="/".join(dict.fromkeys(c["reduce_fx"] for c in all_calls)),
            metric_object=metric_object,
            logged_on=logged_on,
        )

        cause, fixes, evidence = "", [], {}
        if on_epoch or len(logged_on) not in (0, len(world)):
            if not logged_on:
                verdict = NOT_IN_WORLD
                cause = "logged at W=1 but by no rank of the distributed run before it ended"
            elif len(logged_on) != len(world):
                verdict = SOME_RANKS_ONLY
                others = [r for r in range(len(world)) if r not in logged_on]
                cause = f"self.log({name!r}) ran on rank(s) {logged_on} only, never on rank(s) {others}"
                stopped = ended is not None and all(ended[r] != "end" for r in others)
                mine = {c["name"] for r in logged_on for c in world[r]["log_calls"]}
                partners = sorted(
                    {
                        c["name"]
                        for r in others
                        for c in world[r]["log_calls"]
                        if c["sync_dist"] and c["hook"] in hooks and c["name"] not in mine
                    }
                )
                if stopped:
                    cause += (
                        f"; rank(s) {others} stopped before they reached it (their stage raised or never "
                        "finished: see the collective trace)"
                    )
                elif sync_dist and not metric_object and partners:
                    cause += (
                        f"; rank(s) {others} log {partners} from the same hook with sync_dist=True instead, so "
                        "their all_reduces pair with this key's: its value is averaged with another key's"
                    )
                    fixes = ["same_keys"]
                elif sync_dist and not metric_object:
                    cause += (
                        "; its sync_dist all_reduce waits for ranks that never join it (a hang, or a mismatch "
                        "with their next collective)"
                    )
                elif metric_object:
                    cause += "; the Metric's compute() syncs its state with ranks that never join it"
                else:
                    cause += (
                        "; callbacks monitoring it fail on the ranks without it, and the logger has it only "
                        "when rank 0 logs it"
                    )
                fixes = [] if stopped else fixes or ["rank_zero_only"]
            elif all(v is None for v in per_rank) and not completed:
                verdict = NO_VALUE
                cause = "the distributed run ended before the epoch's values were computed (see the collective trace)"
            elif single_value is None and all(v is None for v in per_rank):
                # Never "equal": two missing values compare nothing. With several dataloaders Lightning
                # stores the key as f"{name}/dataloader_idx_{i}" (pytorch_lightning/trainer/connectors/
                # logger_connector/result.py ``_ResultCollection.log``, ``add_dataloader_idx``).
                verdict = NOT_STORED
                stored = sorted(
                    {k for rec in [single, *world] for k in rec["callback_metrics"] if k.startswith(f"{name}/")}
                )
                cause = f"callback_metrics has no {name!r} after the stage" + (
                    f"; it has {stored}: the stage ran several dataloaders, audit one at a time" if stored else ""
                )
            elif not agree:
                verdict = RANK_DIVERGENT
                cause = RANK_DIVERGENT_MEANING
                fixes = ["metric_object", "sync_dist"]
                known = [v for v in per_rank if v is not None]
                if single_value is not None and len(known) == len(per_rank):
                    unweighted = sum(known) / len(known)
                    evidence = {"mean of the ranks' values": unweighted, "single-process": single_value}
                    samples = key_counts.samples if key_counts is not None else None
                    weighted = (
                        sum(v * n for v, n in zip(known, samples)) / sum(samples)
                        if samples and sum(samples) and len(samples) == len(known)
                        else None
                    )
                    if close(unweighted, single_value, rtol, atol):
                        fixes = ["sync_dist"]
                        cause += "; the mean of the ranks' values equals single-process, so sync_dist=True gives it"
                    elif weighted is not None and close(weighted, single_value, rtol, atol):
                        fixes = ["mean_metric"]
                        cause += (
                            "; the ranks' values weighted by their sample counts average to single-process, "
                            "an unweighted mean over ranks does not"
                        )
                    else:
                        fixes = ["metric_object"]
                        cause += (
                            f"; averaging the ranks' values gives {unweighted:.6g}, not the single-process "
                            f"{single_value:.6g}: not a per-sample mean, so sync_dist=True cannot fix it"
                        )
            elif not single_calls:
                verdict = NOT_AT_SINGLE
            elif close(per_rank[0], single_value, rtol, atol):
                verdict = SYNCED_EQUAL
            else:
                verdict = SYNCED_DIFFERS
                cause, fixes, evidence = differs_cause(
                    name,
                    all_calls,
                    per_rank[0],
                    single_value,
                    world_logs,
                    single_logs,
                    key_counts,
                    world_size,
                    stage,
                    limit_batches,
                    rtol,
                    atol,
                )
            if verdict in (SYNCED_EQUAL, SYNCED_DIFFERS) and not (sync_dist or metric_object) and len(world) > 1:
                own = [
                    [c for c in rank if c.get("hook") in hooks and c.get("source") == "user"]
                    for rank in (collectives or [])
                ]
                if own and all(own):
                    ops = ", ".join(dict.fromkeys(f"{c['op']} at {c['call_site']}" for c in own[0]))
                    synced_by = f"synced by the module's own collectives in {hooks[0]} on every rank ({ops})"
                else:
                    synced_by = (
                        "the ranks agree although it is neither logged with sync_dist=True nor a "
                        "torchmetrics object, and no rank ran a collective in its hook (equal by chance)"
                    )
                cause = synced_by + ("; " + cause if cause else "")
            out.append(
                KeyRow(
                    **common,
                    single=single_value,
                    per_rank=per_rank,
                    verdict=verdict,
                    cause=cause,
                    problem=verdict in PROBLEMS,
                    fixes=fixes,
                    evidence=evidence,
                )
            )
        if on_step and len(logged_on) == len(world):
            steps = [_step_values(logs, name) for logs in world_logs]
            single_steps = _step_values(single_logs, name)
            n = min((len(s) for s in steps), default=0)
            same = all(all(close(a, b, rtol, atol) for a, b in zip(s[:n], steps[0][:n])) for s in steps)
            lengths = [len(s) for s in steps]
            evidence = {"steps per rank": lengths}
            if any(steps):
                if same:
                    verdict, cause, fixes = STEP_SYNCED, "", []
                    if len(set(lengths)) > 1:
                        cause = (
                            f"the ranks logged {lengths} steps: the {n} steps every rank ran are synced; the "
                            "extra steps' syncs had no partner step on the other ranks (see the collective trace)"
                        )
                else:
                    verdict = STEP_RANK_LOCAL
                    differing = next(
                        (i for i in range(n) if not all(close(s[i], steps[0][i], rtol, atol) for s in steps)), n
                    )
                    cause = (
                        f"at step {differing} the ranks logged "
                        f"{[s[differing] if differing < len(s) else None for s in steps]}: "
                        "each rank's step value is its own batch's, and Lightning's logger writes rank 0's"
                    )
                    if metric_object:
                        cause += (
                            " (a Metric object's step value is its forward() on the rank's batch; sync_dist "
                            "does not apply)"
                        )
                    fixes = ["metric_step_sync"] if metric_object else ["step_sync"]
                out.append(
                    KeyRow(
                        **{**common, "key": name},
                        single=single_steps[-1] if single_steps else None,
                        per_rank=[s[-1] if s else None for s in steps],
                        verdict=verdict,
                        cause=cause,
                        problem=verdict == STEP_RANK_LOCAL and (sync_dist or metric_object),
                        level="step",
                        fixes=fixes,
                        evidence=evidence,
                    )
                )
    return out
