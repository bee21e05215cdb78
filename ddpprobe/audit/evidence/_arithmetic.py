"""A logged value explained by arithmetic: which relation of the ranks' own recorded values reproduces it (mean,
weighted mean, sum, max, min, one rank's value), and the collective in the trace that made it.

Two sources of rank-local values: each rank's own epoch value of a key, from its ``self.log`` events (its batch
values weighted by their batch sizes, as Lightning's mean reduction does, or their max / min / sum for those
``reduce_fx``); and the inputs each rank gave a small collective of the module's own (the trace's ``values``).
Pure Python on the W=N ranks' log events and collectives.
"""

from __future__ import annotations

import math
from typing import Callable, Optional


def _rel_close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


def relations(target: float, values: list, weights: Optional[list] = None, close: Callable = _rel_close) -> list:
    """The names of the relations of ``values`` (one per rank) that give ``target``: ``"mean"``, ``"weighted mean"``
    (by ``weights``; only where it differs from the mean), ``"sum"``, ``"max"``, ``"min"``, ``"rank r's value"``.
    Empty when a value is missing or none holds."""
    if target is None or not values or any(v is None for v in values):
        return []
    found = []
    mean = sum(values) / len(values)
    candidates = [("mean", mean)]
    if weights and all(w is not None for w in weights) and sum(weights) > 0:
        weighted = sum(v * w for v, w in zip(values, weights)) / sum(weights)
        if not close(weighted, mean):
            candidates.append(("weighted mean", weighted))
    candidates += [("sum", sum(values)), ("max", max(values)), ("min", min(values))]
    found = [name for name, value in candidates if close(target, value)]
    if len(set(values)) > 1:
        found += [f"rank {r}'s value" for r, v in enumerate(values) if close(target, v)]
    return found


def own_epoch_values(world_logs: list, key: str, reduce_fx: str = "mean") -> tuple:
    """``(values, weights)``: per rank, its own epoch value of ``key`` from its ``self.log`` events (``reduce_fx``
    ``"mean"``: the batch-size weighted mean; ``"max"``, ``"min"``, ``"sum"``: those) and the batch sizes summed
    (None where a rank logged no value)."""
    values, weights = [], []
    from ddpprobe.audit.evidence._values import epoch_logs

    for logs in world_logs:
        events = [e for e in epoch_logs(logs, key) if e.get("value") is not None]
        if not events:
            values.append(None)
            weights.append(None)
            continue
        sizes = [e.get("batch_size") or 1 for e in events]
        numbers = [e["value"] for e in events]
        if reduce_fx in ("max", "min", "sum"):
            values.append({"max": max, "min": min, "sum": sum}[reduce_fx](numbers))
        else:
            values.append(sum(v * s for v, s in zip(numbers, sizes)) / sum(sizes))
        weights.append(sum(sizes))
    return values, weights


#: The relations a ``self.log`` sync with each ``reduce_fx`` can give (Lightning's mean is weighted by batch size).
_SYNC_GIVES = {"mean": ("mean", "weighted mean"), "sum": ("sum",), "max": ("max",), "min": ("min",)}
#: The relation each ``torch.distributed`` reduce op computes.
_OP_GIVES = {"SUM": "sum", "MAX": "max", "MIN": "min", "AVG": "mean"}


def _relation_value(name: str, values: list, weights: Optional[list]) -> float:
    if name == "weighted mean" and weights and sum(weights) > 0:
        return sum(v * w for v, w in zip(values, weights)) / sum(weights)
    return {"mean": sum(values) / len(values), "sum": sum(values), "max": max(values), "min": min(values)}.get(
        name, sum(values) / len(values)
    )


def _numbers(values: list) -> str:
    return "[" + ", ".join(format(v, ".6g") for v in values) + "]"


def explain_synced(target: float, world_logs: list, collectives: list, key: str, reduce_fx: str, close) -> str:
    """For a key synced by ``self.log``: ``"the logged X is the <relation> of the ranks' own values [..] (made by
    <collective>)"``, or "" where no relation holds."""
    values, weights = own_epoch_values(world_logs, key, reduce_fx)
    found = [
        r
        for r in relations(target, values, weights, close)
        if r in _SYNC_GIVES.get(reduce_fx, ("mean", "weighted mean"))
    ]
    if any(v is None for v in values):
        return ""
    if not found:
        expected = _SYNC_GIVES.get(reduce_fx, ("mean", "weighted mean"))[-1]
        return (
            f"the ranks' own values {_numbers(values)} do not give the logged {target:.6g} by the sync's reduce_fx "
            f"{reduce_fx!r} (their {expected} is {_relation_value(expected, values, weights):.6g}): the sync reduced "
            "other values than the ranks' own epoch values (cause not shown)"
        )
    made = next(
        (
            f"{c['op']} {c.get('reduce_op') or ''}".rstrip() + f" (self.log's {c.get('sync') or ''} sync of {key!r})"
            for rank in collectives
            for c in rank
            if c.get("source") == "self.log" and c.get("key") == key and c.get("op") != "barrier"
        ),
        "no collective in the trace",
    )
    weighting = f" (weights: their batch sizes {weights})" if "weighted mean" in found[0] else ""
    return (
        f"the logged {target:.6g} is the {found[0]} of the ranks' own values {_numbers(values)}{weighting}, made by "
        f"{made}"
    )


def explain_own_collective(target: float, collectives: list, hooks: list, close) -> str:
    """For a key whose ranks agree through a collective of the module's own in its hook: ``"the logged X is what
    <op> <reduce_op> at <line> returned: the <relation> of the ranks' inputs [..]"``, or "" where the trace holds
    no such collective whose output is the logged value."""
    firsts = [
        [c for c in rank if c.get("source") == "user" and c.get("hook") in hooks and c.get("values")]
        for rank in collectives
    ]
    if not firsts or not all(firsts):
        return ""
    for index, c in enumerate(firsts[0]):
        out = c.get("values_out") or []
        if not out or not close(out[0], target):
            continue
        inputs = [rank[index]["values"][0] if index < len(rank) else None for rank in firsts]
        if any(v is None for v in inputs):
            return ""
        found = relations(target, inputs, None, close)
        gives = _OP_GIVES.get(c.get("reduce_op") or "")
        if c.get("op") == "all_reduce" and gives:
            found = [f for f in found if f == gives]
        relation = (
            f": the {found[0]} of the ranks' inputs {_numbers(inputs)}"
            if found
            else f" from the inputs {_numbers(inputs)}"
        )
        op = f"{c['op']} {c.get('reduce_op') or ''}".rstrip()
        mean = f"; their mean is {sum(inputs) / len(inputs):.6g}" if "mean" not in (found[:1] or [""])[0] else ""
        return f"the logged {target:.6g} is what {op} at {c.get('call_site')} returned{relation}{mean}"
    return ""


def explain_single(single: float, per_rank: list, close) -> str:
    """For a key whose ranks differ: ``"the single-process X is the <relation> of the ranks' values"`` (a count
    logged without a sync is the sum of the ranks'), or ""."""
    found = [f for f in relations(single, per_rank, None, close) if not f.startswith("rank ")]
    if not found:
        return ""
    return f"the single-process {single:.6g} is the {found[0]} of the ranks' values {_numbers(per_rank)}"
