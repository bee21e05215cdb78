"""From two worlds' records (W=1 and W=N) to one row per logged key with a verdict. Pure Python: no
torch, no Lightning, so the rules can be read (and tested) on their own."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ddpprobe.audit._stages import STAGE_LOOP, loop_of_hook

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
NO_VALUE_ON_SOME = "no value on the ranks whose stage did not complete"
NOT_STORED = "no value under this key, at W=1 or on any rank (nothing to compare)"

#: The upstream issue of the floored batch-size count in the synced epoch mean (the suite's strict xfail in
#: tests/facts/test_log_reductions.py,
#: test_the_synced_epoch_mean_is_the_batch_size_weighted_mean_even_when_the_count_does_not_divide_by_world_size).
FLOORED_COUNT_ISSUE = "https://github.com/Lightning-AI/pytorch-lightning/issues/21859"

#: A key of a ``fit`` whose weights trained apart, logged from a training hook: nothing at W=1 ran on the
#: same weights, so it is judged from the ranks alone.
TRAINED_APART = "synced; not compared with single-process (the weights trained apart)"

#: Verdicts that make the audit fail when the key is epoch-level.
PROBLEMS = (
    SYNCED_DIFFERS,
    RANK_DIVERGENT,
    SOME_RANKS_ONLY,
    STEP_RANK_LOCAL,
    NO_VALUE,
    NO_VALUE_ON_SOME,
    NOT_IN_WORLD,
    NOT_STORED,
)

#: What a rank-divergent value means downstream. Source: lightning_fabric/loggers/logger.py
#: ``rank_zero_experiment`` and every logger's ``@rank_zero_only log_metrics``. What callbacks monitoring it
#: did is read from their recorded state (ddpprobe/audit/_callbacks.py), not assumed.
RANK_DIVERGENT_MEANING = "each rank keeps its own shard's value; the logger writes rank 0's value only"


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
    """Which loader a hook's values come from: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``; for a
    hook of no loop (``on_fit_end``), the stage's loop."""
    return loop_of_hook(hook) or STAGE_LOOP[stage]


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


@dataclasses.dataclass
class _Case:
    """What the rules of :func:`differs_cause` read: one synced key whose value differs from single-process."""

    name: str
    calls: list
    measured: float
    single: float
    per_rank: list  # per W=N rank, the key's epoch-level log events
    single_key: list  # the same at W=1
    counts: object  # Counts of the key's loop, or None
    world_size: int
    rtol: float
    atol: float
    evidence: dict

    @property
    def mean(self) -> bool:
        return all(c["reduce_fx"] == "mean" for c in self.calls)

    @property
    def tensor_mean(self) -> bool:
        """A tensor logged with ``sync_dist=True`` and ``reduce_fx="mean"`` (Lightning's weighted mean)."""
        return self.mean and any(c["sync_dist"] for c in self.calls) and not any(c["metric_object"] for c in self.calls)

    @property
    def at_step(self) -> bool:
        return any(c["hook"].endswith("_step") for c in self.calls)

    @property
    def same_samples(self) -> bool:
        c = self.counts
        return bool(c is not None and c.identified and c.duplicates == 0 and c.missing_vs_single == 0)

    @property
    def reads_rank(self) -> list:
        """``[(call_site, names)]`` of the ``self.log`` calls of this key whose function reads the rank."""
        found = {(e.get("call_site"), tuple(e.get("reads_rank") or ())) for logs in self.per_rank for e in logs}
        return sorted((site, list(names)) for site, names in found if names)

    def close(self, a, b) -> bool:
        return close(a, b, self.rtol, self.atol)


def _unsharded(case: _Case) -> Optional[tuple]:
    c = case.counts
    if c is None or not c.unsharded:
        return None
    cause = (
        f"unsharded data: every rank ran all {c.samples[0]} samples of the {c.loop} set (identified by {c.by}), "
        f"so each sample counts {case.world_size} times"
    )
    if not case.mean and case.close(case.measured, case.world_size * case.single):
        cause += f"; the synced {case.calls[0]['reduce_fx']} is {case.world_size} x the single-process value"
    return cause, ["shard_iterable"]


def _repeated(case: _Case) -> Optional[tuple]:
    c = case.counts
    if c is None or c.unsharded or not c.duplicates:
        return None
    cause = (
        f"repeated samples: the ranks ran {sum(c.samples)} samples, {c.duplicates} of them repeats "
        f"({', '.join(f'{k} x{v}' for k, v in c.duplicated.items())}); {c.sampler or 'the sampler'} pads each "
        "rank to the same length"
    )
    return cause, ["dedupe"]


def _recomputed(case: _Case) -> Optional[tuple]:
    """``(correct, floored, count)``: the synced mean recomputed from the ranks' logged values and batch sizes,
    and with the count floored as upstream issue #21859 does; None when a value or batch size is unknown."""
    weighted = [_weighted(logs) for logs in case.per_rank]
    if not (case.tensor_mean and case.at_step) or any(w is None for w in weighted):
        return None
    total, count = sum(w[0] for w in weighted), sum(w[1] for w in weighted)
    floored_count = count // case.world_size
    correct = total / count if count else None
    floored = (total / case.world_size) / floored_count if floored_count else None
    case.evidence.update(
        {
            "batch-size totals per rank": [w[1] for w in weighted],
            "recomputed synced mean": correct,
            "with floored count": floored,
        }
    )
    return correct, floored, count


def _floored_count(case: _Case) -> Optional[tuple]:
    found = _recomputed(case)
    if found is None:
        return None
    correct, floored, count = found
    if floored is None or not case.close(case.measured, floored) or case.close(case.measured, correct):
        return None
    totals = case.evidence["batch-size totals per rank"]
    w = case.world_size
    cause = (
        f"the upstream floored-count bug ({FLOORED_COUNT_ISSUE}): the ranks' batch-size totals {totals} sum to "
        f"{count}, which does not divide by W={w}; Lightning averages the int64 count in integers "
        f"(floor({count}/{w}) = {count // w}), so every rank gets {floored:.6g} instead of the recomputed {correct:.6g}"
    )
    if case.close(correct, case.single):
        cause += " (which equals single-process: this is the whole difference)"
    return cause, ["mean_metric"]


def _missing_samples(case: _Case) -> Optional[tuple]:
    """Samples of W=1 no rank ran, proven the cause when the W=1 batches made only of the samples the ranks
    ran cover exactly those samples and their batch-size-weighted mean is the measured value."""
    c = case.counts
    if c is None or not c.identified or c.duplicates or not c.missing_vs_single:
        return None
    ran = {str(i) for logs in case.per_rank for e in logs for i in (e.get("batch_ids") or [])}
    kept = [e for e in case.single_key if e.get("batch_ids") and set(e["batch_ids"]) <= ran]
    covered = [i for e in kept for i in e["batch_ids"]]
    weighted = _weighted(kept) if kept else None
    if weighted is None or sorted(covered) != sorted(ran) or not weighted[1]:
        return None
    without = weighted[0] / weighted[1]
    case.evidence["single-process without the missing samples"] = without
    if not case.close(without, case.measured):
        return None
    cause = (
        f"missing samples: {c.missing_vs_single} sample(s) of W=1 ran on no rank ({', '.join(c.missing)}); the "
        f"single-process value recomputed without them is {without:.6g}, the measured value"
    )
    if c.sampler and "Wrapper" in c.sampler:
        cause += f" ({c.sampler} shards the indices your sampler gives each rank again)"
    return cause, []


def _batch_means_differ(case: _Case) -> Optional[tuple]:
    """The recomputed synced mean is the measured one and the ranks ran the single process's samples with
    the same weights, yet it differs: the batches' values are not means of per-sample values."""
    found = _recomputed(case)
    if found is None or not case.same_samples:
        return None
    correct, _, count = found
    single_w = _weighted(case.single_key)
    if correct is None or not case.close(case.measured, correct) or single_w is None or single_w[1] != count:
        return None
    if case.close(correct, case.single):
        return None
    return (
        f"the ranks ran exactly the single process's samples with the same weights (batch sizes sum to {count}), "
        f"yet the logged per-batch values average to {correct:.6g} at W={case.world_size} and {case.single:.6g} at "
        "W=1",
        "each batch's value depends on which samples share the batch (F1, precision, AUC, a median), so no "
        "average of them is the whole set's value",
    )


def _rank_means_differ(case: _Case) -> Optional[tuple]:
    """A value logged once per rank at epoch end whose synced mean is the ranks' unweighted mean."""
    per_rank = case.per_rank
    if not case.tensor_mean or case.at_step or not all(len(logs) == 1 for logs in per_rank):
        return None
    values = [logs[0].get("value") for logs in per_rank]
    if any(v is None for v in values):
        return None
    unweighted = sum(values) / len(values)
    case.evidence["per-rank values"] = values
    c = case.counts
    if not case.close(case.measured, unweighted) or c is None or not c.identified:
        return None
    by_samples = sum(v * n for v, n in zip(values, c.samples)) / max(sum(c.samples), 1)
    case.evidence["sample-weighted mean of per-rank values"] = by_samples
    if len(set(c.samples)) > 1 and case.close(by_samples, case.single):
        return ("unweighted", c.samples)
    if not case.same_samples:
        return None
    return (
        f"each rank's value is computed on its own shard at epoch end and the ranks' values average to "
        f"{unweighted:.6g} (weighted by samples {by_samples:.6g}), while the same samples give {case.single:.6g} "
        "in one process",
        "the metric of a set is not an average of its parts' metrics",
    )


def _non_decomposable(case: _Case) -> Optional[tuple]:
    """Non-decomposable when the records show it and nothing else can explain it; where the logging code
    reads the rank, ``unknown`` with both candidates and the evidence for and against each."""
    found = _batch_means_differ(case) or _rank_means_differ(case)
    if found is None:
        return None
    if found[0] == "unweighted":
        return (
            f"an unweighted mean over ranks of per-rank values, with unequal sample counts {found[1]}: "
            "weighting each rank by its samples gives single-process",
            ["mean_metric"],
        )
    shown, why = found
    reads = case.reads_rank
    if not reads:
        return f"non-decomposable: {shown}: {why}", ["metric_object"]
    where = "; ".join(f"{site} reads {', '.join(names)}" for site, names in reads)
    return (
        f"unknown: {shown}. Candidates: (1) the value depends on the rank: for: {where}; against: nothing "
        f"recorded. (2) non-decomposable ({why}): for: the same samples and weights give another average; "
        "against: a value that depends on the rank gives another average too",
        [],
    )


#: The rules of :func:`differs_cause`, in the order their causes are reported.
_RULES = (_unsharded, _repeated, _floored_count, _missing_samples, _non_decomposable)


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
        ``(cause, fixes, evidence)``. A cause is named only when the records prove it (each rule of
        ``_RULES``): duplicated samples that the ranks really ran (padding) or every rank running every
        sample (unsharded); the floored count of the upstream bug when recomputing the synced mean from the
        logged values and batch sizes with a floored count gives the measured value and the correct count
        does not; samples no rank ran when the single-process value recomputed without them is the measured
        one; a non-decomposable metric when the ranks ran exactly the single process's samples with the
        same weights and the per-batch (or per-rank) values still average to another number, unless the
        logging code reads the rank (then ``unknown`` with both candidates). Otherwise ``"unknown"``, with
        the evidence.
    """
    evidence = {"measured": measured, "single-process": single}
    if counts is not None:
        evidence.update(
            {
                "samples per rank": counts.samples,
                "batches per rank": counts.batches,
                "duplicates": counts.duplicates if counts.identified else "unknown",
            }
        )
    per_rank = [[e for e in _key_logs(logs, name) if e["on_epoch"]] for logs in world_logs]
    single_key = [e for e in _key_logs(single_logs, name) if e["on_epoch"]]
    case = _Case(name, calls, measured, single, per_rank, single_key, counts, world_size, rtol, atol, evidence)
    causes, fixes = [], []
    for rule in _RULES:
        found = rule(case)
        if found is not None:
            causes.append(found[0])
            fixes += found[1]
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
    if not any(not c.startswith(("also:", "unknown")) for c in causes) and not any(
        c.startswith("unknown") for c in causes
    ):
        shown = ", ".join(f"{k} {v if not isinstance(v, float) else format(v, '.6g')}" for k, v in evidence.items())
        causes.insert(0, f"unknown: no repeated or unsharded samples and no recomputation explains it ({shown})")
    return "; ".join(causes), list(dict.fromkeys(fixes)), evidence


def _step_values(logs: list, name: str) -> list:
    return [e.get("step_value", e.get("value")) for e in _key_logs(logs, name) if e["on_step"]]


@dataclasses.dataclass(frozen=True)
class Reference:
    """What the W=N values are compared with.

    Attributes:
        record, logs: the W=1 run's ``audit_rank`` record and ``log`` trace events.
        trained_apart: a ``fit`` whose final weights differ between W=1 and W=N.
        same_weights, same_weights_logs: the record and log events of W=1 validating the weights the W=N
            ``fit`` trained (None when not run).
        steps: optimizer steps of the W=1 and W=N runs (``[13, 7]``), for the report.
        weights_equal: both runs ended with the same weights (equal ``weights_digest``), so a difference
            is not the training's.
    """

    record: dict
    logs: list = dataclasses.field(default_factory=list)
    trained_apart: bool = False
    same_weights: Optional[dict] = None
    same_weights_logs: Optional[list] = None
    steps: list = dataclasses.field(default_factory=lambda: [None, None])
    weights_equal: bool = False

    @property
    def weights_may_differ(self) -> bool:
        """Values computed from the weights may differ for that reason alone (a ``fit`` whose final
        weights were not shown equal)."""
        return not self.weights_equal

    def of(self, hooks: list) -> tuple:
        """``(record, logs)`` to compare a key logged from ``hooks`` with, or ``(None, None)`` when no W=1
        run had the same weights (a training key of a ``fit`` trained apart)."""
        if not self.trained_apart:
            return self.record, self.logs
        if self.same_weights is not None and all("validation" in h for h in hooks):
            return self.same_weights, self.same_weights_logs or []
        return None, None


@dataclasses.dataclass
class _Key:
    """One logged key as :func:`rows` sees it: the ``self.log`` calls and values of every rank and of the
    reference run, and the evidence that goes with them."""

    name: str
    calls: list  # every W=N rank's call summaries (the reference's when no rank logged it)
    ref_calls: list
    logged_on: list
    hooks: list
    single: Optional[float]
    per_rank: list
    counts: object
    compared: bool  # a reference run on the same weights exists

    @property
    def on_epoch(self) -> bool:
        return any(c["on_epoch"] for c in self.calls)

    @property
    def on_step(self) -> bool:
        return any(c["on_step"] for c in self.calls)

    @property
    def sync_dist(self) -> bool:
        return any(c["sync_dist"] for c in self.calls)

    @property
    def metric_object(self) -> bool:
        return any(c["metric_object"] for c in self.calls)

    def common(self) -> dict:
        return dict(
            key=self.name,
            hooks=self.hooks,
            on_step=self.on_step,
            on_epoch=self.on_epoch,
            sync_dist=self.sync_dist,
            reduce_fx="/".join(dict.fromkeys(c["reduce_fx"] for c in self.calls)),
            metric_object=self.metric_object,
            logged_on=self.logged_on,
        )


@dataclasses.dataclass
class _Inputs:
    """What every key's verdict reads besides the key itself (see :func:`rows`)."""

    reference: Reference
    world: list
    world_size: int
    stage: str
    limit_batches: Optional[int]
    rtol: float
    atol: float
    world_logs: list
    counts: dict
    completed: bool
    collectives: list
    ended: Optional[list]
    unmoved: list

    def close(self, a, b) -> bool:
        return close(a, b, self.rtol, self.atol)


def _some_ranks_only(ins: _Inputs, key: _Key) -> tuple:
    others = [r for r in range(len(ins.world)) if r not in key.logged_on]
    cause = f"self.log({key.name!r}) ran on rank(s) {key.logged_on} only, never on rank(s) {others}"
    if ins.ended is not None and all(ins.ended[r] != "end" for r in others):
        cause += (
            f"; rank(s) {others} stopped before they reached it (their stage raised or never finished: see "
            "the collective trace)"
        )
        return SOME_RANKS_ONLY, cause, [], {}
    mine = {c["name"] for r in key.logged_on for c in ins.world[r]["log_calls"]}
    partners = sorted(
        {
            c["name"]
            for r in others
            for c in ins.world[r]["log_calls"]
            if c["sync_dist"] and c["hook"] in key.hooks and c["name"] not in mine
        }
    )
    if key.sync_dist and not key.metric_object and partners:
        cause += (
            f"; rank(s) {others} log {partners} from the same hook with sync_dist=True instead, so their "
            "all_reduces pair with this key's: its value is averaged with another key's"
        )
        return SOME_RANKS_ONLY, cause, ["same_keys"], {}
    if key.sync_dist and not key.metric_object:
        cause += (
            "; its sync_dist all_reduce waits for ranks that never join it (a hang, or a mismatch with their "
            "next collective)"
        )
    elif key.metric_object:
        cause += "; the Metric's compute() syncs its state with ranks that never join it"
    else:
        cause += (
            "; callbacks monitoring it fail on the ranks without it, and the logger has it only when rank 0 logs it"
        )
    return SOME_RANKS_ONLY, cause, ["rank_zero_only"], {}


def _not_stored(ins: _Inputs, key: _Key, reference: dict) -> tuple:
    # Never "equal": two missing values compare nothing. With several dataloaders Lightning stores the key
    # as f"{name}/dataloader_idx_{i}" (pytorch_lightning/trainer/connectors/logger_connector/result.py
    # ``_ResultCollection.log``, ``add_dataloader_idx``).
    stored = sorted(
        {k for rec in [reference, *ins.world] if rec for k in rec["callback_metrics"] if k.startswith(f"{key.name}/")}
    )
    cause = f"callback_metrics has no {key.name!r} after the stage" + (
        f"; it has {stored}: the stage ran several dataloaders, audit one at a time" if stored else ""
    )
    return NOT_STORED, cause, [], {}


def _rank_divergent(ins: _Inputs, key: _Key) -> tuple:
    """Each rank keeps its own value: what a sync of the ranks' values gives, and whether that is the
    single-process value on the same weights."""
    cause, fixes, evidence = RANK_DIVERGENT_MEANING, ["metric_object", "sync_dist"], {}
    known = [v for v in key.per_rank if v is not None]
    if len(known) != len(key.per_rank):
        return RANK_DIVERGENT, cause, fixes, evidence
    unweighted = sum(known) / len(known)
    evidence = {"mean of the ranks' values": unweighted}
    if key.single is None:
        if not key.compared:
            cause += (
                f"; a sync of the ranks' values (sync_dist=True, reduce_fx='mean') gives {unweighted:.6g} on every "
                "rank; no single-process run had these weights, so whether that is the whole set's value is "
                "not compared"
            )
        return RANK_DIVERGENT, cause, fixes, evidence
    evidence["single-process"] = key.single
    samples = key.counts.samples if key.counts is not None else None
    weighted = (
        sum(v * n for v, n in zip(known, samples)) / sum(samples)
        if samples and sum(samples) and len(samples) == len(known)
        else None
    )
    if ins.close(unweighted, key.single):
        return (
            RANK_DIVERGENT,
            cause + "; the mean of the ranks' values equals single-process, so sync_dist=True gives it",
            ["sync_dist"],
            evidence,
        )
    if weighted is not None and ins.close(weighted, key.single):
        cause += (
            "; the ranks' values weighted by their sample counts average to single-process, an unweighted mean "
            "over ranks does not"
        )
        return RANK_DIVERGENT, cause, ["mean_metric"], evidence
    return _rank_divergent_unexplained(key, cause, unweighted, weighted, evidence)


def _rank_divergent_unexplained(key: _Key, cause: str, unweighted: float, weighted, evidence: dict) -> tuple:
    """Rank-local values whose mean (plain or sample-weighted) is not the single-process value. "Not a
    per-sample mean" is proven only when the ranks ran exactly the single process's samples; with repeated
    samples (padding) a per-sample mean synced over the ranks is the padded set's mean too, so the cause is
    ``unknown`` with both candidates, and the fix that holds for either (drop the repeats) is the one given."""
    c = key.counts
    shown = f"averaging the ranks' values gives {unweighted:.6g}" + (
        f" (weighted by their samples {weighted:.6g})" if weighted is not None else ""
    )
    shown += f", not the single-process {key.single:.6g}"
    if c is not None and c.identified and c.duplicates and not c.unsharded:
        repeats = ", ".join(f"{k} x{v}" for k, v in c.duplicated.items())
        cause += (
            f"; {shown}; unknown whether sync_dist=True would give it: the ranks ran {sum(c.samples)} samples, "
            f"{c.duplicates} of them repeats ({repeats}), and a per-sample mean synced over the ranks counts the "
            "repeats too. Candidates: (1) the repeated samples: for: they ran; against: nothing recorded. "
            "(2) not a per-sample mean: for: nothing recorded; against: nothing recorded"
        )
        return RANK_DIVERGENT, cause, ["dedupe"], evidence
    if c is None or not c.identified or c.duplicates or c.missing_vs_single:
        cause += f"; {shown}; unknown why: which samples the ranks ran is not known to be the single process's"
        return RANK_DIVERGENT, cause, [], evidence
    cause += (
        f"; {shown}, although the ranks ran exactly the single process's samples: not a per-sample mean, so "
        "sync_dist=True cannot fix it"
    )
    return RANK_DIVERGENT, cause, ["metric_object"], evidence


def _synced_by(ins: _Inputs, key: _Key) -> str:
    """Why ranks agree on a key neither logged with sync_dist=True nor a Metric object."""
    own = [[c for c in rank if c.get("hook") in key.hooks and c.get("source") == "user"] for rank in ins.collectives]
    if own and all(own) and not any(u["hook"] in key.hooks for u in ins.unmoved):
        ops = ", ".join(dict.fromkeys(f"{c['op']} at {c['call_site']}" for c in own[0]))
        return f"synced by the module's own collectives in {key.hooks[0]} on every rank ({ops})"
    return (
        "the ranks agree although it is neither logged with sync_dist=True nor a torchmetrics object, and no "
        "rank ran a collective in its hook (equal by chance)"
    )


def _trained_apart_cause(ins: _Inputs) -> str:
    steps = ins.reference.steps
    made = f" (W=1 made {steps[0]} optimizer steps, W={ins.world_size} {steps[1]})" if None not in steps else ""
    return (
        f"every rank holds the same value; the weights trained apart{made}, so a single process trained other "
        "weights and its value is not compared"
    )


def _agreeing(ins: _Inputs, key: _Key, reference: dict, ref_logs: list) -> tuple:
    """The ranks agree: equal to single-process, differing from it (with the cause), or not compared."""
    if reference is None:
        return TRAINED_APART, _trained_apart_cause(ins), [], {}
    if not key.ref_calls:
        return NOT_AT_SINGLE, "", [], {}
    if ins.close(key.per_rank[0], key.single):
        return SYNCED_EQUAL, "", [], {}
    cause, fixes, evidence = differs_cause(
        key.name,
        key.calls,
        key.per_rank[0],
        key.single,
        ins.world_logs,
        ref_logs,
        key.counts,
        ins.world_size,
        ins.stage if ins.reference.weights_may_differ and ins.reference.same_weights is not reference else "validate",
        ins.limit_batches,
        ins.rtol,
        ins.atol,
    )
    return SYNCED_DIFFERS, cause, fixes, evidence


def _epoch_verdict(ins: _Inputs, key: _Key, reference: Optional[dict], ref_logs: Optional[list]) -> tuple:
    """``(verdict, cause, fixes, evidence)`` of a key's epoch value."""
    if not key.logged_on:
        return NOT_IN_WORLD, "logged at W=1 but by no rank of the distributed run before it ended", [], {}
    if len(key.logged_on) != len(ins.world):
        return _some_ranks_only(ins, key)
    if all(v is None for v in key.per_rank) and not ins.completed:
        cause = "the distributed run ended before the epoch's values were computed (see the collective trace)"
        return NO_VALUE, cause, [], {}
    if key.single is None and all(v is None for v in key.per_rank):
        return _not_stored(ins, key, reference)
    unfinished = [r for r, v in enumerate(key.per_rank) if v is None and ins.ended and ins.ended[r] != "end"]
    if unfinished:
        held = ", ".join(f"rank {r} {v:.6g}" for r, v in enumerate(key.per_rank) if v is not None)
        cause = (
            f"rank(s) {unfinished} never finished their stage (see the collective trace), so their values are "
            f"unknown; {held}" + (f", single-process {key.single:.6g}" if key.single is not None else "")
        )
        return NO_VALUE_ON_SOME, cause, [], {}
    if not all(ins.close(v, key.per_rank[0]) for v in key.per_rank):
        return _rank_divergent(ins, key)
    verdict, cause, fixes, evidence = _agreeing(ins, key, reference, ref_logs)
    if verdict in (SYNCED_EQUAL, SYNCED_DIFFERS) and not (key.sync_dist or key.metric_object) and len(ins.world) > 1:
        cause = _synced_by(ins, key) + ("; " + cause if cause else "")
    return verdict, cause, fixes, evidence


def _with_unmoved(ins: _Inputs, key: _Key, found: tuple) -> tuple:
    """``found`` with the ``self.all_gather`` calls of the key's hooks that returned leaves unchanged named
    in the cause (for a key that is not synced by ``sync_dist`` or a Metric)."""
    from ddpprobe.audit._evidence import unmoved_text

    verdict, cause, fixes, evidence = found
    here = [u for u in ins.unmoved if u["hook"] in key.hooks]
    if not here or key.sync_dist or key.metric_object:
        return found
    return verdict, "; ".join([cause, *(unmoved_text(u) for u in here)]).lstrip("; "), fixes, evidence


def _step_row(ins: _Inputs, key: _Key, ref_logs: Optional[list]) -> Optional[KeyRow]:
    """The row of a key's step values (``on_step=True``), or None when no rank logged one."""
    steps = [_step_values(logs, key.name) for logs in ins.world_logs]
    if not any(steps):
        return None
    single_steps = _step_values(ref_logs or [], key.name)
    n = min(len(s) for s in steps)
    lengths = [len(s) for s in steps]
    cause, fixes = "", []
    if all(all(ins.close(a, b) for a, b in zip(s[:n], steps[0][:n])) for s in steps):
        verdict = STEP_SYNCED
        if len(set(lengths)) > 1:
            cause = (
                f"the ranks logged {lengths} steps: the {n} steps every rank ran are synced; the extra steps' "
                "syncs had no partner step on the other ranks (see the collective trace)"
            )
    else:
        verdict = STEP_RANK_LOCAL
        differing = next((i for i in range(n) if not all(ins.close(s[i], steps[0][i]) for s in steps)), n)
        cause = (
            f"at step {differing} the ranks logged {[s[differing] if differing < len(s) else None for s in steps]}: "
            "each rank's step value is its own batch's, and Lightning's logger writes rank 0's"
        )
        if key.metric_object:
            cause += " (a Metric object's step value is its forward() on the rank's batch; sync_dist does not apply)"
        fixes = ["metric_step_sync"] if key.metric_object else ["step_sync"]
    return KeyRow(
        **key.common(),
        single=single_steps[-1] if single_steps else None,
        per_rank=[s[-1] if s else None for s in steps],
        verdict=verdict,
        cause=cause,
        problem=verdict == STEP_RANK_LOCAL and (key.sync_dist or key.metric_object),
        level="step",
        fixes=fixes,
        evidence={"steps per rank": lengths},
    )


def _key(ins: _Inputs, name: str) -> tuple:
    """``(_Key, reference record, reference logs)`` of the key ``name``."""
    calls_per_rank = [[c for c in rec["log_calls"] if c["name"] == name] for rec in ins.world]
    base_calls = [c for c in ins.reference.record["log_calls"] if c["name"] == name]
    calls = [c for per in calls_per_rank for c in per] or base_calls
    hooks = list(dict.fromkeys(c["hook"] for c in calls))
    reference, ref_logs = ins.reference.of(hooks)
    key = _Key(
        name=name,
        calls=calls,
        ref_calls=[c for c in reference["log_calls"] if c["name"] == name] if reference else [],
        logged_on=[r for r, per in enumerate(calls_per_rank) if per],
        hooks=hooks,
        single=as_float(reference["callback_metrics"].get(name)) if reference else None,
        per_rank=[as_float(rec["callback_metrics"].get(name)) for rec in ins.world],
        counts=ins.counts.get(loader_kind(hooks[0], ins.stage)),
        compared=reference is not None,
    )
    return key, reference, ref_logs


def rows(
    single,
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
    unmoved: list = (),
) -> list:
    """One ``KeyRow`` per key logged in either run, in first-logged order (plus a ``level="step"`` row
    for each key logged with ``on_step=True``).

    Args:
        single: the W=1 rank record of ``audit_rank``, or a :class:`Reference` (a ``fit`` trained apart
            compares validation keys with W=1 validating the W=N weights, and training keys with nothing).
        world: the W=N rank records, ordered by rank.
        rtol, atol: tolerance for "equal" (float32 sums in a different order differ by ~1e-7 relative).
        world_logs, single_logs: the ``log`` trace events per W=N rank and at W=1 (``single_logs`` only
            with a record as ``single``).
        counts: ``{loop: Counts}`` of the W=N run.
        completed: every W=N rank finished its stage.
        collectives: each W=N rank's traced collectives (a key that agrees across ranks without
            sync_dist is explained by the module's own collectives in its hook, when there are some).
        ended: how each W=N rank's stage ended (``"end"``, ``"raised"``, None): a key a rank never logged
            because it stopped first is not blamed on the logging.
        unmoved: ``self.all_gather`` calls that returned non-tensor leaves unchanged
            (``_evidence.unmoved_leaves``), named in the cause of a key logged from their hook.
    """
    reference = single if isinstance(single, Reference) else Reference(record=single, logs=single_logs or [])
    ins = _Inputs(
        reference,
        world,
        world_size,
        stage,
        limit_batches,
        rtol,
        atol,
        world_logs if world_logs is not None else [[] for _ in world],
        counts or {},
        completed,
        collectives or [],
        ended,
        list(unmoved),
    )
    records = [reference.record, *([reference.same_weights] if reference.same_weights else []), *world]
    names = list(dict.fromkeys(call["name"] for record in records for call in record["log_calls"]))
    out = []
    for name in names:
        key, record, ref_logs = _key(ins, name)
        if key.on_epoch or len(key.logged_on) not in (0, len(world)):
            verdict, cause, fixes, evidence = _with_unmoved(ins, key, _epoch_verdict(ins, key, record, ref_logs))
            out.append(
                KeyRow(
                    **key.common(),
                    single=key.single,
                    per_rank=key.per_rank,
                    verdict=verdict,
                    cause=cause,
                    problem=verdict in PROBLEMS,
                    fixes=fixes,
                    evidence=evidence,
                )
            )
        if key.on_step and len(key.logged_on) == len(world):
            row = _step_row(ins, key, ref_logs)
            if row is not None:
                out.append(row)
    return out
