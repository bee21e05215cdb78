"""What each rank's loops really ran (batches, samples, repeats across ranks, samples no rank ran) and what
``self.all_gather`` handed back unchanged, from the ranks' split traces (ddpprobe/trace/). Pure Python."""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

from ddpprobe import hazards
from ddpprobe.trace import batch_samples, sample_label


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
    return hazards.cause("unmoved_leaves", call_site=entry["call_site"], leaves=shown, ranks=entry["ranks"])


def shards_of(records: list) -> dict:
    """``{loop: [batches in each rank's shard]}`` from the ranks' recorded loaders (``audit_rank``'s ``loaders``:
    the first loader of each loop, ``len(dataloader)`` on that rank), for the loops every rank recorded."""
    out = {}
    kinds = {kind for rec in records for kind in (rec.get("loaders") or {})}
    for kind in kinds:
        lengths = [((rec.get("loaders") or {}).get(kind) or [{}])[0].get("batches") for rec in records]
        if all(isinstance(n, int) for n in lengths):
            out[kind] = lengths
    return out
