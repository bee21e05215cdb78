"""What the ranks' traces prove: per-rank counts of batches and samples, duplicates across ranks, the first
point where the ranks' collective sequences diverge, and the call site that made them diverge. Rules on
recorded events only (written and read by ddpprobe/trace/, ``split_trace``), so they can be read
and tested on hand-written events without launching a world."""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

from ddpprobe.audit._stages import STAGE_LOOP, loop_of_hook
from ddpprobe.trace import batch_samples, describe_collective, sample_label, split_trace

__all__ = ["STAGE_LOOP", "Counts", "counts", "diagnose", "first_divergence", "sequence", "split", "trace_summary"]


#: One rank's trace events grouped (the reader lives with the writer, ddpprobe/trace/).
split = split_trace


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
    samples = [batch_samples(b) for b in per_rank]
    identified = all(b.get("ids") is not None or b.get("hashes") is not None for bs in per_rank for b in bs)
    by = None
    if identified:
        by = "id" if all(b.get("ids") is not None for bs in per_rank for b in bs) else "content"
    tally = collections.Counter(s for rank in samples for s in rank) if identified else collections.Counter()
    duplicated = {sample_label(s): c for s, c in tally.items() if c > 1}
    union = set(tally)
    unsharded = bool(identified and len(world) > 1 and union and all(set(rank) == union for rank in samples))
    missing = None
    missing_labels: list = []
    if identified and single is not None:
        single_samples = batch_samples(last_run(single["batches"], loop))
        if single_samples:
            absent = [s for s in dict.fromkeys(single_samples) if s not in union]
            missing, missing_labels = len(absent), [sample_label(s) for s in absent[:10]]
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


#: The fields a Flight Recorder entry takes from the Python-level call that covers it.
_OWNER_FIELDS = ("source", "key", "sync", "metric", "states", "state_sizes", "hook", "running", "call_site", "origin")


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


def _signature(entry: dict) -> tuple:
    return (entry["op"], entry.get("dtype"), tuple(entry["shape"]) if entry.get("shape") is not None else None)


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


def _mismatch(i: int, entries: list) -> Optional[dict]:
    """The ranks called different collectives (op, dtype or shape) at ``i``."""
    if len({_signature(e) for e in entries}) == 1:
        return None
    parts = [f"rank {r}: {describe_collective(e)}" for r, e in enumerate(entries)]
    return _divergence("mismatch", i, entries, "the ranks called different collectives: " + "; ".join(parts))


def _synced(entries: list) -> bool:
    """A reduction (not a barrier) in which a logged value or a Metric's state takes part."""
    return entries[0]["op"] != "barrier" and any(e.get("source") in ("self.log", "torchmetrics") for e in entries)


def _keys(i: int, entries: list) -> Optional[dict]:
    """The same collective carrying different logged keys at ``i``."""
    if len({e.get("key") for e in entries}) == 1 or not _synced(entries):
        return None
    parts = [f"rank {r}: {describe_collective(e)}" for r, e in enumerate(entries)]
    message = (
        f"the same {entries[0]['op']} carries different keys, so each rank's value is reduced with another "
        "key's: " + "; ".join(parts)
    )
    return _divergence("keys", i, entries, message)


def _purpose(i: int, entries: list) -> Optional[dict]:
    """The same collective made for different purposes at ``i`` (a step and an epoch sync of one key, a
    ``self.log`` sync and a Metric's or the user's own collective)."""
    if len({(e.get("source"), e.get("sync"), e.get("metric")) for e in entries}) == 1 or not _synced(entries):
        return None
    parts = [f"rank {r}'s {describe_collective(e)}" for r, e in enumerate(entries)]
    message = (
        f"the same {entries[0]['op']} serves different purposes on the ranks, so they reduce unrelated values "
        "together: " + " paired with ".join(parts)
    )
    return _divergence("purpose", i, entries, message)


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
        key, a ``self.log`` sync with a Metric's or the user's own collective). ``entries`` holds each
        rank's entry (None where it has none).
    """
    for i in range(max((len(s) for s in sequences), default=0)):
        entries = [s[i] if i < len(s) else None for s in sequences]
        found = _missing(i, entries, sequences, ended) or _mismatch(i, entries) or _keys(i, entries)
        found = found or _purpose(i, entries)
        if found is not None:
            return found
    return None


def trace_summary(world: list, stage: str = "validate") -> dict:
    """The JSON form of the W=N traces: per rank, its Python-level collectives, its Flight Recorder
    entries' count, how its stage ended; and the first divergence with the cause :func:`diagnose` finds
    (``first_divergence["diagnosis"]``)."""
    use_fr = all(rank["flight_recorder"] for rank in world)
    sequences = [sequence(rank, use_fr) for rank in world]
    ended = [rank["stage"] for rank in world]
    divergence = first_divergence(sequences, ended)
    if divergence is not None:
        divergence["diagnosis"] = diagnose(divergence, world, sequences, stage)
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
    }


# ---------------------------------------------------------------------------------------------------
# Call sites: which collective some ranks made more often than others
# ---------------------------------------------------------------------------------------------------


def site(entry: dict) -> tuple:
    """Where and why a collective was made: ``(call_site, hook, source, key, sync, metric, op)``. Two
    entries of one site are the same line making the same collective for the same purpose."""
    return tuple(entry.get(k) for k in ("call_site", "hook", "source", "key", "sync", "metric", "op"))


def purpose(entry: dict) -> tuple:
    """A :func:`site` without the op: one call of it can make several collectives (a ``Metric``'s state sync
    is a barrier and two all_gathers per tensor, ``gather_all_tensors`` in torchmetrics/utilities/distributed.py)."""
    return site(entry)[:-1]


def _bursts(sequence: list, wanted: tuple) -> list:
    """Lengths of the runs of consecutive entries of :func:`purpose` ``wanted[:-1]`` in ``sequence`` (a
    ``compute()`` that syncs a list state element by element is one run of several gathers)."""
    out, run = [], 0
    for entry in sequence:
        if purpose(entry) == wanted[:-1]:
            run += 1
        elif run:
            out.append(run)
            run = 0
    return out + ([run] if run else [])


def _went_past(sequence: list, index: int, ended: Optional[str]) -> bool:
    """The rank went on beyond collective ``index``: it made a later call from Python, finished its stage,
    or completed the one at ``index``; a rank stuck there says nothing about the collectives after it.
    (A Flight Recorder entry Python never saw, such as a gradient all_reduce, is no proof: on gloo every
    entry stays "scheduled".)"""
    if ended == "end" or any(e.get("source") != "internal" for e in sequence[index + 1 :]):
        return True
    return (
        index < len(sequence)
        and sequence[index].get("status") == "done"
        and sequence[index].get("source") != "internal"
    )


def _expected(entry: dict, logs: list) -> bool:
    """A ``self.log`` sync of a key every rank logged equally often from the same hook: every rank owes it."""
    if entry.get("source") != "self.log" or not entry.get("key"):
        return False
    counts = {sum(1 for e in rank if e.get("key") == entry["key"] and e.get("hook") == entry["hook"]) for rank in logs}
    return len(counts) == 1 and counts != {0}


def culprit(
    divergence: dict, sequences: list, ended: list, logs: list, batches: Optional[list] = None
) -> Optional[dict]:
    """The call site whose collectives the ranks made a different number of times, from the first divergence.

    Each entry at the divergence is its rank's k-th collective of its :func:`site`; a site is a candidate
    where another rank made fewer than k of it. It is the culprit where a rank that went on beyond the
    divergence (:func:`_went_past`) never made the k-th, or, where every rank stopped there, where the
    other entry is a ``self.log`` sync every rank owes (:func:`_expected`), or where its counts follow the
    ranks' ``batches`` (the stage loop's batch count per rank) while the other's do not.

    Returns:
        None when no site qualifies, else ``{"site", "entry", "ranks" (who made the k-th), "counts" (per
        rank, over the run), "bursts" (per rank, lengths of consecutive runs), "paired" (per rank, the
        entry at the divergence), "decided" (False when two sites remain candidates)}``.
    """
    index, entries = divergence["index"], divergence["entries"]
    candidates = []
    for r, entry in enumerate(entries):
        if entry is None or any(c["site"] == site(entry) for c in candidates):
            continue
        wanted = site(entry)
        k = sum(1 for e in sequences[r][: index + 1] if site(e) == wanted)
        counts = [sum(1 for e in seq if site(e) == wanted) for seq in sequences]
        lacking = [q for q, n in enumerate(counts) if n < k]
        if lacking:
            proven = any(_went_past(sequences[q], index, ended[q]) for q in lacking)
            others = [entries[q] for q in lacking if entries[q] is not None]
            owed = bool(others) and all(_expected(e, logs) for e in others) and not _expected(entry, logs)
            follows = bool(batches) and len(set(batches)) > 1 and _same_order(counts, batches)
            candidates.append(
                {
                    "site": wanted,
                    "entry": entry,
                    "ranks": [q for q, n in enumerate(counts) if n >= k],
                    "counts": counts,
                    "bursts": [_bursts(seq, wanted) for seq in sequences],
                    "paired": entries,
                    "score": 3 if proven else 2 if owed else 1 if follows else 0,
                }
            )
    if not candidates:
        return None
    best = max(c["score"] for c in candidates)
    chosen = [c for c in candidates if c["score"] == best]
    found = dict(chosen[0])
    found["decided"] = len(chosen) == 1 and (best > 0 or len(candidates) == 1)
    found.pop("score")
    return found


def _batches_per_rank(world: list, loop: str) -> list:
    """Batches each rank's ``loop`` ran over the whole run (the sanity check and every epoch included)."""
    return [sum(1 for b in rank["batches"] if b.get("stage") == loop) for rank in world]


def _loop_of(entry: dict) -> Optional[str]:
    """The loop whose batches drive a collective made once per batch: ``"train"`` for the gradient
    all_reduce and a training step, ``"val"``/``"test"``/``"predict"`` for their step hooks."""
    if entry.get("source") == "internal":
        return "train"
    hook = entry.get("hook") or entry.get("running") or ""
    if entry.get("sync") == "epoch" or not (hook.endswith("_step") or "backward" in hook):
        return None
    return loop_of_hook(hook)


def _counts_text(counts: list) -> str:
    return ", ".join(f"rank {r} {n} time(s)" for r, n in enumerate(counts))


def diagnose(divergence: dict, world: list, sequences: list, stage: str) -> dict:
    """What made the ranks' collectives diverge, and the fixes that fit it.

    Args:
        divergence: :func:`first_divergence` of ``sequences``.
        world: each W=N rank's :func:`split` trace.
        sequences: each rank's :func:`sequence`.
        stage: the audited stage.

    Returns:
        ``{"culprit": culprit(...) or None, "explanation": str, "fixes": [FIXES names]}``. The culprit is
        a call site whose collectives the ranks made a different number of times. Its fix follows from how
        the counts differ: a count that follows the ranks' batch counts (a collective per batch on ranks that
        ran different numbers of batches) is evened by equal batch counts; a site every rank ran as often
        but with runs of different lengths (a ``Metric`` state synced once per list element) has no proven
        fix and is shown with its state sizes; otherwise a branch on the rank (or on the rank's data) makes
        the collective on some ranks only: make it on every rank and branch on its result.
    """
    ended = [rank["stage"] for rank in world]
    logs = [rank["logs"] for rank in world]
    if divergence["kind"] == "keys":
        return {"culprit": None, "explanation": "", "fixes": ["same_keys"]}
    loop = STAGE_LOOP[stage]
    found = culprit(divergence, sequences, ended, logs, _batches_per_rank(world, loop))
    raised = _raised_outside_collectives(world, found["counts"] if found else None, found)
    if raised:
        return {"culprit": found, "explanation": raised, "fixes": []}
    if found is None:
        return {"culprit": None, "explanation": "", "fixes": []}
    entry, counts = found["entry"], found["counts"]
    what = describe_collective(entry)
    pairing = _pairing(found)
    head = f"the culprit is {what}: the ranks made it {_counts_text(counts)}" + (
        "" if found["decided"] else " (or the other entry at the divergence: the ranks stopped there)"
    )
    loop = _loop_of(entry) or (STAGE_LOOP[stage] if entry.get("source") in ("library", "internal") else None)
    batches = _batches_per_rank(world, loop) if loop else None
    if batches and len(set(batches)) > 1 and _same_order(counts, batches):
        text = f"{head}, and the ranks ran {batches} {loop} batches: the count follows the data"
        fixes = {"predict": ["predict_writer"], "train": ["even_batches_fit"]}.get(
            loop, ["even_batches_step"] if entry.get("source") == "self.log" else []
        )
        return {"culprit": found, "explanation": text + pairing, "fixes": fixes}
    bursts = found["bursts"]
    if len({len(b) for b in bursts}) == 1 and len({tuple(b) for b in bursts}) > 1:
        return {"culprit": found, "explanation": _uneven_calls(found, world, sequences) + pairing, "fixes": []}
    hook = entry.get("running") or entry.get("hook")
    text = (
        f"{head}{f', in {hook}' if hook else ''}, which every rank ran; some ranks skip it (a branch on "
        "the rank or on the rank's own data, or a call that syncs inside)"
    )
    source = entry.get("source")
    fixes = {"torchmetrics": ["compute_everywhere"], "self.log": ["rank_zero_only"]}.get(
        source, ["collective_everywhere"]
    )
    return {"culprit": found, "explanation": text + pairing, "fixes": fixes}


def _uneven_calls(found: dict, world: list, sequences: list) -> str:
    """The same call on every rank syncing a different number of times: the per-rank counts of collectives
    per call, the ``Metric`` states' sizes, and the value each rank logged from that hook afterwards."""
    entry, bursts = found["entry"], found["bursts"]
    where = describe_collective({**entry, "op": "", "dtype": None, "shape": None}).strip()
    if where.startswith("(") and ")" in where:
        where = where[1:].replace(")", "", 1)
    stopped = [r for r, rank in enumerate(world) if rank["stage"] != "end"]
    made = [
        f"rank {r} {b[0] if len(b) == 1 else b} collective(s){' (then it stopped)' if r in stopped else ''}"
        for r, b in enumerate(bursts)
    ]
    text = (
        f"the culprit is the {where}: every rank made this call {len(bursts[0])} time(s), but "
        + ("one call made " if len(bursts[0]) == 1 else "its calls made ")
        + ", ".join(made)
    )
    sizes = [_sizes_at(seq, found["site"]) for seq in sequences]
    if entry.get("metric") and any(sizes):
        text += (
            f"; {entry['metric']}'s states at the sync: "
            + "; ".join(f"rank {r} {s}" for r, s in enumerate(sizes) if s)
            + " (torchmetrics syncs a list state one element at a time unless its dist_reduce_fx is 'cat',"
            " so the ranks pair different elements)"
        )
    hook = entry.get("running") or entry.get("hook")
    values = []
    for r, rank in enumerate(world):
        logged = [e for e in rank["logs"] if e.get("hook") == hook]
        shown = ", ".join(f"{e['key']}={e['value']:.6g}" for e in logged if e.get("value") is not None)
        values.append(f"rank {r} {shown or 'none'}")
    return text + f"; what each rank logged in {hook} after it: " + ", ".join(values)


def _same_order(counts: list, batches: list) -> bool:
    """The ranks with more batches made at least as many collectives, and the ranks' counts differ."""
    pairs = list(zip(batches, counts))
    return all((b1 - b2) * (c1 - c2) >= 0 for b1, c1 in pairs for b2, c2 in pairs) and len(set(counts)) > 1


def _sizes_at(sequence: list, wanted: tuple) -> Optional[str]:
    """The state sizes of the last entry of site ``wanted`` in ``sequence``, in words."""
    found = [e for e in sequence if site(e) == wanted and e.get("state_sizes")]
    if not found:
        return None
    return ", ".join(f"{name} {size}" for name, size in found[-1]["state_sizes"].items() if size)


def _pairing(found: dict) -> str:
    """``"; rank 0's X paired with rank 1's Y"`` where the entries at the divergence are of different sites."""
    entries = [e for e in found["paired"]]
    if len({site(e) for e in entries if e is not None}) < 2:
        return ""
    parts = [f"rank {r}'s {describe_collective(e)}" for r, e in enumerate(entries) if e is not None]
    return "; at the divergence " + " paired with ".join(parts)


def _raised_outside_collectives(world: list, counts: Optional[list], found: Optional[dict]) -> str:
    """Why a rank stopped making collectives when its stage raised an error of its own (not in a
    collective): the divergence follows from that error, not from the call site."""
    for r, rank in enumerate(world):
        last = rank["collectives"][-1] if rank["collectives"] else None
        lacking = found is None or (counts is not None and r not in found["ranks"])
        if rank["stage"] == "raised" and lacking and (last is None or last.get("status") == "done"):
            return (
                f"rank {r}'s stage raised {(rank['stage_error'] or '').splitlines()[0][:300]!r} outside any "
                "collective, so it made no more "
                "collectives: fix that error first; the others waited for it"
            )
    return ""


def unmoved_leaves(world: list) -> list:
    """The ``self.all_gather`` call sites that returned leaves unchanged (strings, lists of them, other
    objects: ``all_gather`` moves tensors only), over every W=N rank: ``[{"hook", "call_site", "leaves"
    (``"path (type)"`` strings), "ranks"}]`` in first-seen order."""
    found: dict = {}
    for r, rank in enumerate(world):
        for event in rank.get("all_gathers") or []:
            leaves = [f"{leaf['path']} ({leaf['type']})" for leaf in event["leaves"] if leaf["unchanged"]]
            if not leaves:
                continue
            entry = found.setdefault(
                (event.get("hook"), event.get("call_site")),
                {"hook": event.get("hook"), "call_site": event.get("call_site"), "leaves": [], "ranks": []},
            )
            entry["leaves"] += [leaf for leaf in leaves if leaf not in entry["leaves"]]
            if r not in entry["ranks"]:
                entry["ranks"].append(r)
    return list(found.values())


def unmoved_text(entry: dict) -> str:
    """One :func:`unmoved_leaves` entry in words."""
    shown = ", ".join(entry["leaves"][:6]) + (", ..." if len(entry["leaves"]) > 6 else "")
    return (
        f"self.all_gather at {entry['call_site']} returned {shown} unchanged on rank(s) {entry['ranks']}: "
        "all_gather moves tensors only, so anything computed from those leaves is each rank's own"
    )
