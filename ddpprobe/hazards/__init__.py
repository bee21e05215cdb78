"""The hazard registry: the one body of knowledge the audit and the guard explain with.

Each :class:`Hazard` is one way ranks go wrong under DDP, as a passing fact of ``tests/facts/`` proves it:
its name, the evidence it needs (which recorded quantities prove it: :attr:`Hazard.evidence`), the cause
worded with a run's numbers (:meth:`Hazard.cause`), the fix, the preconditions under which that fix applies
(:attr:`Hazard.applies`, a predicate over the run's evidence), and the fact tests that prove the cause
(:attr:`Hazard.facts`) and the fix (:attr:`Hazard.fix_fact`). The audit (ddpprobe/audit/) decides from its
records which entry the evidence proves and words its cause and fix here; the guard (ddpprobe/guard/) asks
:func:`guard_fix_lines` for the fix lines of a mismatch. A fix is printed only where its preconditions hold;
otherwise the line says that no proven fix applies and shows the evidence (:func:`advice`).

Pure Python, importing nothing of ddpprobe, torch or Lightning, so a guarded training job loads it cheaply.
"""

from __future__ import annotations

from typing import Optional

from ddpprobe.hazards._entries import HAZARDS, REMOVED_HOOKS, Hazard
from ddpprobe.hazards._guard import (
    Known,
    alone,
    alone_cause,
    guard_hazard,
    known,
    read_numbers,
    reads_metrics,
    recognise,
)

__all__ = [
    "HAZARDS",
    "REMOVED_HOOKS",
    "Hazard",
    "Known",
    "NO_FIX",
    "advice",
    "alone",
    "alone_cause",
    "cause",
    "evidence_text",
    "fix_line",
    "guard_cause",
    "guard_fix_lines",
    "guard_hazard",
    "known",
    "read_numbers",
    "reads_metrics",
    "recognise",
]

#: The start of the line printed where a hazard is proven but no fix's preconditions hold.
NO_FIX = "No proven fix applies"


def fix_line(name: str) -> str:
    """``"Fix: <what> (shown by <test>)"`` of the entry ``name``. Raises ``KeyError`` for an unknown name and
    ``ValueError`` for an entry without a fix."""
    hazard = HAZARDS[name]
    if hazard.fix is None:
        raise ValueError(f"the hazard {name!r} has no proven fix")
    return f"Fix: {hazard.fix} (shown by {hazard.fix_fact})"


def evidence_text(evidence: dict) -> str:
    """``"name value, name value"`` of the recorded quantities in ``evidence`` (floats to 6 digits, ``None`` and
    empty values left out; in a per-rank list a rank with no value reads ``none``, a 0-d tensor's shape ``scalar``)."""
    parts = []
    for name, value in evidence.items():
        if value is None or value == [] or value == {} or value == "":
            continue
        if isinstance(value, float):
            shown = format(value, ".6g")
        elif isinstance(value, (list, tuple)):
            shown = "[" + ", ".join(_per_rank(name, v) for v in value) + "]"
        else:
            shown = value
        parts.append(f"{name} {shown}")
    return ", ".join(parts)


def _per_rank(name: str, value) -> str:
    """One rank's value in a per-rank list of :func:`evidence_text`: ``none`` where it has none, ``scalar`` for
    the shape ``[]`` of a 0-d tensor."""
    if value is None or value == "":
        return "none"
    if value == [] and "shape" in name:
        return "scalar"
    return repr(value)


def advice(name: str, evidence: dict) -> list:
    """The lines to print for the proven hazard ``name`` in a run with ``evidence``: its fix line where the
    entry has a fix and its preconditions hold, else the first of its other fixes (:attr:`Hazard.other_fixes`) whose
    preconditions hold, else one line saying that no proven fix applies, with the evidence (and, where the entry
    has a fix, which precondition failed)."""
    hazard = HAZARDS[name]
    if hazard.fix is not None and hazard.applies(evidence):
        return [fix_line(name)]
    for other in hazard.other_fixes:  # a case the main fix's wording does not fit (no branch on the rank shown)
        if other.applies(evidence):
            return [f"Fix: {other.fix} (shown by {other.fix_fact})"]
    shown = evidence_text({k: v for k, v in evidence.items() if k in hazard.evidence}) or "none recorded"
    why = f" (the fix of {name!r} needs {hazard.requires})" if hazard.fix is not None else ""
    return [f"{NO_FIX}{why}; evidence: {shown}"]


def cause(name: str, **numbers) -> str:
    """The cause of the entry ``name`` worded with this run's ``numbers`` (:meth:`Hazard.cause`)."""
    return HAZARDS[name].cause(**numbers)


def guard_cause(entries: list) -> Optional[str]:
    """``"Cause (<entry>): <the entry's cause>"`` for the guard's entries at a failing check, where
    :func:`guard_hazard` names an entry and the check's fields word its cause (a collective on some ranks only,
    keys that differ, an all_gather of different shapes); None otherwise. Never raises."""
    try:
        found = guard_hazard(entries)
        if found is None:
            return None
        name, evidence = found
        collectives = sorted((e for e in entries if e.get("kind") == "collective"), key=lambda e: e["rank"])
        if name in (
            "metrics_read_on_some_ranks",
            "metric_compute_on_some_ranks",
            "rank0_only_synced_log",
            "key_on_some_ranks",
            "collective_on_some_ranks",
        ):
            mine = next(e for e in collectives if e["rank"] in evidence["ranks"])
            text = alone_cause(dict(mine["fields"]), evidence["ranks"])[1]
        elif name == "keys_differ":
            text = cause(name, op=evidence["op"], keys=", ".join(map(str, evidence["keys per rank"])))
        elif name == "gather_shapes_differ":
            shapes = ", ".join(f"rank {e['rank']} {e['id'][4]}" for e in collectives)
            text = cause(name, shapes=shapes)
        else:
            return None
        return f"Cause ({name}): {text}"
    except Exception:  # noqa: BLE001 - a cause line must never turn a guard error into another error
        return None


def guard_fix_lines(entries: list, differing: Optional[dict] = None) -> list:
    """The fix lines for the guard's entries at a failing check (ddpprobe/guard/_entries.py: ``kind``,
    ``rank``, ``fields``): the fix of the entry :func:`guard_hazard` names where its preconditions hold, else
    one line saying no proven fix applies, with the compared fields that differ (``differing``: ``{field:
    [value per rank]}``, the guard's ``_entries.differing``) as evidence, or without them what the ranks were
    doing. Never raises."""
    try:
        found = guard_hazard(entries)
    except Exception:  # noqa: BLE001 - a fix line must never turn a guard error into another error
        found = None
    if found is None and differing:
        return [
            f"{NO_FIX}; evidence: "
            + evidence_text({f"{k.replace('_', ' ')} per rank": v for k, v in differing.items()})
        ]
    if found is None:
        sides = "; ".join(f"rank {e.get('rank')} {e.get('text', '')}".strip() for e in entries)
        return [f"{NO_FIX}: no fact proves a fix for this difference ({sides})"]
    name, evidence = found
    return advice(name, evidence)
