"""The ranks' collective sequences (Python-level calls, or the backend's own with the Flight Recorder) and the
first point where they stop matching. Pure Python, on recorded events."""

from __future__ import annotations

from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.evidence._culprit import diagnose
from ddpprobe.hazards._match import KEYS, MISMATCH, ORDER, PURPOSE, compared, differing_kinds
from ddpprobe.trace import describe_collective

#: Flight Recorder dtype names (c10's) in torch's spelling, as the Python-level trace writes them.
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}


#: The fields a Flight Recorder entry takes from the Python-level call that covers it.
_OWNER_FIELDS = (
    "source",
    "key",
    "sync",
    "metric",
    "states",
    "state_sizes",
    "hook",
    "running",
    "call_site",
    "origin",
    "call",
    "call_kind",
    "loop_step",
    "callback",
)


def _op(name: Optional[str]) -> str:
    return (name or "?").split(":", 1)[-1]


def sequence(rank: dict, use_flight_recorder: bool) -> list:
    """The rank's collectives in the order the backend ran them, each as ``{"op", "dtype", "shape",
    "source", "key", "metric", "hook", "call_site", "status"}``.

    With the Flight Recorder's entries the sequence is the backend's (``all_gather_object`` is two
    ``all_gather``\\ s, and the DDP reducer's gradient all_reduces appear, with ``source``
    ``"internal"``); each entry takes the key, hook and call site of the Python-level call whose
    process-group sequence numbers cover it. Without them it is the Python-level calls.
    """
    python = rank["collectives"]
    if not use_flight_recorder:
        return [dict(c) for c in python]
    covering = []
    for call in python:
        start = call.get("pg_seq")
        end = call.get("pg_seq_after")
        covering.append((start, start + 1 if end is None and start is not None else end, call))
    out = []
    for entry in sorted(rank["flight_recorder"] or [], key=lambda e: e.get("collective_seq_id") or 0):
        seq = entry.get("collective_seq_id")
        owner = None
        for start, end, call in covering:
            if start is not None and end is not None and start < seq <= end:
                owner = call
        op = _op(entry.get("profiling_name"))
        shapes = entry.get("input_sizes") or []
        dtype = (entry.get("input_dtypes") or [None])[0]
        item = {
            "op": op,
            "dtype": _DTYPES.get(dtype, dtype),
            "shape": shapes[0] if shapes else None,
            "source": "internal",
            "key": None,
            "metric": None,
            "hook": None,
            "call_site": None,
            "status": "done",
        }
        if owner is not None:
            item.update({k: owner.get(k) for k in _OWNER_FIELDS})
            item["status"] = owner["status"]
        out.append(item)
    return out


def _divergence(kind: str, index: int, entries: list, message: str, ranks=None, absent=()) -> dict:
    return {
        "kind": kind,
        "index": index,
        "ranks": list(range(len(entries))) if ranks is None else ranks,
        "absent": list(absent),
        "entries": entries,
        "message": f"collective #{index} of the run: {message}",
    }


def _missing(i: int, entries: list, sequences: list, ended: list) -> Optional[dict]:
    """Some ranks have no collective at ``i``: they never entered the one the others entered."""
    present = [r for r, e in enumerate(entries) if e is not None]
    absent = [r for r, e in enumerate(entries) if e is None]
    if not absent:
        return None
    states = {"end": "its stage finished", "raised": "its stage raised", None: "it ended without finishing its stage"}
    why = []
    for r in absent:
        last = describe_collective(sequences[r][-1]) if sequences[r] else "none"
        why.append(f"rank {r} never entered it ({states[ended[r]]}; its last collective: {last})")
    waiting = [r for r in present if entries[r].get("status") != "done"]
    message = (
        f"rank(s) {present} entered {describe_collective(entries[present[0]])}; "
        + "; ".join(why)
        + (f"; rank(s) {waiting} waited there" if waiting else "")
    )
    return _divergence("missing", i, entries, message, ranks=present, absent=absent)


def _mismatch(i: int, entries: list, kinds: set) -> Optional[dict]:
    """The ranks called different collectives at ``i``: a field of the kind ``MISMATCH`` of what must match
    (ddpprobe/hazards/_match.py: op, reduce op, dtype, shape, group, root, list lengths) differs."""
    if MISMATCH not in kinds:
        return None
    parts = [f"rank {r}: {describe_collective(e)}" for r, e in enumerate(entries)]
    return _divergence("mismatch", i, entries, "the ranks called different collectives: " + "; ".join(parts))


def _synced(entries: list) -> bool:
    """A reduction (not a barrier) in which a logged value or a Metric's state takes part."""
    return entries[0]["op"] != "barrier" and any(e.get("source") in ("self.log", "torchmetrics") for e in entries)


def _keys(i: int, entries: list, kinds: set) -> Optional[dict]:
    """The same collective carrying different logged keys at ``i``: every rank's entry syncs a logged key (a
    logged key paired with a collective of another kind serves another purpose: :func:`_purpose`)."""
    if KEYS not in kinds or not _synced(entries) or not all(e.get("key") for e in entries):
        return None
    parts = [f"rank {r}: {describe_collective(e)}" for r, e in enumerate(entries)]
    message = (
        f"the same {entries[0]['op']} carries different keys, so each rank's value is reduced with another "
        "key's: " + "; ".join(parts)
    )
    return _divergence("keys", i, entries, message)


def _purpose(i: int, entries: list, kinds: set) -> Optional[dict]:
    """The same collective made for different purposes at ``i`` (a step and an epoch sync of one key, a
    ``self.log`` sync and a Metric's or the user's own collective)."""
    if PURPOSE not in kinds or not _synced(entries):
        return None
    parts = [f"rank {r}'s {describe_collective(e)}" for r, e in enumerate(entries)]
    message = (
        f"the same {entries[0]['op']} serves different purposes on the ranks, so they reduce unrelated values "
        "together: " + " paired with ".join(parts)
    )
    return _divergence("purpose", i, entries, message)


def _order(i: int, entries: list, kinds: set) -> Optional[dict]:
    """The user's own collectives of the same kind from different lines of their code at ``i``: each rank's value
    is reduced with what another line meant (the same calls in another order on each rank)."""
    if ORDER not in kinds:
        return None
    parts = [f"rank {r}: {describe_collective(e)}" for r, e in enumerate(entries)]
    message = (
        f"the same {entries[0]['op']} comes from different lines of your code on the ranks, so each line's value is "
        "reduced with another line's: " + "; ".join(parts)
    )
    return _divergence("order", i, entries, message)


def first_divergence(sequences: list, ended: list) -> Optional[dict]:
    """The first position where the ranks' collective sequences stop matching, or None.

    Args:
        sequences: per rank, what :func:`sequence` returns.
        ended: per rank, how its stage ended (``"end"``, ``"raised"`` or None: killed or still running).

    Returns:
        ``{"kind", "index", "ranks", "absent", "entries", "message"}``; ``kind`` is ``"missing"`` (some
        ranks never entered the collective the others entered: those wait; ``ranks`` the ranks that did,
        ``absent`` the others), ``"mismatch"`` (different op, dtype or shape at the same position),
        ``"keys"`` (the same op, dtype and shape logged under different keys on different ranks: the
        values of one key are reduced with another's; the run can finish and be wrong) or ``"purpose"``
        (the same op, dtype and shape made for different purposes: a step sync with an epoch sync of one
        key, a ``self.log`` sync with a Metric's or the user's own collective) or ``"order"`` (the user's own
        collectives from different lines of their code). The fields compared are ddpprobe/hazards/_match.py's,
        which the guard compares too; a purpose or key difference is named only in a reduction that carries a
        logged value or a Metric's state. ``entries`` holds each rank's entry (None where it has none).
    """
    for i in range(max((len(s) for s in sequences), default=0)):
        entries = [s[i] if i < len(s) else None for s in sequences]
        found = _missing(i, entries, sequences, ended)
        if found is not None:
            return found
        kinds = differing_kinds([compared(e) for e in entries])  # once per position, read by each kind's check
        if not kinds:
            continue
        for check in (_mismatch, _keys, _purpose, _order):
            found = check(i, entries, kinds)
            if found is not None:
                return found
    return None


def trace_summary(world: list, stage: str = "validate", shards: Optional[dict] = None) -> dict:
    """The JSON form of the W=N traces: per rank, its Python-level collectives, its Flight Recorder
    entries' count, how its stage ended; and the first divergence with the cause :func:`diagnose` finds
    (``first_divergence["diagnosis"]``); ``shards``: ``{loop: [batches in each rank's shard]}`` where recorded;
    ``first_error``: :func:`first_own_error`."""
    use_fr = all(rank["flight_recorder"] for rank in world)
    sequences = [sequence(rank, use_fr) for rank in world]
    ended = [rank["stage"] for rank in world]
    divergence = first_divergence(sequences, ended)
    if divergence is not None:
        divergence["diagnosis"] = diagnose(divergence, world, sequences, stage, shards)
    return {
        "level": "flight_recorder" if use_fr else "python",
        "ranks": [
            {
                "collectives": rank["collectives"],
                "stage": rank["stage"],
                "stage_error": rank["stage_error"],
                "flight_recorder_entries": None if rank["flight_recorder"] is None else len(rank["flight_recorder"]),
                "flight_recorder_unavailable": rank["flight_recorder_unavailable"],
            }
            for rank in world
        ],
        "first_divergence": divergence,
        "lone_reads": lone_reads(world),
        "first_error": first_own_error(world),
    }


def first_own_error(world: list) -> Optional[dict]:
    """The rank whose own code raised first, outside any collective: ``{"rank", "error"}``, or None. A rank whose
    stage raised while one of its collectives raised or never returned was waiting for its peers: its error is a
    consequence, not a cause; among the others, the earliest error (the trace's time of the ``stage`` event) is
    the cause."""
    candidates = []
    for r, rank in enumerate(world):
        if rank.get("stage") != "raised":
            continue
        if any(c.get("status") in ("raised", "pending") for c in rank.get("collectives") or []):
            continue
        t = rank.get("stage_error_t")
        candidates.append((t if t is not None else float("inf"), r, rank.get("stage_error")))
    if not candidates:
        return None
    _, r, error = min(candidates)
    return {"rank": r, "error": error}


def lone_reads(world: list) -> list:
    """Reads of the logged metrics (``trainer.callback_metrics`` and the like: ``ddpprobe.hazards.reads_metrics``)
    that ran an epoch sync on some ranks only, whether or not the ranks' collectives diverged afterwards (the
    other ranks' own epoch-end sync of the same key can pair with it and give the right value, by luck):
    ``[{"call_site", "call", "key", "op", "ranks"}]`` per call site and key, in first-seen order."""
    found: dict = {}
    for r, rank in enumerate(world):
        for c in rank["collectives"]:
            if c.get("op") == "barrier" or not hazards.reads_metrics(c):
                continue
            entry = found.setdefault(
                (c.get("call_site"), c.get("key")),
                {
                    "call_site": c.get("call_site"),
                    "call": c.get("call"),
                    "key": c.get("key"),
                    "op": c["op"],
                    "ranks": [],
                },
            )
            if r not in entry["ranks"]:
                entry["ranks"].append(r)
    return [e for e in found.values() if len(e["ranks"]) < len(world)]
