"""From two worlds' records (W=1 and W=N) to one row per logged key with a verdict. Pure Python: no
torch, no Lightning, so the rules can be read (and tested) on their own."""

from __future__ import annotations

from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.causes._differs import differs_cause
from ddpprobe.audit.causes._kinds import (
    NO_VALUE,
    NO_VALUE_ON_SOME,
    NOT_AT_SINGLE,
    NOT_IN_WORLD,
    PROBLEMS,
    RANK_DIVERGENT,
    RANK_LOCAL_AGREE,
    RANK_LOCAL_DIFFERS,
    RANK_LOCAL_SAME,
    STEP_EQUAL_UNSYNCED,
    STEP_RANK_LOCAL,
    STEP_SYNCED,
    SYNCED_DIFFERS,
    SYNCED_EQUAL,
    TRAINED_APART,
    TRAINED_APART_LOCAL,
    KeyRow,
)
from ddpprobe.audit.causes._proven import Proof, proven
from ddpprobe.audit.causes._rank_local import _not_stored, _rank_divergent, _some_ranks_only, _synced_by
from ddpprobe.audit.evidence._keys import _Inputs, _Key
from ddpprobe.audit.evidence._values import _step_values, applicable, as_float, loader_kind


def _trained_apart_cause(ins: _Inputs) -> str:
    steps = ins.reference.steps
    made = f" (W=1 made {steps[0]} optimizer steps, W={ins.world_size} {steps[1]})" if None not in steps else ""
    return (
        f"every rank holds the same value; the weights trained apart{made}, so a single process trained other "
        "weights and its value is not compared"
    )


def _unsynced(ins: _Inputs, key: _Key) -> bool:
    """Nothing synced the key: neither ``sync_dist=True`` nor a Metric, and no rank ran a collective of the
    module's own in the key's hooks (the trace's ``source`` ``"user"``)."""
    if len(ins.world) < 2 or key.sync_dist or key.metric_object:
        return False
    return not any(c.get("hook") in key.hooks and c.get("source") == "user" for rank in ins.collectives for c in rank)


def synced_in_trace(ins: _Inputs, key: _Key, sync: Optional[str] = None) -> bool:
    """Some rank's trace holds the collective that synced the key: ``self.log``'s sync of that key (of the step
    value or the epoch value when ``sync`` says which) or a torchmetrics state sync logged under it."""
    for rank in ins.collectives:
        for c in rank:
            if c.get("source") == "self.log" and c.get("key") == key.name and sync in (None, c.get("sync")):
                return True
            if c.get("source") == "torchmetrics" and (c.get("key") == key.name or c.get("hook") in key.hooks):
                return True
    return False


def _unshown_sync(ins: _Inputs, key: _Key) -> str:
    """For a key whose flags promise a sync (``sync_dist=True`` or a Metric) that no rank's trace shows: the
    sentence giving the ``self.log`` call's recorded arguments, else ""."""
    if len(ins.world) < 2 or not (key.sync_dist or key.metric_object) or synced_in_trace(ins, key):
        return ""
    call = key.calls[0]
    args = ", ".join(
        f"{k}={call.get(k)!r}" for k in ("sync_dist", "reduce_fx", "on_step", "on_epoch", "rank_zero_only")
    )
    text = f"no rank's trace shows a collective that synced it, although its self.log call asks for it ({args})"
    if key.sync_dist and any(c.get("rank_zero_only") for c in key.calls):
        text += (
            ": rank_zero_only=True turns the sync off (Lightning's _Sync makes no collective for a value logged with "
            "rank_zero_only=True, whatever sync_dist says: pytorch_lightning/trainer/connectors/logger_connector/"
            "result.py _Sync.__call__)"
        )
    return text


def _divergent_though_asked(ins: _Inputs, key: _Key, found: tuple) -> tuple:
    """A rank-divergent key whose flags ask for a sync the trace lacks: the sentence naming what turned it off
    (:func:`_unshown_sync`) comes first, and "sync_dist=True gives it" (``rank_local_mean``, whose fix is the
    argument the call already passes) is said as what the sync the call asks for would give, without that fix."""
    unshown = _unshown_sync(ins, key)
    if not unshown:
        return found
    verdict, cause, names, evidence = found
    if "rank_local_mean" in names:
        names = [n for n in names if n != "rank_local_mean"]
        cause = (
            "each rank keeps its own shard's value; the logger writes rank 0's value only; the mean of the ranks' "
            "values equals single-process, so the sync the call asks for would give it"
        )
    return verdict, f"{unshown}; {cause}", names, evidence


def _padding_coincidence(key: _Key) -> str:
    c = key.counts
    if c is None or not c.identified or not c.duplicates or c.unsharded:
        return ""
    return (
        f"equals single-process although the ranks ran {c.duplicates} repeated sample(s) (DistributedSampler's "
        "padding): the repeats happen not to change this value"
    )


def _agreeing(ins: _Inputs, key: _Key, reference: dict, ref_logs: list) -> tuple:
    """The ranks agree: equal to single-process, differing from it (with the cause), or not compared."""
    if reference is None:
        if _unsynced(ins, key):
            return TRAINED_APART_LOCAL, _synced_by(ins, key), [], {}
        return TRAINED_APART, _trained_apart_cause(ins), [], {}
    if not key.ref_calls:
        return NOT_AT_SINGLE, "", [], {}
    if ins.close(key.per_rank[0], key.single):
        return SYNCED_EQUAL, _padding_coincidence(key), [], {}
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
        collectives=ins.collectives,
        hooks=key.hooks,
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
        return _divergent_though_asked(ins, key, _rank_divergent(ins, key))
    verdict, cause, fixes, evidence = _agreeing(ins, key, reference, ref_logs)
    if verdict in (SYNCED_EQUAL, SYNCED_DIFFERS) and _unsynced(ins, key):
        return _rank_local_agreeing(ins, key, ref_logs, (verdict, cause, fixes, evidence))
    if verdict in (SYNCED_EQUAL, SYNCED_DIFFERS) and not (key.sync_dist or key.metric_object) and len(ins.world) > 1:
        cause = _synced_by(ins, key) + ("; " + cause if cause else "")
    unshown = _unshown_sync(ins, key) if verdict in (SYNCED_EQUAL, SYNCED_DIFFERS) else ""
    if unshown:
        cause = unshown + ("; " + cause if cause else "")
    return verdict, cause, fixes, evidence


def _constant(ins: _Inputs, key: _Key, ref_logs: Optional[list]) -> Optional[float]:
    """The one value every log event of the key held, on every rank and at W=1, or None where the events'
    values differ or are unknown."""
    values = [e.get("value") for logs in [*ins.world_logs, ref_logs or []] for e in logs if e["key"] == key.name]
    if not values or any(v is None for v in values) or not all(ins.close(v, values[0]) for v in values):
        return None
    return values[0]


def _rank_local_agreeing(ins: _Inputs, key: _Key, ref_logs: Optional[list], found: tuple) -> tuple:
    """The verdict of a key nothing synced whose ranks agree (``found``: ``_agreeing``'s): the same constant
    in every batch (``RANK_LOCAL_SAME``, and equal to W=1's: no chance in it), else agreeing by chance, equal
    to single-process or not (with the cause of the difference)."""
    verdict, cause, fixes, evidence = found
    constant = _constant(ins, key, ref_logs)
    if verdict == SYNCED_EQUAL and constant is not None:
        return (
            RANK_LOCAL_SAME,
            f"not synced (no sync_dist=True, not a Metric, no collective in its hook), but every rank and the "
            f"single process logged {constant:.6g} in every batch",
            [],
            {},
        )
    cause = _synced_by(ins, key) + ("; " + cause if cause else "")
    return (RANK_LOCAL_AGREE if verdict == SYNCED_EQUAL else RANK_LOCAL_DIFFERS), cause, fixes, evidence


def _with_unmoved(ins: _Inputs, key: _Key, found: tuple) -> tuple:
    """``found`` with the ``self.all_gather`` calls of the key's hooks that returned leaves unchanged named
    in the cause (for a key that is not synced by ``sync_dist`` or a Metric)."""
    from ddpprobe.audit.evidence._counts import unmoved_text

    verdict, cause, names, evidence = found
    here = [u for u in ins.unmoved if u["hook"] in key.hooks]
    if not here or key.sync_dist or key.metric_object:
        return found
    cause = "; ".join([cause, *(unmoved_text(u) for u in here)]).lstrip("; ")
    evidence = {**evidence, "call site": here[0]["call_site"], "leaves": here[0]["leaves"], "ranks": here[0]["ranks"]}
    return verdict, cause, [*names, "unmoved_leaves"], evidence


def _with_arithmetic(ins: _Inputs, key: _Key, verdict: str, cause: str) -> str:
    """``cause`` with the relation of the ranks' recorded values that gives the key's value (ddpprobe/audit/
    _arithmetic.py), for a key that differs from single-process or between the ranks."""
    from ddpprobe.audit.evidence import _arithmetic

    text = ""
    if verdict == SYNCED_DIFFERS and key.per_rank and key.per_rank[0] is not None:
        if key.sync_dist and not key.metric_object:
            reduce_fx = str(key.calls[0].get("reduce_fx") or "mean")
            text = _arithmetic.explain_synced(
                key.per_rank[0], ins.world_logs, ins.collectives, key.name, reduce_fx, ins.close
            )
        elif not key.metric_object:
            text = _arithmetic.explain_own_collective(key.per_rank[0], ins.collectives, key.hooks, ins.close)
    elif verdict in (RANK_DIVERGENT, RANK_LOCAL_DIFFERS) and key.single is not None:
        text = _arithmetic.explain_single(key.single, key.per_rank, ins.close)
    if not text or text in cause:
        return cause
    return f"{cause}; {text}" if cause else text


def _step_row(ins: _Inputs, key: _Key, ref_logs: Optional[list]) -> Optional[KeyRow]:
    """The row of a key's step values (``on_step=True``), or None when no rank logged one."""
    steps = [_step_values(logs, key.name) for logs in ins.world_logs]
    if not any(steps):
        return None
    single_steps = _step_values(ref_logs or [], key.name)
    n = min(len(s) for s in steps)
    lengths = [len(s) for s in steps]
    cause, names = "", []
    if all(all(ins.close(a, b) for a, b in zip(s[:n], steps[0][:n])) for s in steps):
        verdict = STEP_SYNCED if synced_in_trace(ins, key, "step") or len(ins.world) < 2 else STEP_EQUAL_UNSYNCED
        if verdict == STEP_EQUAL_UNSYNCED:
            cause = _synced_by(ins, key)
        elif len(set(lengths)) > 1:
            cause = (
                f"the ranks logged {lengths} steps: the {n} steps every rank ran are synced; the extra steps' "
                "syncs had no partner step on the other ranks (see the collective trace)"
            )
    else:
        verdict = STEP_RANK_LOCAL
        differing = next((i for i in range(n) if not all(ins.close(s[i], steps[0][i]) for s in steps)), n)
        values = [s[differing] if differing < len(s) else None for s in steps]
        if key.metric_object:
            cause, names = hazards.cause("metric_step_local", step=differing, values=values), ["metric_step_local"]
        else:
            cause = (
                f"at step {differing} the ranks logged {values}: each rank's step value is its own batch's, and "
                "Lightning's logger writes rank 0's"
            )
    problem = verdict == STEP_RANK_LOCAL and (key.sync_dist or key.metric_object)
    evidence = {"steps per rank": lengths, "metric_object": key.metric_object}
    return KeyRow(
        **key.common(),
        single=single_steps[-1] if single_steps else None,
        per_rank=[s[-1] if s else None for s in steps],
        verdict=verdict,
        cause=cause,
        problem=problem,
        level="step",
        fixes=applicable(names, evidence) if problem else [],
        evidence=evidence,
        hazards=names if problem else [],
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


def rows(worlds, rtol: float = 1e-5, atol: float = 1e-6) -> list:
    """One ``KeyRow`` per key logged in either run, in first-logged order (plus a ``level="step"`` row
    for each key logged with ``on_step=True``).

    Args:
        worlds: the audit's :class:`~ddpprobe.audit.worlds._worlds.Worlds` (its reference run, each W=N rank's
            records, log events, collectives, counts, how its stage ended and the ``all_gather`` leaves
            that came back unchanged).
        rtol, atol: tolerance for "equal" (float32 sums in a different order differ by ~1e-7 relative).
    """
    ins = _Inputs(worlds, rtol, atol)
    proof = getattr(worlds, "proof", None) or Proof()
    reference, world = ins.reference, ins.world
    records = [reference.record, *([reference.same_weights] if reference.same_weights else []), *world]
    names = list(dict.fromkeys(call["name"] for record in records for call in record["log_calls"]))
    out = []
    for name in names:
        key, record, ref_logs = _key(ins, name)
        if key.on_epoch or len(key.logged_on) not in (0, len(world)):
            verdict, cause, names_, evidence = _with_unmoved(ins, key, _epoch_verdict(ins, key, record, ref_logs))
            cause = _with_arithmetic(ins, key, verdict, cause)
            problem = verdict in PROBLEMS
            row = KeyRow(
                **key.common(),
                single=key.single,
                per_rank=key.per_rank,
                verdict=verdict,
                cause=cause,
                problem=problem,
                fixes=applicable(names_, evidence) if problem else [],
                evidence=evidence,
                hazards=names_ if problem else [],
            )
            out.append(proven(row, ins, key, proof))
        if key.on_step and len(key.logged_on) == len(world):
            row = _step_row(ins, key, ref_logs)
            if row is not None:
                out.append(row)
    return out
