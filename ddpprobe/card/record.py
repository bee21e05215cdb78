"""What one test case contributes to the card: its numbers, its metadata, its outcome.

Numbers
-------
A fact shows the numbers that matter next to its verdict. Record them with the ``semantics`` fixture
(:mod:`ddpprobe.card.plugin`) or with :func:`record_number`::

    def test_with_sync_dist_every_rank_gets_the_padded_mean(run_world, semantics):
        ...
        semantics.number("synced mean", got[0], vs=("single-process mean", single_process_mean))
        # or, from any code holding the request or the item:
        record_number(request, "padding duplicates", 2)

The row then reads ``synced mean 4.58 vs single-process mean 5``. Numbers are stored in
``item.user_properties`` as ``("ddpprobe.number", {...})`` pairs, which pytest copies into every
``TestReport``, so they reach the controller under pytest-xdist. Recording a number never changes a
verdict; record before the assertion so a failing fact shows its numbers too.

The fact
--------
A test's name states its fact; the card shows it as a sentence (:func:`fact_sentence`:
``test_with_sync_dist_every_rank_gets_...`` -> "With `sync_dist` every rank gets ...", identifiers and
capitals restored from the docstring) and the docstring's first paragraph as the explanation.

Outcomes
--------
:func:`outcome_of` maps a test's pytest reports to an outcome code of ``schema.json``: *holds* (passed),
*does_not_hold* (failed in the body), *bug_present* (a strict xfail that failed), *bug_fixed* (an XPASS,
strict or not), *skipped*, *error* (set-up or tear-down failed), *not_run* (collected, never reported).
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from typing import Optional

import pytest

#: Key under which numbers are stored in ``item.user_properties``.
NUMBER_KEY = "ddpprobe.number"


# ---------------------------------------------------------------------------------------------
# Numbers (recorded wherever the test runs: in-process or on an xdist worker)
# ---------------------------------------------------------------------------------------------


def json_scalar(value, what: str):
    """``value`` as a JSON scalar: bool/int/str/None as is, floats (non-finite as strings), tensors via ``.item()``.

    Raises:
        TypeError: ``value`` is none of these (the message names ``what``).
    """
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (int, float, str, bool)):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    raise TypeError(f"{what}: {value!r} of type {type(value).__name__} is not a number, string, bool or None")


def format_value(value) -> str:
    """How the card prints a recorded value: floats with 6 significant digits, the rest as ``str``."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def record_number(request_or_item, label: str, value, *, vs: Optional[tuple] = None) -> None:
    """Show ``label value`` (and ``vs label value``) in this fact's row of the semantics card.

    Args:
        request_or_item: the test's ``request`` fixture or its ``pytest.Item``.
        label: a few words naming the number, e.g. ``"synced mean"``.
        value: int, float, str, bool, None, or a one-element tensor/array (``.item()`` is taken).
            Floats are shown with 6 significant digits (``f"{value:.6g}"``).
        vs: optional ``(label, value)`` the number is compared with; the row reads
            ``"synced mean 4.58 vs single-process mean 5"``.

    Raises:
        TypeError: ``request_or_item`` is not a test item or its request (e.g. a module-scoped
            fixture's request), ``label`` is not a string, or a value is not a scalar.
    """
    item = request_or_item if isinstance(request_or_item, pytest.Item) else getattr(request_or_item, "node", None)
    if not isinstance(item, pytest.Item):
        raise TypeError(
            f"record_number needs a test's request or pytest.Item, got {type(request_or_item).__name__}"
            + (f" (node {type(item).__name__})" if item is not None else "")
        )
    if not isinstance(label, str) or not label:
        raise TypeError(f"record_number: label must be a non-empty string, got {label!r}")
    entry = {"label": label, "value": json_scalar(value, f"record_number({label!r})"), "vs": None}
    text = f"{label} {format_value(entry['value'])}"
    if vs is not None:
        if not (isinstance(vs, tuple) and len(vs) == 2 and isinstance(vs[0], str)):
            raise TypeError(f"record_number({label!r}): vs must be a (label, value) tuple, got {vs!r}")
        entry["vs"] = {"label": vs[0], "value": json_scalar(vs[1], f"record_number({label!r}, vs)")}
        text += f" vs {vs[0]} {format_value(entry['vs']['value'])}"
    entry["text"] = text
    item.user_properties.append((NUMBER_KEY, entry))


class SemanticsRecorder:
    """What the ``semantics`` fixture gives a test: ``semantics.number(label, value, vs=None)``."""

    def __init__(self, item):
        self._item = item

    def number(self, label: str, value, *, vs: Optional[tuple] = None) -> None:
        """Same as :func:`record_number` for this test."""
        record_number(self._item, label, value, vs=vs)


def numbers_of(report) -> list:
    """The number entries a test report carries (every phase carries all recorded so far)."""
    return [dict(value) for key, value in report.user_properties if key == NUMBER_KEY]


# ---------------------------------------------------------------------------------------------
# The fact and its explanation
# ---------------------------------------------------------------------------------------------


def first_paragraph(doc: str) -> str:
    """The first paragraph of ``doc`` on one line (``""`` for no docstring)."""
    paragraph = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0] if doc else ""
    return " ".join(paragraph.split())


def markdown_code(text: str) -> str:
    """RST inline markup -> Markdown: ``:role:`x``` -> ```x```, double backticks -> single."""
    text = re.sub(r":[a-z]+:`", "`", text)
    return text.replace("``", "`")


_IDENTIFIER = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b")


def fact_sentence(function_name: str, doc: str = "") -> str:
    """The fact a test's name states, as a sentence.

    ``test_`` is dropped and underscores become spaces; where the docstring names an identifier whose
    parts appear in the name (``sync_dist``, ``all_gather``, ``on_validation_epoch_end``) the sentence
    shows it as code, and a word the docstring always spells with capitals (``F1``, ``NCCL``) gets them.
    ``"test_with_sync_dist_every_rank_gets_the_padded_mean"`` -> "With `sync_dist` every rank gets the
    padded mean."
    """
    words = [w for w in re.sub(r"^test_?", "", function_name).split("_") if w]
    if not words:
        return function_name
    identifiers = sorted({m.group(0) for m in _IDENTIFIER.finditer(doc)}, key=lambda s: -s.count("_"))
    spelled: dict = {}  # lower case -> the ways the docstring writes it (a capital only at its start: ignored)
    for word in re.findall(r"\b[A-Za-z][A-Za-z0-9]*\b", doc):
        if word.isupper() or word != word.capitalize():
            spelled.setdefault(word.lower(), set()).add(word)
    out, i = [], 0
    while i < len(words):
        for identifier in identifiers:
            parts = identifier.split("_")
            if [w.lower() for w in words[i : i + len(parts)]] == [p.lower() for p in parts]:
                out.append(f"`{identifier}`")
                i += len(parts)
                break
        else:
            forms = spelled.get(words[i].lower(), set())
            out.append(next(iter(forms)) if len(forms) == 1 and words[i].islower() else words[i])
            i += 1
    if not out[0].startswith("`"):
        out[0] = out[0][0].upper() + out[0][1:]
    return " ".join(out) + "."


def fact_metadata(item) -> dict:
    """What the card needs to know about a collected test, as JSON-ready data."""
    module = getattr(item, "module", None)
    function = getattr(item, "function", None)
    callspec = getattr(item, "callspec", None)
    params = {}
    if callspec is not None:
        for key, value in callspec.params.items():
            try:
                params[key] = json_scalar(value, key)
            except TypeError:
                params[key] = repr(value)
    world_size = params.get("world_size")
    path = item.nodeid.split("::", 1)[0]
    return {
        "nodeid": item.nodeid,
        "path": path,
        "module": module.__name__.rsplit(".", 1)[-1] if module is not None else Path(path).stem,
        "module_doc": (inspect.getdoc(module) or "") if module is not None else "",
        "function": getattr(item, "originalname", None) or item.name,
        "case": callspec.id if callspec is not None else None,
        "params": params,
        "world_size": world_size if isinstance(world_size, int) and not isinstance(world_size, bool) else None,
        "doc": (inspect.getdoc(function) if function is not None else None) or "",
        "not_a_fact": item.get_closest_marker("not_a_fact") is not None,
    }


def metadata_from_nodeid(nodeid: str) -> dict:
    """Metadata for a test known only by its node id (collected on an xdist worker that never reported)."""
    path, _, rest = nodeid.partition("::")
    name = rest.rsplit("::", 1)[-1]
    function, _, case = name.partition("[")
    return {
        "nodeid": nodeid,
        "path": path,
        "module": Path(path).stem,
        "module_doc": "",
        "function": function,
        "case": case[:-1] if case else None,
        "params": {},
        "world_size": None,
        "doc": "",
        "not_a_fact": False,
    }


# ---------------------------------------------------------------------------------------------
# Outcomes
# ---------------------------------------------------------------------------------------------


def one_line(text, limit: int = 200) -> Optional[str]:
    """The first non-blank line of ``text``, cut to ``limit`` characters (None stays None)."""
    if text is None:
        return None
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else str(longrepr)
    return one_line(re.sub(r"^Skipped: ", "", reason)) or "no reason given"


def _failure_message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return one_line(crash.message)
    return one_line(report.longrepr) or "failed"


def outcome_of(reports: dict) -> tuple:
    """``(outcome code, detail)`` of one test from its reports by phase (``{"setup": rep, "call": rep, ...}``)."""
    setup, call, teardown = reports.get("setup"), reports.get("call"), reports.get("teardown")
    outcome, detail = "not_run", None
    if setup is not None and not setup.passed:
        if hasattr(setup, "wasxfail") and setup.skipped:
            outcome, detail = "bug_present", one_line(setup.wasxfail)
        elif setup.skipped:
            outcome, detail = "skipped", _skip_reason(setup)
        else:
            outcome, detail = "error", "in set-up: " + _failure_message(setup)
    elif call is not None:
        xfail_reason = getattr(call, "wasxfail", None)
        if call.failed:
            text = call.longrepr if isinstance(call.longrepr, str) else ""
            if text.startswith("[XPASS(strict)]"):
                outcome, detail = "bug_fixed", one_line(text[len("[XPASS(strict)]") :]) or None
            else:
                outcome, detail = "does_not_hold", _failure_message(call)
        elif call.skipped and xfail_reason is not None:
            outcome, detail = "bug_present", one_line(xfail_reason)
        elif call.skipped:
            outcome, detail = "skipped", _skip_reason(call)
        elif xfail_reason is not None:
            outcome, detail = "bug_fixed", one_line(xfail_reason)
        else:
            outcome = "holds"
    if teardown is not None and teardown.failed and outcome in ("holds", "not_run"):
        outcome, detail = "error", "in tear-down: " + _failure_message(teardown)
    return outcome, detail
