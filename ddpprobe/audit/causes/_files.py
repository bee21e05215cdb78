"""The files the module's own code wrote, read against the contract's row for files (``SINGLE_PROCESS_FILES``: a file
the run writes holds what one process writes there) and the registry's ``one_path_every_rank``. Pure Python on
:func:`~ddpprobe.audit.evidence._files.written_files`'s items.

- Every rank wrote one path, each its own content, of another length (lines, or bytes for a file without lines)
  than one process writes: the registry's ``one_path_every_rank`` (its fix: one file per rank, merged).
- Every rank appended to one path, together another length than one process writes: the contract row's break, no
  proven fix (the file holds every rank's share, not the last writer's).
- Some ranks wrote a path whose length is not one process's: the contract row's break, no proven fix.
- No problem: files per rank (per rank, epoch or batch), what one process writes, the same bytes on every rank (a
  value of the run, such as its world size), other bytes of the same length (a time stamp), or a file one process
  does not write; the contract section says which.
"""

from __future__ import annotations

from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.evidence._files import EVERY_RANK, ONE_PER_RANK, content_text, wrapped_keys
from ddpprobe.contract import SINGLE_PROCESS_FILES

#: The registry entry of ranks that each write their own share to one path.
ONE_PATH = "one_path_every_rank"


def _differ(item: dict) -> bool:
    written = [c["sha1"] for c in item["per_rank"] if c is not None]
    return len(set(written)) > 1


def _length(content: Optional[dict]) -> Optional[tuple]:
    """How much a file holds: its lines, else its bytes; for what ``torch.save`` wrote, the digest of the saved object
    (its structure and tensors: ddpprobe/trace/_files.py ``saved_content``, no time stamp in it), since the zip
    file's bytes pad small tensors of other lengths to one size."""
    if content is None:
        return None
    if content.get("writer") == "torch.save":
        return ("saved", content.get("sha1"))
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


def _total(item: dict) -> Optional[tuple]:
    """The lines (or bytes) of every rank's appends together: what a file every rank appends to holds."""
    kept = [c for c in item["per_rank"] if c is not None]
    return _length({k: sum(c[k] for c in kept) for k in ("lines", "size")}) if kept else None


def verdict(item: dict) -> Optional[str]:
    """What breaks in a file item: ``ONE_PATH`` (the registry entry), ``"contract"`` (the row, no entry), or None.

    A length (lines, or bytes without lines) other than one process's is the evidence: other bytes of the same
    length (a time stamp), the same bytes on every rank (a value of the run, such as its world size), and a file one
    process does not write prove nothing."""
    one = _length(item["single"]) if item["single"] else None
    if one is None or item["pattern"] == ONE_PER_RANK:
        return None
    lengths = {_length(c) for c in item["per_rank"] if c is not None}
    if item["pattern"] == EVERY_RANK and len(item["ranks"]) > 1:
        if item.get("appends"):
            return "contract" if _total(item) != one else None
        return ONE_PATH if _differ(item) and lengths != {one} else None
    return "contract" if lengths and lengths != {one} else None


def _where(item: dict) -> str:
    sites = ", ".join(item["call_sites"]) or "a line the trace did not see"
    return f"at {sites}"


def _per_rank(item: dict) -> str:
    return ", ".join(f"rank {r} {content_text(c)}" for r, c in enumerate(item["per_rank"]) if c is not None)


def _length_text(length: Optional[tuple]) -> str:
    if length is None:
        return "none"
    if length[0] == "saved":
        return "a torch.save object"
    return f"{length[1]} {'line(s)' if length[0] == 'lines' else 'bytes'}"


def problem_text(item: dict) -> str:
    """The problem sentence of a file item whose :func:`verdict` is not None (with :func:`_wrapped_text`)."""
    return _problem_head(item) + _wrapped_text(item) + _outside_text(item)


def _problem_head(item: dict) -> str:
    single = content_text(item["single"]) if item["single"] else "no such file"
    if verdict(item) == ONE_PATH:
        return hazards.cause(ONE_PATH, **_numbers(item))
    if item["pattern"] == EVERY_RANK:
        return (
            f"every rank appended to {item['key']} ({_where(item)}: {_per_rank(item)}), "
            f"{_length_text(_total(item))} together, where one process writes {single}: the file holds every "
            "rank's share, in an order that may change from run to run, and not what one process writes"
        )
    return (
        f"only rank(s) {item['ranks']} wrote {item['key']} ({_where(item)}): {_per_rank(item)}, where one process "
        f"writes {single}: it holds what those ranks had, not what one process has"
    )


def _wrapped_text(item: dict) -> str:
    """The sentence on a ``torch.save`` of a ``state_dict`` from the DDP wrap, where :func:`wrapped_keys` finds one."""
    ranks = wrapped_keys(item)
    if not ranks:
        return ""
    return (
        f"; rank(s) {ranks} saved keys that all start with 'module.' where one process's do not: a state_dict of "
        "the DistributedDataParallel wrap (trainer.model), which the module loads only with the prefix stripped; "
        "save self.state_dict() (the LightningModule's own) instead"
    )


def _outside_text(item: dict) -> str:
    """The sentence on a path outside the audit's working folder (an absolute path the user's code chose: its
    ``key`` is the path itself, not ``./<relative>``, ddpprobe/trace/_files.py ``path_key``)."""
    if str(item.get("key", "")).startswith("./"):
        return ""
    return (
        "; this path is outside the audit's working folder (each world's ranks share one of the audit's own), so the "
        "audit's runs wrote the real file there, replacing what it held"
    )


def _no_problem(item: dict) -> str:
    """The contract section's sentence on a file item that breaks nothing (with :func:`_wrapped_text`)."""
    return _no_problem_head(item) + _wrapped_text(item) + _outside_text(item)


def _no_problem_head(item: dict) -> str:
    single = f"; one process wrote {content_text(item['single'])}" if item["single"] else ""
    if item["pattern"] == ONE_PER_RANK:
        return (
            f"each rank wrote files of its own {_where(item)} ({', '.join(item['keys'])}: {_per_rank(item)}){single}: "
            "no rank's write replaces another's"
        )
    who = "every rank" if item["pattern"] == EVERY_RANK else f"rank(s) {item['ranks']}"
    head = (
        f"{who} {'appended to' if item.get('appends') else 'wrote'} {item['key']} ({_where(item)}: {_per_rank(item)})"
    )
    if item["single"] is None:
        return f"{head}, a file one process does not write"
    if item["same_as_single"]:
        return f"{head}: what one process writes there"
    if item.get("appends"):
        return f"{head}: as many together as one process writes, in an order that may change from run to run"
    if item["pattern"] == EVERY_RANK and not _differ(item):
        return f"{head}: the same bytes on every rank (not one process's: a value of the run, such as its world size)"
    return f"{head}: as long as what one process writes (other bytes, such as a time stamp, prove nothing)"


def file_findings(items: list) -> list:
    """``[{"problem", "consequences"}]`` of the file items that break the contract."""
    return [{"problem": problem_text(i), "consequences": []} for i in items if verdict(i)]


def file_hazards(items: list) -> list:
    """The registry entries the file items prove (``[ONE_PATH]`` or ``[]``)."""
    return [ONE_PATH] if any(verdict(i) == ONE_PATH for i in items) else []


def file_lines(items: list) -> list:
    """The contract section's lines on files: ``[(indent, sentence)]``."""
    out = []
    for item in items:
        found = verdict(item)
        if found:
            out.append(("", problem_text(item)))
            out.append(("  ", SINGLE_PROCESS_FILES.shown()))
            if found == ONE_PATH:
                out.append(("  ", f"The registry ({ONE_PATH}): {hazards.HAZARDS[ONE_PATH].summary}"))
                out += [("  ", line) for line in hazards.advice(ONE_PATH, evidence(item))]
            else:
                out.append(("  ", f"{hazards.NO_FIX}: no registry entry's evidence holds for this file"))
        else:
            out.append(("", _no_problem(item)))
    return out


def _numbers(item: dict) -> dict:
    return {
        "key": item["key"],
        "where": _where(item),
        "per_rank": _per_rank(item),
        "single": content_text(item["single"]) if item["single"] else "no such file",
    }
