"""The files the module's own code wrote, per rank, against the single process's (the ``file`` events of the traces,
ddpprobe/trace/_files.py): which ranks wrote which path from which line, and whether what they wrote is what one
process writes. Pure Python on the traces.

A path is compared by its ``key``: the path as the ranks of a real launch share it (they share one working
directory, where the audit gives each rank its own). What a rank wrote is the file as it was when that rank closed
it (its ``size``, ``lines`` and ``sha1``); the single process's is the W=1 run's last write of the same key.
"""

from __future__ import annotations

from typing import Optional

#: A path every rank of the W=N run wrote (each ``open`` truncates or appends to what the others wrote).
EVERY_RANK = "every rank"
#: A path some ranks wrote and the others did not (rank 0 only, say).
SOME_RANKS = "some ranks"
#: A path per rank: every rank wrote at one call site, each to a path of its own.
ONE_PER_RANK = "one per rank"


def _content(event: dict) -> Optional[dict]:
    if "sha1" not in event:
        return None
    return {k: event[k] for k in ("size", "lines", "sha1")}


def _last_writes(trace: dict) -> dict:
    """``{key: the rank's last file event of that key}``."""
    out = {}
    for event in trace.get("files") or []:
        out[event["key"]] = event
    return out


def written_files(single_traces: list, world_traces: list) -> list:
    """``[{"key", "pattern", "ranks", "call_sites", "hooks", "per_rank", "single", "same_as_single"}]``, one per path
    the W=N ranks wrote (a file per rank counts once, with ``keys``), in the order of rank 0's writes:

    - ``pattern``: :data:`EVERY_RANK`, :data:`SOME_RANKS` or :data:`ONE_PER_RANK`;
    - ``ranks``: the ranks that wrote it; ``call_sites`` and ``hooks``: where (the user's lines, the hooks running);
    - ``per_rank``: per rank ``{"size", "lines", "sha1"}`` of the file when that rank closed it, or None (it did not
      write it, or could not read it back);
    - ``single``: the same of the W=1 run's last write of the key (for :data:`ONE_PER_RANK`, of the path the W=1 run
      wrote at that call site), or None where it wrote none;
    - ``same_as_single``: whether every rank that wrote holds exactly what the single process wrote (None without a
      W=1 file to compare with).
    """
    single = _last_writes(single_traces[0]) if single_traces else {}
    per_rank = [_last_writes(t) for t in world_traces]
    size = len(world_traces)
    keys = list(dict.fromkeys(k for writes in per_rank for k in writes))
    by_site: dict = {}
    for r, writes in enumerate(per_rank):
        for key, event in writes.items():
            by_site.setdefault(event.get("call_site"), {}).setdefault(r, set()).add(key)
    out, grouped = [], set()
    for key in keys:
        if key in grouped:
            continue
        ranks = [r for r in range(size) if key in per_rank[r]]
        events = [per_rank[r][key] for r in ranks]
        site = events[0].get("call_site")
        writers = by_site.get(site, {})
        own = [writers.get(r, set()) for r in range(size)]
        if len(ranks) == 1 and size > 1 and all(len(k) == 1 for k in own) and len(set().union(*own)) == size:
            keys_of_site = [next(iter(k)) for k in own]
            grouped.update(keys_of_site)
            single_event = next((e for e in single.values() if e.get("call_site") == site), None)
            out.append(
                {
                    "key": key,
                    "keys": keys_of_site,
                    "pattern": ONE_PER_RANK,
                    "ranks": list(range(size)),
                    "call_sites": [site] if site else [],
                    "hooks": sorted({per_rank[r][k].get("hook") or "" for r, k in enumerate(keys_of_site)} - {""}),
                    "per_rank": [_content(per_rank[r][k]) for r, k in enumerate(keys_of_site)],
                    "single": _content(single_event) if single_event else None,
                    "same_as_single": None,
                }
            )
            continue
        contents = [_content(per_rank[r][key]) if key in per_rank[r] else None for r in range(size)]
        one = _content(single[key]) if key in single else None
        written = [c for c in contents if c is not None]
        out.append(
            {
                "key": key,
                "pattern": EVERY_RANK if len(ranks) == size else SOME_RANKS,
                "ranks": ranks,
                "call_sites": list(dict.fromkeys(e.get("call_site") for e in events if e.get("call_site"))),
                "hooks": list(dict.fromkeys(e.get("hook") for e in events if e.get("hook"))),
                "per_rank": contents,
                "single": one,
                "same_as_single": (
                    None if one is None or not written else all(c["sha1"] == one["sha1"] for c in written)
                ),
            }
        )
    return out


def content_text(content: Optional[dict]) -> str:
    """``"9 lines, 75 bytes"`` (``"none"`` for None)."""
    if content is None:
        return "none"
    return f"{content['lines']} line(s), {content['size']} bytes"
