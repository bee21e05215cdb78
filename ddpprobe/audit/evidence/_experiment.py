"""Verdicts of the values a module writes to ``self.logger.experiment`` itself (``add_scalar(tag, value, ...)``):
only rank 0's reach the logger, so each rank's value is compared with the others' and with the single
process. Pure Python."""

from __future__ import annotations

import collections

from ddpprobe import hazards
from ddpprobe.audit.evidence._values import close

#: Verdicts of the values a module writes to ``self.logger.experiment`` itself.
EXPERIMENT_DIVERGENT = "rank-divergent: each rank wrote its own value, the logger got rank 0's"
EXPERIMENT_DIFFERS = "equal on every rank, differs from single-process"
EXPERIMENT_EQUAL = "equals single-process"
EXPERIMENT_LOCAL = "equal on every rank, not synced: each rank wrote its own value"


def _experiment_values(calls: list) -> dict:
    """``{(method, tag, occurrence): (value, hook)}`` of ``logger.experiment`` calls whose first argument is
    a name and second a number (``add_scalar(tag, value, step)``)."""
    out, seen = {}, collections.Counter()
    for call in calls:
        args = call.get("args") or []
        if (
            len(args) >= 2
            and isinstance(args[0], str)
            and isinstance(args[1], (int, float))
            and not isinstance(args[1], bool)
        ):
            key = (call["method"], args[0])
            out[(call["method"], args[0], seen[key])] = (float(args[1]), call.get("hook"))
            seen[key] += 1
    return out


def _divergent(tag: str, hook, values: list, collectives_per_rank: list) -> tuple:
    """Each rank wrote its own value: ``(verdict, cause, fixes)``."""
    in_hook = [
        [c for c in rank if c.get("hook") == hook and c.get("source") in ("user", "torchmetrics")]
        for rank in collectives_per_rank
    ]
    shown = ", ".join(format(v, ".6g") for v in values if v is not None)
    cause = hazards.cause("experiment_rank_local", tag=tag, hook=hook, values=shown)
    if hook and not any(in_hook):
        cause += (
            f"; no rank ran a collective in {hook}, so each value was computed from that rank's own outputs "
            "(its shard of the data)"
        )
    return EXPERIMENT_DIVERGENT, cause, ["experiment_rank_local"]


def _differs(counts: dict) -> tuple:
    """The ranks agree but differ from the single process: ``(verdict, cause, fixes)``, the cause proven
    only by samples the ranks really repeated."""
    dup = [c for c in counts.values() if c.get("duplicates") and not c.get("unsharded")]
    if not dup:
        return EXPERIMENT_DIFFERS, "unknown: the ranks agree but not with the single process", []
    cause = (
        f"the ranks wrote the same value, computed over {sum(dup[0]['samples'])} samples of which "
        f"{dup[0]['duplicates']} repeat"
    )
    return EXPERIMENT_DIFFERS, cause, ["repeated_samples"]


def experiment_rows(worlds, rtol: float = 1e-5, atol: float = 1e-6) -> list:
    """One row per value the module wrote to ``self.logger.experiment`` (``add_scalar(tag, value, ...)``),
    comparing what each rank's code wrote (only rank 0's reaches the logger) with the single process.

    Args:
        worlds: the audit's :class:`~ddpprobe.audit.worlds._worlds.Worlds`: the W=1 rank's and each W=N rank's
            ``experiment_attempts``, each W=N rank's traced collectives (to say whether any ran in the hook),
            the W=N counts, and the ``self.all_gather`` calls that returned non-tensor leaves unchanged (a
            value written from their hook gets no all_gather fix).

    Returns:
        ``[{"method", "tag", "hook", "single", "per_rank", "verdict", "cause", "hazards", "fixes", "evidence",
        "problem"}]``: ``hazards`` the registry entries the evidence proves, ``fixes`` those whose
        preconditions hold.
    """
    single_calls = worlds.single.records[0].get("experiment_attempts") or []
    world_calls = [rec.get("experiment_attempts") or [] for rec in worlds.records]
    collectives_per_rank = worlds.collectives
    counts = {kind: c.to_dict() for kind, c in worlds.counts.items()}
    unmoved = worlds.unmoved
    single = _experiment_values(single_calls)
    per_rank = [_experiment_values(calls) for calls in world_calls]
    keys = list(dict.fromkeys(k for values in [single, *per_rank] for k in values))
    out = []
    for key in keys:
        method, tag, occurrence = key
        values = [values.get(key, (None, None))[0] for values in per_rank]
        hook = next((v[key][1] for v in [*per_rank, single] if key in v and v[key][1]), None)
        single_value = single.get(key, (None, None))[0]
        known = [v for v in values if v is not None]
        if known and not all(close(v, known[0], rtol, atol) for v in known):
            verdict, cause, fixes = _divergent(tag, hook, values, collectives_per_rank)
        elif single_value is not None and known and not close(known[0], single_value, rtol, atol):
            verdict, cause, fixes = _differs(counts)
        else:
            verdict, cause, fixes = EXPERIMENT_EQUAL, "", []
        out.append(
            {
                "method": method,
                "tag": tag,
                "occurrence": occurrence,
                "hook": hook,
                "single": single_value,
                "per_rank": values,
                "verdict": verdict,
                "cause": cause,
                "hazards": fixes,
                "problem": verdict != EXPERIMENT_EQUAL,
            }
        )
    # Values written from a hook where other values are rank-divergent and no rank ran a collective come
    # from the same rank-local outputs, even where the ranks happen to agree.
    local_hooks = {
        row["hook"]
        for row in out
        if row["verdict"] == EXPERIMENT_DIVERGENT and "no rank ran a collective" in row["cause"]
    }
    for row in out:
        if row["hook"] in local_hooks and row["verdict"] != EXPERIMENT_DIVERGENT:
            row.update(
                verdict=EXPERIMENT_LOCAL,
                problem=True,
                hazards=["experiment_rank_local"],
                cause=(
                    f"written in {row['hook']} from the same rank-local outputs as the rank-divergent values "
                    "(no rank ran a collective there); on this data the ranks' values happen to agree"
                ),
            )
    for row in out:
        _unmoved_note(row, unmoved)
        evidence = {
            "per-rank values": row["per_rank"],
            "hook": row["hook"],
            "unmoved": bool(row.get("unmoved")),
            "duplicates": next((c.get("duplicates") for c in counts.values() if c.get("duplicates")), 0),
        }
        row["evidence"] = evidence
        row["fixes"] = [h for h in row["hazards"] if hazards.HAZARDS[h].applies(evidence)]
    return out


def _unmoved_note(row: dict, unmoved) -> None:
    """A value written from a hook whose ``self.all_gather`` returned leaves unchanged: say so, and drop the
    all_gather fix (gathering again would not move them either)."""
    from ddpprobe.audit.evidence._counts import unmoved_text

    here = [u for u in unmoved if u["hook"] == row["hook"]]
    if not here or not row["problem"]:
        return
    row["cause"] += "; " + "; ".join(unmoved_text(u) for u in here)
    row["unmoved"] = True
    row["hazards"] = [*row["hazards"], "unmoved_leaves"]
