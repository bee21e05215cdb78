"""What made the ranks' collectives diverge: the call site the ranks made a different number of times, and the
registry entry (ddpprobe/hazards/) its evidence proves. Pure Python, on recorded events."""

from __future__ import annotations

import re
from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.evidence._stages import STAGE_LOOP, loop_of_hook
from ddpprobe.trace import describe_collective


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
    (DDP's gradient all_reduce is no proof, whether a Flight Recorder entry Python never saw, which on gloo
    stays "scheduled", or a bucket the comm hook launched, which is "done" once launched, not once paired.)"""
    if ended == "end" or any(e.get("source") not in ASYNC_SOURCES for e in sequence[index + 1 :]):
        return True
    return (
        index < len(sequence)
        and sequence[index].get("status") == "done"
        and sequence[index].get("source") not in ASYNC_SOURCES
    )


#: Sources of collectives whose recorded status says nothing of their pairing: DDP's gradient all_reduce.
ASYNC_SOURCES = ("internal", "gradient")


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
    if entry.get("source") in ("internal", "gradient"):  # DDP's gradient all_reduce, per training batch
        return "train"
    hook = entry.get("hook") or entry.get("running") or ""
    if entry.get("sync") == "epoch" or not (hook.endswith("_step") or "backward" in hook):
        return None
    return loop_of_hook(hook)


def _counts_text(counts: list) -> str:
    return ", ".join(f"rank {r} {n} time(s)" for r, n in enumerate(counts))


def _finished_loop(rank: dict, loop: str) -> bool:
    """The rank ran its ``loop`` to the end: its stage finished, or it made a collective of the loop's epoch end
    (a ``self.log`` epoch sync of a key of that loop, or any collective in one of its ``on_*_epoch_end`` hooks)."""
    if rank["stage"] == "end":
        return True
    for c in rank["collectives"]:
        hook = c.get("running") or c.get("hook") or ""
        if loop_of_hook(c.get("hook") or "") == loop and c.get("sync") == "epoch":
            return True
        if hook.endswith("_epoch_end") and loop_of_hook(hook) == loop:
            return True
    return False


def shard_lengths(world: list, loop: str, shards: Optional[list] = None) -> Optional[list]:
    """Batches in each rank's shard of ``loop``, as far as the records prove them: the loader lengths the ranks
    recorded (``shards``: ``len(dataloader)`` per rank), else the batches each rank ran in the loop's last run,
    provided the ranks with fewer batches than another ran their loop to the end (:func:`_finished_loop`: so
    their shard holds no more); None where neither is known."""
    if shards and all(isinstance(n, int) for n in shards):
        return list(shards)
    from ddpprobe.audit.evidence._counts import last_run

    ran = [len(last_run(rank["batches"], loop)) for rank in world]
    if not any(ran):
        return None
    most = max(ran)
    if all(n == most or _finished_loop(rank, loop) for n, rank in zip(ran, world)):
        return ran
    return None


# The words of a collective on some ranks only are the registry's (one recogniser, shared with the guard).
Known, known, read_numbers = hazards.Known, hazards.known, hazards.read_numbers


def _alone_hazard(entry: dict, ranks: list) -> tuple:
    """``(name or None, cause, evidence)`` of a collective that only ``ranks`` made: ``hazards.alone_cause``."""
    return hazards.alone_cause(entry, ranks)


def diagnose(divergence: dict, world: list, sequences: list, stage: str, shards: Optional[dict] = None) -> dict:
    """What made the ranks' collectives diverge, and the registry entry (ddpprobe/hazards/) it proves.

    Args:
        divergence: :func:`first_divergence` of ``sequences``.
        world: each W=N rank's :func:`split` trace.
        sequences: each rank's :func:`sequence`.
        stage: the audited stage.
        shards: ``{loop: [batches in each rank's shard]}`` where the ranks recorded their loaders' lengths.

    Returns:
        ``{"culprit": culprit(...) or None, "explanation": str, "hazard": name or None, "fixes": [names],
        "evidence": {...}}``: ``fixes`` holds the entry when its fix's preconditions hold. The culprit is a
        call site whose collectives the ranks made a different number of times. A count that follows the
        ranks' shard lengths (recorded, and different) is a collective per batch on shards of different
        lengths; a site every rank ran as often but with runs of different lengths is a ``Metric`` list state
        synced element by element; otherwise the collective was made on some ranks only, and its call chain
        says which entry: a read of the logged metrics, a ``Metric.compute()``, a ``self.log`` sync, the
        user's own collective (Lightning's own barrier or broadcast has none).
    """
    ended = [rank["stage"] for rank in world]
    logs = [rank["logs"] for rank in world]
    if divergence["kind"] == "keys":
        entries = divergence["entries"]
        found = hazards.recognise(entries)
        evidence = found[1] if found and found[0] == "keys_differ" else {}
        evidence = evidence or {"keys per rank": [e.get("key") if e else None for e in entries], "op": entries[0]["op"]}
        text = hazards.cause("keys_differ", op=entries[0]["op"], keys=", ".join(map(str, evidence["keys per rank"])))
        return _diagnosis(None, text, "keys_differ", evidence)
    if divergence["kind"] == "mismatch":
        found = _gather_shapes_differ(divergence["entries"]) or _list_state_dtypes_differ(divergence["entries"])
        if found is not None:
            return found
    loop = STAGE_LOOP[stage]
    proven = shard_lengths(world, loop, (shards or {}).get(loop))
    found = culprit(divergence, sequences, ended, logs, proven if proven and len(set(proven)) > 1 else None)
    raised = _raised_outside_collectives(world, found["counts"] if found else None, found)
    if raised:
        return _diagnosis(found, raised, None, {})
    if found is None:
        return _diagnosis(None, "", None, {})
    entry, counts = found["entry"], found["counts"]
    pairing = _pairing(found)
    head = f"the culprit is {describe_collective(entry)}: the ranks made it {_counts_text(counts)}" + (
        "" if found["decided"] else " (or the other entry at the divergence: the ranks stopped there)"
    )
    loop = _loop_of(entry) or (STAGE_LOOP[stage] if entry.get("source") in ("library", "internal") else None)
    batches = _batches_per_rank(world, loop) if loop else None
    lengths = shard_lengths(world, loop, (shards or {}).get(loop)) if loop else None
    if batches and lengths and len(set(lengths)) > 1 and _same_order(counts, lengths):
        name = {"predict": "predict_collective", "train": "uneven_batches_fit"}.get(
            loop, "uneven_batches_step_sync" if entry.get("source") == "self.log" else "uneven_batches"
        )
        evidence = {"batches per shard": lengths, "loop": loop, "key": entry.get("key")}
        text = f"{head}, and the ranks' {loop} shards hold {lengths} batches: the count follows the data"
        return _diagnosis(found, text + pairing, name, evidence)
    if batches and len(set(batches)) > 1 and lengths and len(set(lengths)) == 1:
        head += f" (every rank's {loop} shard holds {lengths[0]} batches, so the count does not follow the data)"
    bursts = found["bursts"]
    if len({len(b) for b in bursts}) == 1 and len({tuple(b) for b in bursts}) > 1:
        sizes = [_sizes_at(seq, found["site"]) for seq in sequences]
        evidence = {"state sizes": {f"rank {r}": s for r, s in enumerate(sizes) if s}, "collectives per call": bursts}
        name = "list_state_element_sync" if entry.get("metric") and any(sizes) else None
        return _diagnosis(found, _uneven_calls(found, world, sequences) + pairing, name, evidence)
    hook = entry.get("running") or entry.get("hook")
    readers = [r for r, e in enumerate(found["paired"]) if e is not None and hazards.reads_metrics(e)]
    if not found["decided"] and 0 < len(readers) < len(found["paired"]):
        # One side's collective is the epoch sync a read of the logged metrics ran on those ranks only: the
        # other ranks' next collective pairs with it (the fact of ``metrics_read_on_some_ranks``).
        name, why, evidence = _alone_hazard(found["paired"][readers[0]], readers)
        return _diagnosis(found, f"{head}; {why}" + pairing, name, evidence)
    if not found["decided"]:
        others = [describe_collective(e) for e in found["paired"] if e is not None and site(e) != found["site"]]
        text = f"{head}; which of the two made the ranks part is not proven" + (
            f" (the other: {others[0]})" if others else ""
        )
        return _diagnosis(found, text + pairing, None, {"ranks": found["ranks"], "counts": counts})
    name, why, evidence = _alone_hazard(entry, found["ranks"])
    text = f"{head}{f', in {hook}' if hook else ''}, which every rank ran; " + (
        why or "some ranks skip it, and it is not a call of the module's own: no registry entry names why"
    )
    return _diagnosis(found, text + pairing, name, evidence)


def _gather_shapes_differ(entries: list) -> Optional[dict]:
    """Every rank at one call site of its own code made an all_gather of one dtype, and the shapes differ (gloo
    rejects it: tests/facts/test_collectives.py); None otherwise."""
    if any(e is None for e in entries) or len({site(e) for e in entries}) != 1:
        return None
    first = entries[0]
    found = hazards.recognise(entries)
    if found is None or found[0] != "gather_shapes_differ" or first.get("source") != "user":
        return None
    evidence = found[1]
    if evidence["op"] != "all_gather" or not evidence["same dtype"]:
        return None
    shapes = evidence["shapes per rank"]
    words = ", ".join(f"rank {r} {list(s)}" for r, s in enumerate(shapes))
    text = hazards.cause("gather_shapes_differ", shapes=words) + (
        f" of {first.get('dtype')} with all_gather at {first.get('call_site')}: every rank made the same call, "
        "and all_gather needs one shape on every rank"
    )
    return _diagnosis(None, text, "gather_shapes_differ", evidence)


def _list_state_dtypes_differ(entries: list) -> Optional[dict]:
    """Every rank at one ``Metric`` state sync made an all_gather, and the dtypes differ: a rank with an empty
    list state sends torchmetrics' float32 placeholder against the others' entries (tests/facts/
    test_hidden_collectives_torchmetrics_list_states.py); None otherwise."""
    if any(e is None for e in entries) or len({site(e) for e in entries}) != 1:
        return None
    first = entries[0]
    found = hazards.recognise(entries)
    if found is None or found[0] != "list_state_dtypes_differ":
        return None
    dtypes = [e.get("dtype") for e in entries]
    empty = found[1]["ranks with an empty list state"]
    if not empty or any(dtypes[r] != "float32" for r in empty):
        return None
    evidence = {**found[1], "dtypes per rank": dtypes, "call site": first.get("call_site")}
    others = {d for r, d in enumerate(dtypes) if r not in empty}
    effect = (
        ", which gloo rejects against the others' 8-byte entries (its size check)"
        if others & {"int64", "float64"}
        else ", and the others' 4-byte entries arrive there as float32 bit patterns"
        if others & {"int32"}
        else ""
    )
    words = ", ".join(f"rank {r} {d}" for r, d in enumerate(dtypes))
    text = hazards.cause(
        "list_state_dtypes_differ", metric=first.get("metric"), dtypes=words, empty=f"rank(s) {empty}", effect=effect
    )
    return _diagnosis(None, text, "list_state_dtypes_differ", evidence)


def _diagnosis(found, explanation: str, name: Optional[str], evidence: dict) -> dict:
    fixes = [name] if name and hazards.HAZARDS[name].applies(evidence) else []
    return {"culprit": found, "explanation": explanation, "hazard": name, "fixes": fixes, "evidence": evidence}


def _call_words(entry: dict) -> str:
    """The call of :func:`purpose` ``entry`` (one call can make several collectives) as a noun phrase, from
    ``describe_collective``'s words without the op, dtype and shape: a sync they name takes "the" (``the
    self.log epoch sync of 'v', logged in validation_step at m.py:12 in validation_step``, ``the MeanMetric
    state sync at compute()``), a phrase with its own article or owner stands as it is (``a Metric's state
    sync at compute()``, ``DistributedDataParallel's gradient all_reduce of bucket 0``), and any other words
    (``not called from Python ...``, ``your code``) or none are those of ``a collective``."""
    words = describe_collective({**entry, "op": "", "dtype": None, "shape": None})
    inner, rest = "", words
    if words.startswith("("):
        depth = 0
        for i, char in enumerate(words):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                inner, rest = words[1:i], words[i + 1 :]
                break
    rest = rest if rest[:1] in ("", " ", ",") else f" {rest}"
    first = inner.split(" ", 1)[0]
    if first in ("a", "an") or first.endswith("'s"):
        return inner + rest
    if re.search(r"\bsync\b", inner.split(",", 1)[0]):
        return f"the {inner}{rest}"
    return "a collective" + (f" ({inner})" if inner else "") + rest


def _uneven_calls(found: dict, world: list, sequences: list) -> str:
    """The same call on every rank syncing a different number of times: the per-rank counts of collectives
    per call, the ``Metric`` states' sizes, and, where the call's hook is known, the value each rank logged
    from that hook afterwards."""
    entry, bursts = found["entry"], found["bursts"]
    stopped = [r for r, rank in enumerate(world) if rank["stage"] != "end"]
    made = [
        f"rank {r} {b[0] if len(b) == 1 else b} collective(s){' (then it stopped)' if r in stopped else ''}"
        for r, b in enumerate(bursts)
    ]
    text = (
        f"the culprit is {_call_words(entry)}: every rank made this call {len(bursts[0])} time(s), but "
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
    if not hook:
        return text
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


#: Words of an error the backend raised in a collective (gloo's transport, NCCL, the process group).
BACKEND_ERRORS = (
    "gloo",
    "NCCL",
    "nccl",
    "ProcessGroup",
    "Connection closed by peer",
    "Timed out waiting",
    "Application timeout",
    "pair closure",
)


def _raised_outside_collectives(world: list, counts: Optional[list], found: Optional[dict]) -> str:
    """Why a rank stopped making collectives when its stage raised an error of its own (not in a
    collective): the divergence follows from that error, not from the call site."""
    for r, rank in enumerate(world):
        last = rank["collectives"][-1] if rank["collectives"] else None
        lacking = found is None or (counts is not None and r not in found["ranks"])
        error = rank["stage_error"] or ""
        if any(word in error for word in BACKEND_ERRORS):
            continue  # the backend's own error: the rank raised in a collective (a gradient bucket's, say)
        if rank["stage"] == "raised" and lacking and (last is None or last.get("status") == "done"):
            return (
                f"rank {r}'s stage raised {(rank['stage_error'] or '').splitlines()[0][:300]!r} outside any "
                "collective, so it made no more "
                "collectives: fix that error first; the others waited for it"
            )
    return ""
