"""What the ranks' traces prove: per-rank counts of batches and samples, duplicates across ranks, and the
first point where the ranks' collective sequences diverge. Pure Python (no torch, no Lightning): it reads
the events of ddpprobe/probes/trace.py, so its rules can be read and tested on their own."""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

from ddpprobe.probes.trace import describe_collective

#: The loop (``batch`` event ``stage``) whose samples a stage's keys are computed from.
STAGE_LOOP = {"validate": "val", "test": "test", "predict": "predict", "fit": "train"}


def split(events: list) -> dict:
    """Group one rank's trace events: ``collectives`` (each with ``status`` ``"done"``, ``"raised"``
    (and ``error``) or ``"pending"``: entered and never left), ``logs``, ``batches``, ``flight_recorder``
    (entries, or None when not written), ``stage`` (``"end"``, ``"raised"``, or None: the rank never
    finished its stage) and ``stage_error``."""
    collectives, by_seq, logs, batches = [], {}, [], []
    out = {
        "collectives": collectives,
        "logs": logs,
        "batches": batches,
        "flight_recorder": None,
        "flight_recorder_unavailable": None,
        "stage": None,
        "stage_error": None,
    }
    for event in events:
        kind = event.get("event")
        if kind == "collective":
            entry = {k: v for k, v in event.items() if k not in ("event", "t")}
            entry["status"] = "pending"
            by_seq[event["seq"]] = entry
            collectives.append(entry)
        elif kind in ("done", "raised") and event.get("seq") in by_seq:
            by_seq[event["seq"]]["status"] = kind
            by_seq[event["seq"]]["pg_seq_after"] = event.get("pg_seq")
            if kind == "raised":
                by_seq[event["seq"]]["error"] = event.get("error")
        elif kind == "log":
            logs.append(event)
        elif kind == "batch":
            batches.append(event)
        elif kind == "flight_recorder":
            out["flight_recorder"] = event.get("entries") or []
            out["flight_recorder_unavailable"] = event.get("unavailable")
        elif kind == "stage" and event.get("status") in ("end", "raised"):
            out["stage"] = event["status"]
            out["stage_error"] = event.get("error")
    return out


# ---------------------------------------------------------------------------------------------------
# Counts
# ---------------------------------------------------------------------------------------------------


def _samples(batches: list) -> list:
    out = []
    for batch in batches:
        if batch.get("ids") is not None:
            out += [("id", i) for i in batch["ids"]]
        elif batch.get("hashes") is not None:
            out += [("hash", h) for h in batch["hashes"]]
    return out


def _label(sample) -> str:
    return str(sample[1]) if sample[0] == "id" else f"#{sample[1][:6]}"


@dataclasses.dataclass(frozen=True)
class Counts:
    """What each rank's loop really ran, for one loop (``"val"``, ``"train"``, ...), in its last run: the
    last epoch of ``fit`` (the one ``callback_metrics`` holds), never the sanity check, which is counted
    apart. A sample counts as repeated only when two ranks ran it in the same run of the loop.

    Attributes:
        loop: the loop's name.
        batches: batches each rank ran, ordered by rank.
        samples: samples each rank ran (sum of batch sizes).
        identified: every batch carried ids or hashable tensors, so samples can be compared across ranks.
        by: ``"id"`` (an id field of the batch) or ``"content"`` (a hash of each sample's tensors).
        duplicates: evaluations beyond the first of a sample, over all ranks (0 when none or unknown).
        duplicated: up to 10 duplicated samples (ids, or ``#hash``) with how often they ran.
        unsharded: every rank ran every sample (W >= 2), i.e. the data was not split across ranks.
        missing_vs_single: samples of the single-process run no rank ran (None when unknown).
        sampler: the sampler Lightning used (type name, rank 0), or None.
        epochs: runs of the loop each rank made, the sanity check not included (``fit``: one per epoch).
        sanity_batches: batches each rank ran in the sanity check (None when there was none).
        missing: up to 10 of the single-process samples no rank ran (ids, or ``#hash``).
    """

    loop: str
    batches: list
    samples: list
    identified: bool
    by: Optional[str]
    duplicates: int
    duplicated: dict
    unsharded: bool
    missing_vs_single: Optional[int]
    sampler: Optional[str]
    epochs: list = dataclasses.field(default_factory=list)
    sanity_batches: Optional[list] = None
    missing: list = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def loop_runs(batches: list, loop: str) -> dict:
    """``{epoch: [batch events]}`` of ``loop``'s runs outside the sanity check, in epoch order."""
    runs: dict = {}
    for batch in batches:
        if batch.get("stage") == loop and not batch.get("sanity"):
            runs.setdefault(batch.get("epoch", 0), []).append(batch)
    return dict(sorted(runs.items()))


def last_run(batches: list, loop: str) -> list:
    """The batch events of ``loop``'s last run outside the sanity check (``[]`` when it never ran)."""
    runs = loop_runs(batches, loop)
    return runs[max(runs)] if runs else []


def sanity_run(batches: list, loop: str) -> list:
    """The batch events ``loop`` ran in the sanity check."""
    return [b for b in batches if b.get("stage") == loop and b.get("sanity")]


def counts(world: list, single: Optional[dict], loop: str) -> Optional[Counts]:
    """:class:`Counts` of ``loop`` from the W=N ranks' split traces (``world``) and the W=1 one."""
    per_rank = [last_run(rank["batches"], loop) for rank in world]
    if not any(per_rank):
        return None
    samples = [_samples(b) for b in per_rank]
    identified = all(b.get("ids") is not None or b.get("hashes") is not None for bs in per_rank for b in bs)
    by = None
    if identified:
        by = "id" if all(b.get("ids") is not None for bs in per_rank for b in bs) else "content"
    tally = collections.Counter(s for rank in samples for s in rank) if identified else collections.Counter()
    duplicated = {_label(s): c for s, c in tally.items() if c > 1}
    union = set(tally)
    unsharded = bool(identified and len(world) > 1 and union and all(set(rank) == union for rank in samples))
    missing = None
    missing_labels: list = []
    if identified and single is not None:
        single_samples = _samples(last_run(single["batches"], loop))
        if single_samples:
            absent = [s for s in dict.fromkeys(single_samples) if s not in union]
            missing, missing_labels = len(absent), [_label(s) for s in absent[:10]]
    sanity = [sanity_run(rank["batches"], loop) for rank in world]
    return Counts(
        loop=loop,
        batches=[len(b) for b in per_rank],
        samples=[sum(x.get("size") or 0 for x in b) for b in per_rank],
        identified=identified,
        by=by,
        duplicates=sum(c - 1 for c in tally.values() if c > 1),
        duplicated=dict(list(duplicated.items())[:10]),
        unsharded=unsharded,
        missing_vs_single=missing,
        sampler=next((b.get("sampler") for b in _first_run(world[0]["batches"], loop) if b.get("sampler")), None),
        epochs=[len(loop_runs(rank["batches"], loop)) for rank in world],
        sanity_batches=[len(s) for s in sanity] if any(sanity) else None,
        missing=missing_labels,
    )


def _first_run(batches: list, loop: str) -> list:
    """Every batch event of ``loop`` (the sampler is written with the loop's first batch, sanity check or not)."""
    return [b for b in batches if b.get("stage") == loop]


# ---------------------------------------------------------------------------------------------------
# Collective sequences and their first divergence
# ---------------------------------------------------------------------------------------------------


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
            item.update({k: owner.get(k) for k in ("source", "key", "metric", "states", "hook", "call_site", "origin")})
            item["status"] = owner["status"]
        out.append(item)
    return out


def _signature(entry: dict) -> tuple:
    return (entry["op"], entry.get("dtype"), tuple(entry["shape"]) if entry.get("shape") is not None else None)


def first_divergence(sequences: list, ended: list) -> Optional[dict]:
    """The first position where the ranks' collective sequences stop matching, or None.

    Args:
        sequences: per rank, what :func:`sequence` returns.
        ended: per rank, how its stage ended (``"end"``, ``"raised"`` or None: killed or still running).

    Returns:
        ``{"kind", "index", "ranks", "entries", "message"}``; ``kind`` is ``"missing"`` (some ranks
        never entered the collective the others entered: those wait), ``"mismatch"`` (different op,
        dtype or shape at the same position) or ``"keys"`` (the same op, dtype and shape logged under
        different keys on different ranks: the values of one key are reduced with another's; the run
        can finish and be wrong). ``entries`` holds each rank's entry (None where it has none).
    """
    longest = max((len(s) for s in sequences), default=0)
    for i in range(longest):
        entries = [s[i] if i < len(s) else None for s in sequences]
        present = [r for r, e in enumerate(entries) if e is not None]
        absent = [r for r, e in enumerate(entries) if e is None]
        if absent:
            first = entries[present[0]]
            why = []
            for r in absent:
                last = describe_collective(sequences[r][-1]) if sequences[r] else "none"
                state = {
                    "end": "its stage finished",
                    "raised": "its stage raised",
                    None: "it ended without finishing its stage",
                }[ended[r]]
                why.append(f"rank {r} never entered it ({state}; its last collective: {last})")
            waiting = [r for r in present if entries[r].get("status") != "done"]
            message = (
                f"collective #{i} of the run: rank(s) {present} entered {describe_collective(first)}; "
                + "; ".join(why)
                + (f"; rank(s) {waiting} waited there" if waiting else "")
            )
            return {
                "kind": "missing",
                "index": i,
                "ranks": present,
                "absent": absent,
                "entries": entries,
                "message": message,
            }
        signatures = {_signature(e) for e in entries}
        if len(signatures) > 1:
            parts = [f"rank {r}: {describe_collective(e)}" for r, e in enumerate(entries)]
            return {
                "kind": "mismatch",
                "index": i,
                "ranks": list(range(len(entries))),
                "absent": [],
                "entries": entries,
                "message": f"collective #{i} of the run: the ranks called different collectives: " + "; ".join(parts),
            }
        keys = {e.get("key") for e in entries}
        if (
            len(keys) > 1
            and entries[0]["op"] != "barrier"
            and any(e.get("source") in ("self.log", "torchmetrics") for e in entries)
        ):
            parts = [f"rank {r}: {describe_collective(e)}" for r, e in enumerate(entries)]
            return {
                "kind": "keys",
                "index": i,
                "ranks": list(range(len(entries))),
                "absent": [],
                "entries": entries,
                "message": (
                    f"collective #{i} of the run: the same {entries[0]['op']} carries different keys, so each "
                    "rank's value is reduced with another key's: " + "; ".join(parts)
                ),
            }
    return None


def trace_summary(world: list) -> dict:
    """The JSON form of the W=N traces: per rank, its Python-level collectives, its Flight Recorder
    entries' count, how its stage ended; and the first divergence."""
    use_fr = all(rank["flight_recorder"] for rank in world)
    sequences = [sequence(rank, use_fr) for rank in world]
    ended = [rank["stage"] for rank in world]
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
        "first_divergence": first_divergence(sequences, ended),
    }
