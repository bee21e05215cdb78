"""The files the module's own code wrote, read against the contract's row for files (``SINGLE_PROCESS_FILES``: a file
the run writes holds what one process writes there) and the registry's ``one_path_every_rank``. Pure Python on
:func:`~ddpprobe.audit.evidence._files.written_files`'s items.

- Every rank wrote one path, each its own content: the registry's ``one_path_every_rank`` (its fix: one file per
  rank, merged) whenever what they wrote is not what one process writes.
- Every rank wrote one path, the same content, not one process's: the contract row's break, no proven fix.
- Some ranks wrote a path whose length (lines, or bytes for a file without lines) is not one process's: the
  contract row's break, no proven fix. The same length with other bytes (a time stamp) proves nothing.
- One file per rank, or what one process writes: no problem; the contract section says so.
"""

from __future__ import annotations

from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.evidence._files import EVERY_RANK, ONE_PER_RANK, SOME_RANKS, content_text
from ddpprobe.contract import SINGLE_PROCESS_FILES

#: The registry entry of ranks that each write their own share to one path.
ONE_PATH = "one_path_every_rank"


def _differ(item: dict) -> bool:
    written = [c["sha1"] for c in item["per_rank"] if c is not None]
    return len(set(written)) > 1


def _length(content: Optional[dict]) -> Optional[tuple]:
    if content is None:
        return None
    return ("lines", content["lines"]) if content["lines"] else ("bytes", content["size"])


def evidence(item: dict) -> dict:
    """The registry evidence of a file item: ``ranks``, ``contents per rank``, ``single process's content`` and
    ``contents differ`` (between the ranks)."""
    return {
        "ranks": item["ranks"],
        "contents per rank": [content_text(c) if c else None for c in item["per_rank"]],
        "single process's content": content_text(item["single"]) if item["single"] else None,
        "contents differ": _differ(item),
    }


def verdict(item: dict) -> Optional[str]:
    """What breaks in a file item: ``ONE_PATH`` (the registry entry), ``"contract"`` (the row, no entry), or None."""
    if item["pattern"] == EVERY_RANK and len(item["ranks"]) > 1:
        if _differ(item) and item["same_as_single"] is not True:
            return ONE_PATH
        return "contract" if item["same_as_single"] is False else None
    if item["pattern"] == SOME_RANKS and item["single"] is not None:
        lengths = {_length(c) for c in item["per_rank"] if c is not None}
        return "contract" if lengths and lengths != {_length(item["single"])} else None
    return None


def _where(item: dict) -> str:
    sites = ", ".join(item["call_sites"]) or "a line the trace did not see"
    return f"at {sites}"


def _per_rank(item: dict) -> str:
    return ", ".join(f"rank {r} {content_text(c)}" for r, c in enumerate(item["per_rank"]) if c is not None)


def problem_text(item: dict) -> str:
    """The problem sentence of a file item whose :func:`verdict` is not None."""
    single = content_text(item["single"]) if item["single"] else "no such file"
    if verdict(item) == ONE_PATH:
        return hazards.cause(ONE_PATH, **_numbers(item))
    if item["pattern"] == EVERY_RANK:
        return (
            f"every rank wrote the same content to {item['key']} ({_where(item)}: {_per_rank(item)}), where one "
            "process writes "
            f"{single}: the ranks of a launch share that path, so the file ends with one rank's write, not what one "
            "process writes"
        )
    return (
        f"only rank(s) {item['ranks']} wrote {item['key']} ({_where(item)}): {_per_rank(item)}, where one process "
        f"writes {single}: it holds what those ranks had, not what one process has"
    )


def file_findings(items: list) -> list:
    """``[{"problem", "consequences"}]`` of the file items that break the contract."""
    return [{"problem": problem_text(i), "consequences": []} for i in items if verdict(i)]


def file_hazards(items: list) -> list:
    """The registry entries the file items prove (``[ONE_PATH]`` or ``[]``)."""
    return [ONE_PATH] if any(verdict(i) == ONE_PATH for i in items) else []


def file_lines(items: list) -> list:
    """The contract section's lines on files: ``[(indent, sentence)]``."""
    out = []
    row = SINGLE_PROCESS_FILES
    for item in items:
        found = verdict(item)
        if found:
            out.append(("", problem_text(item)))
            out.append(("  ", f"The contract ({row.name}): {row.keeps_it} (shown by {'; '.join(row.facts)})"))
            if found == ONE_PATH:
                out.append(("  ", f"The registry ({ONE_PATH}): {hazards.HAZARDS[ONE_PATH].summary}"))
                out += [("  ", line) for line in hazards.advice(ONE_PATH, evidence(item))]
            else:
                out.append(("  ", f"{hazards.NO_FIX}: no registry entry's evidence holds for this file"))
        elif item["pattern"] == ONE_PER_RANK:
            single = f"; one process wrote {content_text(item['single'])}" if item["single"] else ""
            out.append(
                (
                    "",
                    f"each rank wrote a file of its own {_where(item)} ({', '.join(item['keys'])}: {_per_rank(item)})"
                    f"{single}: no rank's write replaces another's",
                )
            )
        else:
            who = "every rank" if item["pattern"] == EVERY_RANK else f"rank(s) {item['ranks']}"
            same = {
                True: "what one process writes there",
                None: "a file one process does not write" if item["single"] is None else "what the ranks wrote",
                False: "as many lines as one process writes there (its bytes differ, which proves nothing: a time "
                "stamp, say)",
            }[item["same_as_single"]]
            out.append(("", f"{who} wrote {item['key']} ({_where(item)}): {_per_rank(item)}, {same}"))
    return out


def _numbers(item: dict) -> dict:
    return {
        "key": item["key"],
        "where": _where(item),
        "per_rank": _per_rank(item),
        "single": content_text(item["single"]) if item["single"] else "no such file",
    }
