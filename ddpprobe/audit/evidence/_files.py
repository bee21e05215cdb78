"""The files the module's own code wrote, per rank, against the single process's (the ``file`` events of the traces,
ddpprobe/trace/_files.py): which ranks wrote which path from which line, and whether what they wrote is what one
process writes. Pure Python on the traces.

A path is compared by its ``key``: the path as the ranks of a real launch share it (they share one working
directory, where the audit gives each rank its own). What a rank wrote is what it passed to the file's ``write``
(its ``size``, ``lines`` and ``sha1``), from its last truncating open of the path on; the single process's is the
same of the W=1 run.
"""

from __future__ import annotations

import hashlib
from typing import Optional

#: A path every rank of the W=N run wrote (each ``open`` truncates or appends to what the others wrote).
EVERY_RANK = "every rank"
#: A path some ranks wrote and the others did not (rank 0 only, say).
SOME_RANKS = "some ranks"
#: Paths per rank: every rank wrote at one call site, no two ranks to one path.
ONE_PER_RANK = "one per rank"


def _combined(events: list) -> Optional[dict]:
    """What the file holds of one rank's writes to one path, in order: from its last truncating open (``"w"``,
    ``"x"``) on, every write after it appended (``"a"``); ``{"size", "lines", "sha1", "appends"}`` (``sha1`` over the
    writes' digests, so equal writes give equal digests), or None where no event has a content."""
    start = max((i for i, e in enumerate(events) if "a" not in e.get("mode", "")), default=0)
    kept = [e for e in events[start:] if "sha1" in e]
    if not kept:
        return None
    digest = kept[0]["sha1"] if len(kept) == 1 else hashlib.sha1("".join(e["sha1"] for e in kept).encode()).hexdigest()
    out = {
        "size": sum(e["size"] for e in kept),
        "lines": sum(e["lines"] for e in kept),
        "sha1": digest,
        "appends": all("a" in e.get("mode", "") for e in events),
    }
    if kept[-1].get("writer"):
        out.update({"writer": kept[-1]["writer"], "saved": kept[-1].get("saved") or []})
    return out


def _writes(trace: dict) -> dict:
    """``{key: [the rank's file events of that key, in order]}``."""
    out: dict = {}
    for event in trace.get("files") or []:
        out.setdefault(event["key"], []).append(event)
    return out


def _sites(events: list) -> list:
    return list(dict.fromkeys(e.get("call_site") for e in events if e.get("call_site")))


def written_files(single_traces: list, world_traces: list) -> list:
    """``[{"key", "pattern", "ranks", "call_sites", "hooks", "per_rank", "single", "same_as_single", "appends"}]``, one
    per path the W=N ranks wrote (the files a call site wrote one per rank count once, with ``keys``), in the order of
    the ranks' writes:

    - ``pattern``: :data:`EVERY_RANK`, :data:`SOME_RANKS` or :data:`ONE_PER_RANK` (every rank wrote at one call site,
      no two ranks to one path: per rank, per epoch or per batch);
    - ``ranks``: the ranks that wrote it; ``call_sites`` and ``hooks``: where (the user's lines, the hooks running);
    - ``per_rank``: per rank ``{"size", "lines", "sha1"}`` of what that rank's writes leave in the file (from its last
      truncating open on; for :data:`ONE_PER_RANK`, summed over the rank's paths), or None where it wrote none;
    - ``single``: the same of the W=1 run's writes of the key (for :data:`ONE_PER_RANK`, of every path the W=1 run
      wrote at those call sites), or None where it wrote none;
    - ``same_as_single``: whether every rank that wrote holds exactly what the single process wrote (None without a
      W=1 file to compare with); ``appends``: every open of the path on every rank appended (``"a"``).
    """
    single = _writes(single_traces[0]) if single_traces else {}
    per_rank = [_writes(t) for t in world_traces]
    size = len(world_traces)
    keys = list(dict.fromkeys(k for writes in per_rank for k in writes))
    by_site: dict = {}
    for r, writes in enumerate(per_rank):
        for key, events in writes.items():
            for site in _sites(events):
                by_site.setdefault(site, [set() for _ in range(size)])[r].add(key)
    out, grouped = [], set()
    for key in keys:
        if key in grouped:
            continue
        ranks = [r for r in range(size) if key in per_rank[r]]
        events = [e for r in ranks for e in per_rank[r][key]]
        sites = _sites(events)
        own = by_site.get(sites[0]) if len(sites) == 1 else None
        if own and size > 1 and all(own) and sum(len(k) for k in own) == len(set().union(*own)):
            mine = [sorted(k) for k in own]
            grouped.update(*own)
            once = [e for k, es in single.items() for e in es if e.get("call_site") == sites[0]]
            out.append(
                {
                    "key": key,
                    "keys": [k for ks in mine for k in ks],
                    "pattern": ONE_PER_RANK,
                    "ranks": list(range(size)),
                    "call_sites": sites,
                    "hooks": list(dict.fromkeys(e.get("hook") for e in events if e.get("hook"))),
                    "per_rank": [_summed([_combined(per_rank[r][k]) for k in ks]) for r, ks in enumerate(mine)],
                    "single": _summed([_combined([e]) for e in once]) if once else None,
                    "same_as_single": None,
                    "appends": False,
                }
            )
            continue
        contents = [_combined(per_rank[r][key]) if key in per_rank[r] else None for r in range(size)]
        one = _combined(single[key]) if key in single else None
        written = [c for c in contents if c is not None]
        out.append(
            {
                "key": key,
                "pattern": EVERY_RANK if len(ranks) == size else SOME_RANKS,
                "ranks": ranks,
                "call_sites": sites,
                "hooks": list(dict.fromkeys(e.get("hook") for e in events if e.get("hook"))),
                "per_rank": contents,
                "single": one,
                "same_as_single": (
                    None
                    if one is None or not written or _unreadable([one, *written])
                    else all(c["sha1"] == one["sha1"] for c in written)
                ),
                "appends": bool(written) and all(c["appends"] for c in written),
            }
        )
    return out


def _unreadable(contents: list) -> bool:
    """Some content's digest could not be taken (``"unreadable: ..."``): equal digests then prove nothing."""
    return any(str(c.get("sha1", "")).startswith("unreadable") for c in contents)


def _summed(contents: list) -> Optional[dict]:
    kept = [c for c in contents if c is not None]
    if not kept:
        return None
    return {
        "size": sum(c["size"] for c in kept),
        "lines": sum(c["lines"] for c in kept),
        "sha1": hashlib.sha1("".join(c["sha1"] for c in kept).encode()).hexdigest(),
        "appends": False,
    }


def content_text(content: Optional[dict]) -> str:
    """``"9 lines, 75 bytes"`` (``"none"`` for None); ``"torch.save, 3 keys, 1203 bytes"`` for what ``torch.save``
    wrote."""
    if content is None:
        return "none"
    if content.get("writer") == "torch.save":
        saved = content.get("saved") or []
        what = f"a tensor of shape {saved[0][1]}, " if len(saved) == 1 and saved[0][0] == "" else ""
        what = what or (f"{len(saved)} key(s), " if saved else "")
        return f"torch.save, {what}{content['size']} bytes"
    return f"{content['lines']} line(s), {content['size']} bytes"


#: The prefix ``DistributedDataParallel.state_dict()`` gives every key (torch/nn/parallel/distributed.py: the
#: wrapped module is its attribute ``module``).
WRAP_PREFIX = "module."


def wrapped_keys(item: dict) -> list:
    """The ranks whose ``torch.save`` of a dict has every key prefixed ``module.`` where the single process's file
    has none so prefixed: a ``state_dict`` saved from the DDP wrap (``trainer.model``), not from the module."""
    single = (item.get("single") or {}).get("saved") or []
    if not single or any(k.startswith(WRAP_PREFIX) for k, _ in single):
        return []
    out = []
    for r, content in enumerate(item.get("per_rank") or []):
        saved = (content or {}).get("saved") or []
        if saved and all(k.startswith(WRAP_PREFIX) for k, _ in saved):
            out.append(r)
    return out
