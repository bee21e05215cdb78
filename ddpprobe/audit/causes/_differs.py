"""Why a synced epoch value differs from single-process: each rule proves one registry entry
(ddpprobe/hazards/) from what the ranks recorded, or says nothing. Pure Python."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.causes._kinds import FLOORED_COUNT_ISSUE
from ddpprobe.audit.evidence._values import _weighted, close, epoch_logs

#: Integer dtypes whose mean ``strategy.reduce`` truncates (tests/facts/test_reductions_outside_log.py).
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


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
    collectives: list = dataclasses.field(default_factory=list)  # per W=N rank, its traced collectives
    hooks: list = dataclasses.field(default_factory=list)  # the hooks the key was logged from

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
    cause = hazards.cause("unsharded_data", samples=c.samples[0], loop=c.loop, by=c.by, world_size=case.world_size)
    if not case.mean and case.close(case.measured, case.world_size * case.single):
        cause += f"; the synced {case.calls[0]['reduce_fx']} is {case.world_size} x the single-process value"
    return cause, ["unsharded_data"]


def _repeated(case: _Case) -> Optional[tuple]:
    c = case.counts
    if c is None or c.unsharded or not c.duplicates:
        return None
    repeated = ", ".join(f"{k} x{v}" for k, v in c.duplicated.items())
    if c.missing_vs_single:
        # DistributedSampler repeats samples only to fill the last round, after every sample ran once.
        return (
            f"repeated and missing samples: the ranks ran {sum(c.samples)} samples, {c.duplicates} of them repeats "
            f"({repeated}), while {c.missing_vs_single} sample(s) of the single-process run ran on no rank: not "
            "DistributedSampler's padding, which repeats samples only after every sample ran once; the ranks did not "
            "shard one set (see the DDP contract's datasets)",
            [],
        )
    cause = hazards.cause(
        "repeated_samples",
        total=sum(c.samples),
        duplicates=c.duplicates,
        repeated=", ".join(f"{k} x{v}" for k, v in c.duplicated.items()),
        sampler=c.sampler or "the sampler",
    )
    return cause, ["repeated_samples"]


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
    cause = hazards.cause(
        "floored_count",
        issue=FLOORED_COUNT_ISSUE,
        totals=totals,
        count=count,
        w=w,
        floored_count=count // w,
        floored=f"{floored:.6g}",
        correct=f"{correct:.6g}",
    )
    if case.close(correct, case.single):
        cause += " (which equals single-process: this is the whole difference)"
    return cause, ["floored_count"]


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
    cause = hazards.cause(
        "missing_samples", missing=c.missing_vs_single, labels=", ".join(c.missing), without=f"{without:.6g}"
    )
    if c.sampler and "Wrapper" in c.sampler:
        cause += f" ({c.sampler} shards the indices your sampler gives each rank again)"
    return cause, ["missing_samples"]


def _missing_synced_right(case: _Case) -> Optional[tuple]:
    """Samples of W=1 no rank ran, where the W=1 batches do not isolate them (a batch mixes them with samples
    that ran) but the synced mean recomputed from the ranks' own logged values and batch sizes is the measured
    one: the sync is right for what ran, so the difference is the samples that did not."""
    c = case.counts
    if c is None or not c.identified or c.duplicates or not c.missing_vs_single:
        return None
    if "single-process without the missing samples" in case.evidence and case.close(
        case.evidence["single-process without the missing samples"], case.measured
    ):
        return None  # _missing_samples proved it
    found = _recomputed(case)
    if found is None or found[0] is None or not case.close(found[0], case.measured):
        return None
    cause = hazards.cause(
        "missing_samples_synced_correctly",
        missing=c.missing_vs_single,
        labels=", ".join(c.missing),
        recomputed=f"{found[0]:.6g}",
    )
    if c.sampler and "Wrapper" in c.sampler:
        cause += f" ({c.sampler} shards the indices your sampler gives each rank again)"
    return cause, ["missing_samples_synced_correctly"]


def _strategy_reduces(case: _Case, dtypes: tuple) -> Optional[dict]:
    """The first all_reduce of one of ``dtypes`` that every W=N rank made from Lightning's ``_sync_ddp`` (the
    call chain's ``Strategy.reduce``) in the key's hook, recorded in the case's evidence; None where some rank
    made none."""
    per_rank = []
    for rank in case.collectives:
        found = [
            c
            for c in rank
            if c.get("dtype") in dtypes
            and c.get("op") == "all_reduce"
            and (c.get("running") or c.get("hook")) in case.hooks
            and ("Strategy.reduce" in str(c.get("call") or "") or "_sync_ddp" in str(c.get("origin") or ""))
            and c.get("source") in ("user", "library")
        ]
        per_rank.append(found)
    if not per_rank or not all(per_rank):
        return None
    first = per_rank[0][0]
    case.evidence.update({"call site": first.get("call_site"), "op": first["op"], "dtype": first["dtype"]})
    return first


def _int64_reduce(case: _Case) -> Optional[tuple]:
    """A value computed in the key's hook from ``trainer.strategy.reduce`` of an integer tensor: every rank made
    an integer all_reduce from ``Strategy.reduce`` there, and the measured value is a whole number (the
    truncated mean stays an integer)."""
    if not case.collectives or not math.isfinite(float(case.measured)) or float(case.measured) != int(case.measured):
        return None
    first = _strategy_reduces(case, INTEGER_DTYPES)
    if first is None:
        return None
    where = f"line {first['call_site']}" if first.get("call_site") else f"the {case.hooks[0]} hook"
    return hazards.cause("int64_reduce", where=where, op=first["op"]), ["int64_reduce"]


def _bool_reduce(case: _Case) -> Optional[tuple]:
    """A value computed in the key's hook from ``trainer.strategy.reduce`` of a bool tensor: every rank made a
    bool all_reduce from ``Strategy.reduce`` there, whose sum and mean are ``any`` over the ranks per element
    (tests/facts/test_reductions_outside_log.py)."""
    first = _strategy_reduces(case, ("bool",)) if case.collectives else None
    if first is None:
        return None
    where = f"line {first['call_site']}" if first.get("call_site") else f"the {case.hooks[0]} hook"
    return hazards.cause("bool_reduce", where=where, op=first["op"], shape=first.get("shape")), ["bool_reduce"]


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


def _already_whole(case: _Case) -> Optional[tuple]:
    """A key synced by ``self.log`` with ``reduce_fx="sum"`` whose every rank's own epoch value already equals the
    single process's (the whole set's) and whose measured value is W times it: the sum over the ranks counts the
    whole W times. Only where the trace shows a collective of the module's own in the key's hooks, named as what
    made each rank's value whole (without one, equal values may be a tie of each rank's own part, as a max shared by
    two shards). Arithmetic on the recorded values; no registry entry."""
    from ddpprobe.audit.evidence._arithmetic import own_epoch_values

    sums = [c for c in case.calls if c.get("sync_dist") and not c.get("metric_object")]
    if not sums or any(str(c.get("reduce_fx")) != "sum" for c in sums):
        return None
    values, _ = own_epoch_values(case.per_rank, case.name, "sum")
    if not values or any(v is None for v in values) or not all(case.close(v, case.single) for v in values):
        return None
    if not case.close(case.measured, case.world_size * case.single):
        return None
    own = sorted(
        {
            f"{c['op']} at {c['call_site']}"
            for rank in case.collectives
            for c in rank
            if c.get("source") == "user" and c.get("hook") in case.hooks and c.get("call_site")
        }
    )
    if not own:
        return None  # equal values with no collective of the module's own could be a tie (each rank's own max)
    made = f" (the module's own {', '.join(own)} made it whole)"
    case.evidence.update({"ranks' own values": values, SHARES: True})
    return (
        f"every rank's own value already is the single-process {case.single:.6g}{made}, and the sync's "
        f"reduce_fx='sum' adds the W={case.world_size} copies: {case.measured:.6g}; a value every rank already "
        "holds whole needs no sync (sync_dist=False), or a sum sync of each rank's own part only",
        [],
    )


#: The evidence key :func:`_rank_shares` sets where the ranks' values sum to the single-process value.
SHARES = "the ranks' values sum to single-process"


def _rank_shares(case: _Case) -> Optional[tuple]:
    """A value logged once per rank at epoch end, synced as a mean, where the ranks' values add up to the single
    process's value and the measured one is their mean: each rank holds its share of one whole-set sum (a sum over
    its own samples divided by a count of the whole set), so the mean sync divides the whole by W. Arithmetic on the
    recorded values only; no registry entry (no fix is printed)."""
    per_rank = case.per_rank
    if not case.tensor_mean or case.at_step or not all(len(logs) == 1 for logs in per_rank):
        return None
    values = [logs[0].get("value") for logs in per_rank]
    if any(v is None for v in values) or len(values) < 2:
        return None
    total = sum(values)
    if not case.close(total, case.single) or not case.close(case.measured, total / len(values)):
        return None
    case.evidence.update({"per-rank values": values, SHARES: True})
    shown = ", ".join(f"{v:.6g}" for v in values)
    return (
        f"the ranks' values ({shown}) add up to the single-process {case.single:.6g}, and the mean sync gives their "
        f"mean {case.measured:.6g}: each rank holds a share of one whole-set value (as a sum over the rank's own "
        "samples divided by the whole set's count would), so averaging the shares divides the whole by "
        f"W={case.world_size}; a per-sample mean divides each rank's sum by the rank's own count",
        [],
    )


def _rank_means_differ(case: _Case) -> Optional[tuple]:
    """A value logged once per rank at epoch end whose synced mean is the ranks' unweighted mean (not where
    :func:`_rank_shares` showed the values to be shares of one sum)."""
    per_rank = case.per_rank
    if case.evidence.get(SHARES):
        return None
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
            hazards.cause("unweighted_rank_mean", samples=found[1]),
            ["unweighted_rank_mean"],
        )
    shown, why = found
    reads = case.reads_rank
    if not reads:
        return hazards.cause("non_decomposable", shown=shown, why=why), ["non_decomposable"]
    where = "; ".join(f"{site} reads {', '.join(names)}" for site, names in reads)
    return (
        f"unknown: {shown}. Candidates: (1) the value depends on the rank: for: {where}; against: nothing "
        f"recorded. (2) non-decomposable ({why}): for: the same samples and weights give another average; "
        "against: a value that depends on the rank gives another average too",
        [],
    )


#: The rules of :func:`differs_cause`, in the order their causes are reported.
_RULES = (
    _unsharded,
    _repeated,
    _floored_count,
    _missing_samples,
    _missing_synced_right,
    _int64_reduce,
    _bool_reduce,
    _already_whole,
    _rank_shares,
    _non_decomposable,
)


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
    *,
    collectives: list = (),
    hooks: list = (),
) -> tuple:
    """Why a synced epoch value differs from single-process, from what the ranks recorded.

    Args:
        world_logs: per rank, the ``log`` trace events of the W=N run; ``single_logs``: those at W=1.
        counts: the :class:`~ddpprobe.audit.evidence._counts.Counts` of the key's loop, or None.

    Returns:
        ``(cause, fixes, evidence)``. A cause is named only when the records prove it (each rule of
        ``_RULES``): duplicated samples that the ranks really ran (padding) or every rank running every
        sample (unsharded); the floored count of the upstream bug when recomputing the synced mean from the
        logged values and batch sizes with a floored count gives the measured value and the correct count
        does not; samples no rank ran when the single-process value recomputed without them is the measured
        one; a non-decomposable metric when the ranks ran exactly the single process's samples with the
        same weights and the per-batch (or per-rank) values still average to another number, unless the
        logging code reads the rank (then ``unknown`` with both candidates). Otherwise ``"unknown"``, with
        the evidence. ``fixes`` are the names of the registry entries (ddpprobe/hazards/) the rules proved.

    Keyword args:
        collectives: each W=N rank's traced collectives (an integer ``strategy.reduce`` in the key's hook).
        hooks: the hooks the key was logged from.
    """
    evidence = {"measured": measured, "single-process": single}
    if counts is not None:
        evidence.update(
            {
                "samples per rank": counts.samples,
                "batches per rank": counts.batches,
                "duplicates": counts.duplicates if counts.identified else "unknown",
                "missing samples": counts.missing_vs_single,
                "sampler": counts.sampler,
            }
        )
    evidence["sync_dist"] = any(c["sync_dist"] for c in calls)
    evidence["metric_object"] = any(c["metric_object"] for c in calls)
    per_rank = [[e for e in epoch_logs(logs, name) if e["on_epoch"]] for logs in world_logs]
    single_key = [e for e in epoch_logs(single_logs, name) if e["on_epoch"]]
    case = _Case(
        name,
        calls,
        measured,
        single,
        per_rank,
        single_key,
        counts,
        world_size,
        rtol,
        atol,
        evidence,
        [list(r) for r in collectives],
        list(hooks),
    )
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
    if not fixes and not case.evidence.get(SHARES) and not any(c.startswith("unknown") for c in causes):
        shown = hazards.evidence_text({k: v for k, v in evidence.items() if not isinstance(v, bool)})
        causes.insert(0, f"unknown: the evidence of no registry entry holds ({shown})")
    return "; ".join(causes), list(dict.fromkeys(fixes)), evidence
