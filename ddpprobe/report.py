"""The semantics card: a Markdown + JSON report of which facts held in a test run, and a picture of sharding.

Enable the plugin from a ``conftest.py`` (``pytest_plugins = [..., "ddpprobe.report"]``) or with
``-p ddpprobe.report``, then ask for a card::

    pytest --semantics-report=docs/semantics.md

After the run this writes

- ``docs/semantics.md``: the card. A header (date, Python, torch, pytorch-lightning and torchmetrics
  versions, the ``--backend`` of the run, the world sizes the facts were parametrised with, platform,
  CPU and GPU count, the command), a summary, then one section per test module: the module name as
  heading, the first paragraph of its docstring as the topic, and one table row per test case;
- ``docs/semantics.json``: the same content as data (schema below; :func:`validate_card` checks it);
- ``docs/semantics-sharding.svg``: a grid of what each rank's ``validation_step`` saw in a real world
  (``ddpprobe.probes.validation.validate`` with ``n=10``, world size 4, batch size 2), one cell per
  (rank, slot) holding the sample id, samples evaluated on more than one rank highlighted. The world
  runs at the end of the session, in the controller, with the ``gloo`` backend (the sharding is
  ``DistributedSampler``'s, the same for every backend) unless ``--backend nccl`` has 4 CUDA devices.
  ``--semantics-no-picture`` leaves it out.

Rows
----
One row per test case: a parametrised function gives one row per parameter set, so a fact that holds
at world size 2 but not 3 shows which. The first row of a function carries the fact; its further
cases show ``″`` (same fact) and their parameters in the *case* column. The fact is the first
sentence of the test's docstring (RST double backticks turned into Markdown code), or, without a
docstring, the test name turned into a sentence (``test_each_rank_sees_x`` -> "Each rank sees x.").

Verdicts (``outcome`` code in the JSON -> words on the card):

==================  ===================================  ============================================
outcome             verdict                              pytest result
==================  ===================================  ============================================
``holds``           holds                                passed
``does_not_hold``   does not hold                        failed (in the test body)
``bug_present``     known upstream bug still present     xfailed (``xfail(strict=True)`` that failed)
``bug_fixed``       known bug fixed                      XPASS: strict (reported as failed) or not
``skipped``         skipped: <reason>                    skipped
``error``           error: <message>                     error in set-up or tear-down of a fact
``not_run``         not run                              collected, no report (``-x``, interrupt)
==================  ===================================  ============================================

Tests marked ``@pytest.mark.not_a_fact("reason")`` (tests of the tooling rather than of DDP) are left
out of the sections and listed by id under ``left_out``.

Numbers on the card
-------------------
A fact may show the numbers that matter next to its verdict. Record them with the ``semantics``
fixture or with :func:`record_number`::

    def test_with_sync_dist_every_rank_gets_the_padded_mean(run_world, semantics):
        ...
        semantics.number("synced mean", got[0], vs=("single-process mean", single_process_mean))
        # or, from any code holding the request or the item:
        record_number(request, "padding duplicates", 2)

The row then reads ``synced mean 4.58 vs single-process mean 5``. Numbers are stored in
``item.user_properties`` as ``("ddpprobe.number", {...})`` pairs, which pytest copies into every
``TestReport``, so they reach the controller under pytest-xdist. Recording a number never changes a
verdict; record before the assertion so a failing fact shows its numbers too.

Under pytest-xdist every worker attaches the fact's metadata (docstrings, parameters) to its set-up
report as ``report.semantics_fact`` (pytest serialises extra report attributes for xdist), and only
the controller (the process without ``config.workerinput``) collects reports in
``pytest_runtest_logreport`` and writes the card, once.

JSON schema (``schema == "ddpprobe.semantics/1"``)
------------------------------------------------
::

    {
      "schema": "ddpprobe.semantics/1",
      "generated": str,                 # ISO 8601 UTC time the card was written
      "command": [str],                 # pytest's command-line arguments
      "environment": {
        "python": str, "torch": str|null, "pytorch_lightning": str|null, "torchmetrics": str|null,
        "platform": str, "cpu_count": int|null, "gpu_count": int
      },
      "backend": str|null,              # the --backend option (null without ddpprobe.pytest_plugin)
      "world_sizes": [int],             # sorted distinct ``world_size`` parameters of the facts
      "summary": {outcome: int},        # every outcome code above -> number of facts; sums to the facts
      "topics": [{
        "module": str,                  # "test_sharding"
        "path": str,                    # "tests/test_sharding.py", relative to the rootdir
        "topic": str,                   # first paragraph of the module docstring ("" if none)
        "facts": [{
          "nodeid": str, "function": str,
          "case": str|null,             # parametrisation id ("2-5"), null if not parametrised
          "params": {str: int|float|str|bool|null},   # non-JSON parameters given as their repr
          "world_size": int|null,
          "fact": str,                  # the one-line fact shown on the card
          "name_sentence": str,         # the test name turned into a sentence
          "doc": str,                   # the whole test docstring ("" if none)
          "outcome": str,               # one of the outcome codes
          "verdict": str,               # the words shown on the card, e.g. "skipped: needs 8 GPUs"
          "detail": str|null,           # failure message / xfail reason / skip reason, one line
          "numbers": [{"label": str, "value": int|float|str|bool|null, "text": str,
                       "vs": null|{"label": str, "value": int|float|str|bool|null}}],
          "duration_s": float           # set-up + call + tear-down seconds
        }]
      }],
      "left_out": [str],                # node ids of tests marked not_a_fact
      "sharding": null | {              # null with --semantics-no-picture
        "n": int, "world_size": int, "batch_size": int, "backend": str,
        "seen": [[[int]]] | null,       # per rank, per batch, the sample ids (null if the world failed)
        "duplicates": [int],            # sample ids evaluated more than once, sorted
        "svg": str|null,                # file name of the picture, relative to the card
        "error": str|null               # why there is no picture
      }
    }

Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` so the file is strict JSON.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import inspect
import json
import math
import os
import platform
import re
from pathlib import Path
from typing import Optional

import pytest

#: ``"label"`` key under which numbers are stored in ``item.user_properties``.
NUMBER_KEY = "ddpprobe.number"

#: Value of the ``schema`` key of every card this module writes.
SCHEMA = "ddpprobe.semantics/1"

#: Outcome code -> the words the card shows (``skipped`` and ``error`` get ``": <reason>"`` appended).
VERDICTS = {
    "holds": "holds",
    "does_not_hold": "does not hold",
    "bug_present": "known upstream bug still present",
    "bug_fixed": "known bug fixed",
    "skipped": "skipped",
    "error": "error",
    "not_run": "not run",
}

#: The sharding picture's world: ``validation.validate(n=PICTURE_N, batch_size=PICTURE_BATCH)`` at
#: world size ``PICTURE_WORLD_SIZE``; N does not divide by W, so ``DistributedSampler`` pads.
PICTURE_N = 10
PICTURE_WORLD_SIZE = 4
PICTURE_BATCH = 2

_PLUGIN_NAME = "ddpprobe-semantics-card"


# ---------------------------------------------------------------------------------------------
# Recording numbers (runs wherever the test runs: in-process or on an xdist worker)
# ---------------------------------------------------------------------------------------------


def _json_scalar(value, what: str):
    """``value`` as a JSON scalar: bool/int/str/None as is, floats (non-finite as strings), tensors via ``.item()``."""
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (int, float, str, bool)):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    raise TypeError(f"{what}: {value!r} of type {type(value).__name__} is not a number, string, bool or None")


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


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
    entry = {"label": label, "value": _json_scalar(value, f"record_number({label!r})"), "vs": None}
    text = f"{label} {_format_value(entry['value'])}"
    if vs is not None:
        if not (isinstance(vs, tuple) and len(vs) == 2 and isinstance(vs[0], str)):
            raise TypeError(f"record_number({label!r}): vs must be a (label, value) tuple, got {vs!r}")
        entry["vs"] = {"label": vs[0], "value": _json_scalar(vs[1], f"record_number({label!r}, vs)")}
        text += f" vs {vs[0]} {_format_value(entry['vs']['value'])}"
    entry["text"] = text
    item.user_properties.append((NUMBER_KEY, entry))


class SemanticsRecorder:
    """What the ``semantics`` fixture gives a test: ``semantics.number(label, value, vs=None)``."""

    def __init__(self, item):
        self._item = item

    def number(self, label: str, value, *, vs: Optional[tuple] = None) -> None:
        """Same as :func:`record_number` for this test."""
        record_number(self._item, label, value, vs=vs)


@pytest.fixture
def semantics(request) -> SemanticsRecorder:
    """Records numbers shown in this fact's row of the semantics card (``--semantics-report``).

    ``semantics.number("synced mean", 4.58, vs=("single-process mean", 5.0))``. Harmless without the
    option: the numbers then only sit in ``item.user_properties``.
    """
    return SemanticsRecorder(request.node)


# ---------------------------------------------------------------------------------------------
# pytest hooks
# ---------------------------------------------------------------------------------------------


def pytest_addoption(parser) -> None:
    group = parser.getgroup("ddpprobe-report", "ddpprobe: the semantics card")
    group.addoption(
        "--semantics-report",
        metavar="PATH.md",
        default=None,
        help="after the run write the semantics card to PATH.md, its JSON twin to PATH.json and a "
        "picture of sharding to PATH-sharding.svg",
    )
    group.addoption(
        "--semantics-no-picture",
        action="store_true",
        default=False,
        help="with --semantics-report: do not run the world that draws the sharding picture",
    )


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "not_a_fact(reason): a test of the tooling, not a fact about DDP; left out of the semantics card",
    )
    if config.getoption("semantics_report", None):
        config.pluginmanager.register(_CardCollector(config), _PLUGIN_NAME)


def _first_paragraph(doc: str) -> str:
    paragraph = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0] if doc else ""
    return " ".join(paragraph.split())


def _markdown_code(text: str) -> str:
    """RST inline markup -> Markdown: ``:role:`x``` -> ```x```, double backticks -> single."""
    text = re.sub(r":[a-z]+:`", "`", text)
    return text.replace("``", "`")


def _first_sentence(doc: str) -> str:
    paragraph = _first_paragraph(doc)
    # a sentence ends at . ! ? before a capital, backtick, quote or bracket, but not after e.g. / i.e. / vs.
    parts = re.split(r"(?<=[.!?])(?<!e\.g\.)(?<!i\.e\.)(?<!vs\.)\s+(?=[A-Z`\"(\[])", paragraph, maxsplit=1)
    return parts[0] if parts else ""


def name_sentence(function_name: str) -> str:
    """``"test_each_rank_sees_its_shard"`` -> ``"Each rank sees its shard."``"""
    words = re.sub(r"^test_?", "", function_name).replace("_", " ").strip()
    if not words:
        return function_name
    return words[0].upper() + words[1:] + ("" if words.endswith(".") else ".")


def _fact_metadata(item) -> dict:
    """What the card needs to know about a collected test, as JSON-ready data."""
    module = getattr(item, "module", None)
    function = getattr(item, "function", None)
    callspec = getattr(item, "callspec", None)
    params = {}
    if callspec is not None:
        for key, value in callspec.params.items():
            try:
                params[key] = _json_scalar(value, key)
            except TypeError:
                params[key] = repr(value)
    world_size = params.get("world_size")
    name = getattr(item, "originalname", None) or item.name
    doc = inspect.getdoc(function) if function is not None else None
    marker = item.get_closest_marker("not_a_fact")
    path = item.nodeid.split("::", 1)[0]
    return {
        "nodeid": item.nodeid,
        "path": path,
        "module": module.__name__.rsplit(".", 1)[-1] if module is not None else Path(path).stem,
        "module_doc": inspect.getdoc(module) or "" if module is not None else "",
        "function": name,
        "case": callspec.id if callspec is not None else None,
        "params": params,
        "world_size": world_size if isinstance(world_size, int) and not isinstance(world_size, bool) else None,
        "doc": doc or "",
        "not_a_fact": marker is not None,
    }


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "setup" and item.config.getoption("semantics_report", None):
        report.semantics_fact = _fact_metadata(item)
    return report


def _one_line(text, limit: int = 200) -> Optional[str]:
    if text is None:
        return None
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return _one_line(re.sub(r"^Skipped: ", "", reason)) or "no reason given"


def _failure_message(report) -> str:
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return _one_line(crash.message)
    return _one_line(longrepr) or "failed"


def outcome_of(reports: dict) -> tuple:
    """``(outcome code, detail)`` of one test from its reports by phase (``{"setup": rep, "call": rep, ...}``)."""
    setup, call, teardown = reports.get("setup"), reports.get("call"), reports.get("teardown")
    outcome, detail = "not_run", None
    if setup is not None and not setup.passed:
        if hasattr(setup, "wasxfail") and setup.skipped:
            outcome, detail = "bug_present", _one_line(setup.wasxfail)
        elif setup.skipped:
            outcome, detail = "skipped", _skip_reason(setup)
        else:
            outcome, detail = "error", "in set-up: " + _failure_message(setup)
    elif call is not None:
        xfail_reason = getattr(call, "wasxfail", None)
        if call.failed:
            text = call.longrepr if isinstance(call.longrepr, str) else ""
            if text.startswith("[XPASS(strict)]"):
                outcome, detail = "bug_fixed", _one_line(text[len("[XPASS(strict)]"):]) or None
            else:
                outcome, detail = "does_not_hold", _failure_message(call)
        elif call.skipped and xfail_reason is not None:
            outcome, detail = "bug_present", _one_line(xfail_reason)
        elif call.skipped:
            outcome, detail = "skipped", _skip_reason(call)
        elif xfail_reason is not None:
            outcome, detail = "bug_fixed", _one_line(xfail_reason)
        else:
            outcome = "holds"
    if teardown is not None and teardown.failed and outcome in ("holds", "not_run"):
        outcome, detail = "error", "in tear-down: " + _failure_message(teardown)
    return outcome, detail


def verdict_words(outcome: str, detail: Optional[str]) -> str:
    """The verdict as the card shows it, e.g. ``"skipped: needs 8 GPUs"``."""
    words = VERDICTS[outcome]
    if outcome in ("skipped", "error"):
        words += f": {detail or 'no reason given'}"
    return words


class _CardCollector:
    """Collects reports in the controller and writes the card at the end of the session."""

    def __init__(self, config):
        self.config = config
        self.path = Path(config.getoption("semantics_report")).expanduser()
        self.order: list = []  # node ids in collection order
        self.meta: dict = {}  # node id -> _fact_metadata
        self.reports: dict = {}  # node id -> {phase: report}
        self.numbers: dict = {}  # node id -> list of number entries
        self.written: Optional[Path] = None
        self.picture_error: Optional[str] = None

    def _is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def _see(self, nodeid: str) -> None:
        if nodeid not in self.reports:
            self.reports[nodeid] = {}
            if nodeid not in self.order:
                self.order.append(nodeid)

    def pytest_collection_finish(self, session) -> None:
        if self._is_worker():
            return
        for item in session.items:
            self.meta[item.nodeid] = _fact_metadata(item)
            self._see(item.nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        for nodeid in ids:
            self._see(nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        if self._is_worker():
            return
        self._see(report.nodeid)
        self.reports[report.nodeid][report.when] = report
        fact = getattr(report, "semantics_fact", None)
        if fact is not None:
            self.meta[report.nodeid] = fact
        numbers = [value for key, value in report.user_properties if key == NUMBER_KEY]
        if numbers:  # every phase carries all numbers recorded so far; keep the longest list
            if len(numbers) >= len(self.numbers.get(report.nodeid, [])):
                self.numbers[report.nodeid] = [dict(n) for n in numbers]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self._is_worker():
            return
        card = self.build_card()
        write_card(card, self.path)
        self.written = self.path

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.written is None:
            return
        terminalreporter.write_sep("-", "semantics card")
        terminalreporter.write_line(f"semantics card: {self.written} (+ {self.written.with_suffix('.json').name})")
        if self.picture_error:
            terminalreporter.write_line(f"sharding picture not drawn: {self.picture_error}", yellow=True)

    # -- building --------------------------------------------------------------------------

    def _fact_row(self, nodeid: str) -> dict:
        meta = self.meta.get(nodeid) or _meta_from_nodeid(nodeid)
        outcome, detail = outcome_of(self.reports.get(nodeid, {}))
        duration = sum(getattr(r, "duration", 0.0) or 0.0 for r in self.reports.get(nodeid, {}).values())
        doc = meta["doc"]
        sentence = name_sentence(meta["function"])
        fact = _markdown_code(_first_sentence(doc)) if doc else sentence
        return {
            "nodeid": nodeid,
            "function": meta["function"],
            "case": meta["case"],
            "params": meta["params"],
            "world_size": meta["world_size"],
            "fact": fact,
            "name_sentence": sentence,
            "doc": doc,
            "outcome": outcome,
            "verdict": verdict_words(outcome, detail),
            "detail": detail,
            "numbers": self.numbers.get(nodeid, []),
            "duration_s": round(float(duration), 4),
        }

    def build_card(self) -> dict:
        topics: dict = {}
        left_out: list = []
        for nodeid in self.order:
            meta = self.meta.get(nodeid) or _meta_from_nodeid(nodeid)
            if meta["not_a_fact"]:
                left_out.append(nodeid)
                continue
            topic = topics.setdefault(
                meta["path"],
                {"module": meta["module"], "path": meta["path"], "topic": _first_paragraph(meta["module_doc"]), "facts": []},
            )
            if not topic["topic"] and meta["module_doc"]:
                topic["topic"] = _first_paragraph(meta["module_doc"])
            topic["facts"].append(self._fact_row(nodeid))
        facts = [f for t in topics.values() for f in t["facts"]]
        summary = {code: sum(f["outcome"] == code for f in facts) for code in VERDICTS}
        sharding = None
        if not self.config.getoption("semantics_no_picture", False):
            sharding = self._sharding()
        return {
            "schema": SCHEMA,
            "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": [str(a) for a in self.config.invocation_params.args],
            "environment": environment(),
            "backend": self.config.getoption("backend", None),
            "world_sizes": sorted({f["world_size"] for f in facts if f["world_size"] is not None}),
            "summary": summary,
            "topics": list(topics.values()),
            "left_out": left_out,
            "sharding": sharding,
        }

    def _sharding(self) -> dict:
        backend = "gloo"
        if self.config.getoption("backend", None) == "nccl" and environment()["gpu_count"] >= PICTURE_WORLD_SIZE:
            backend = "nccl"
        sharding = {
            "n": PICTURE_N, "world_size": PICTURE_WORLD_SIZE, "batch_size": PICTURE_BATCH, "backend": backend,
            "seen": None, "duplicates": [], "svg": None, "error": None,
        }
        try:
            seen = run_sharding_world(
                backend=backend,
                timeout=self.config.getoption("world_timeout", None),
                start_method=self.config.getoption("start_method", None),
            )
        except Exception as exc:  # a failed world must not lose the card; the card says why
            self.picture_error = sharding["error"] = _one_line(f"{type(exc).__name__}: {exc}", 500)
            return sharding
        sharding["seen"] = seen
        sharding["duplicates"] = duplicated_ids(seen)
        svg_path = picture_path(self.path)
        svg_path.parent.mkdir(parents=True, exist_ok=True)
        svg_path.write_text(sharding_svg(seen, n=PICTURE_N), encoding="utf-8")
        sharding["svg"] = svg_path.name
        return sharding


def _meta_from_nodeid(nodeid: str) -> dict:
    """Metadata for a test known only by its node id (collected on an xdist worker that never reported)."""
    path, _, rest = nodeid.partition("::")
    name = rest.rsplit("::", 1)[-1]
    function, _, case = name.partition("[")
    return {
        "nodeid": nodeid, "path": path, "module": Path(path).stem, "module_doc": "", "function": function,
        "case": case[:-1] if case else None, "params": {}, "world_size": None, "doc": "", "not_a_fact": False,
    }


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Versions and hardware of this machine, as the card's ``environment`` entry."""
    from ddpprobe.launch._world import cuda_device_count

    gpu_count = cuda_device_count()
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "pytorch_lightning": _version("pytorch-lightning") or _version("lightning"),
        "torchmetrics": _version("torchmetrics"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpu_count": int(gpu_count),
    }


# ---------------------------------------------------------------------------------------------
# The sharding picture
# ---------------------------------------------------------------------------------------------


def picture_path(card_path) -> Path:
    """``docs/semantics.md`` -> ``docs/semantics-sharding.svg``."""
    card_path = Path(card_path)
    return card_path.with_name(card_path.stem + "-sharding.svg")


def run_sharding_world(backend: str = "gloo", timeout=None, start_method=None) -> list:
    """Run ``validation.validate(n=10, batch_size=2)`` in a real world of 4 ranks; per rank, per batch, the ids seen.

    Raises whatever ``ddpprobe.run_world`` raises (``RankFailed``, ``RankDied``, ``WorldTimeout``).
    """
    from ddpprobe.launch import run_world
    from ddpprobe.probes import validation

    options = {k: v for k, v in {"timeout": timeout, "start_method": start_method}.items() if v is not None}
    world = run_world(validation.validate, PICTURE_WORLD_SIZE, backend=backend, n=PICTURE_N,
                      batch_size=PICTURE_BATCH, **options)
    return [[[int(i) for i in batch] for batch in record["seen_ids"]] for record in world.records]


def duplicated_ids(seen: list) -> list:
    """Sample ids that occur more than once over all ranks' batches, sorted."""
    counts: dict = {}
    for rank_batches in seen:
        for batch in rank_batches:
            for sample in batch:
                counts[sample] = counts.get(sample, 0) + 1
    return sorted(s for s, c in counts.items() if c > 1)


def sharding_svg(seen: list, n: int) -> str:
    """A plain-SVG grid of what each rank saw.

    Args:
        seen: per rank, per batch, the sample ids (``validate``'s ``seen_ids`` of each rank).
        n: dataset size, for the strip of per-sample counts under the grid.

    Returns:
        SVG text. One ``<rect class="cell ...">`` per (rank, slot), where slot is the position in the
        rank's shard, carrying ``data-rank``, ``data-slot``, ``data-sample``, ``data-batch`` and
        ``data-count`` (how many times the sample was evaluated over all ranks); cells of samples
        evaluated more than once also carry class ``duplicate`` and are drawn in orange. Under the
        grid, one ``<rect class="count">`` per sample id 0..n-1 shows its count.
    """
    flat = [[(sample, b) for b, batch in enumerate(rank_batches) for sample in batch] for rank_batches in seen]
    counts: dict = {}
    for row in flat:
        for sample, _ in row:
            counts[sample] = counts.get(sample, 0) + 1
    world_size = len(flat)
    slots = max((len(row) for row in flat), default=0)
    cell_w, cell_h, left, top = 64, 40, 86, 64
    strip_top = top + world_size * cell_h + 58
    width = max(left + slots * cell_w, left + n * 34, left + 420) + 24
    height = strip_top + 34 + 76
    dup, plain = "#f4a259", "#cfe3f5"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="13">',
        f"<title>Which samples each rank's validation_step saw: N={n}, world size {world_size}</title>",
        '<rect x="0" y="0" width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">DistributedSampler shards: N = {n}, '
        f"world size = {world_size}</text>",
    ]
    for slot in range(slots):
        out.append(f'<text x="{left + slot * cell_w + cell_w / 2}" y="{top - 8}" text-anchor="middle" '
                   f'fill="#555">slot {slot}</text>')
    for rank, row in enumerate(flat):
        y = top + rank * cell_h
        out.append(f'<text x="{left - 10}" y="{y + cell_h / 2 + 5}" text-anchor="end">rank {rank}</text>')
        for slot, (sample, batch) in enumerate(row):
            x = left + slot * cell_w
            is_dup = counts[sample] > 1
            out.append(
                f'<rect class="cell{" duplicate" if is_dup else ""}" data-rank="{rank}" data-slot="{slot}" '
                f'data-sample="{sample}" data-batch="{batch}" data-count="{counts[sample]}" x="{x + 2}" y="{y + 2}" '
                f'width="{cell_w - 4}" height="{cell_h - 4}" rx="4" fill="{dup if is_dup else plain}" '
                f'stroke="{"#b5520b" if is_dup else "#7fa7c9"}"><title>rank {rank}, slot {slot} (batch {batch}): '
                f'sample {sample}, evaluated {counts[sample]}x</title></rect>'
            )
            out.append(f'<text x="{x + cell_w / 2}" y="{y + cell_h / 2 + 5}" text-anchor="middle">{sample}</text>')
        # batch boundaries of this rank: a dark tick between slots of different batches
        for slot in range(1, len(row)):
            if row[slot][1] != row[slot - 1][1]:
                x = left + slot * cell_w
                out.append(f'<line x1="{x}" y1="{y + 4}" x2="{x}" y2="{y + cell_h - 4}" stroke="#333" stroke-width="2"/>')
    out.append(f'<text x="{left}" y="{strip_top - 12}" fill="#555">times each sample id was evaluated</text>')
    for sample in range(n):
        x = left + sample * 34
        count = counts.get(sample, 0)
        fill = dup if count > 1 else plain if count == 1 else "#eeeeee"
        out.append(f'<rect class="count" data-sample="{sample}" data-count="{count}" x="{x + 1}" y="{strip_top}" '
                   f'width="32" height="28" rx="3" fill="{fill}" stroke="#999"/>')
        out.append(f'<text x="{x + 17}" y="{strip_top + 13}" text-anchor="middle" font-size="11">{sample}</text>')
        out.append(f'<text x="{x + 17}" y="{strip_top + 25}" text-anchor="middle" font-size="10" '
                   f'fill="#333">{count}x</text>')
    legend_y = strip_top + 52
    out.append(f'<rect x="{left}" y="{legend_y - 11}" width="14" height="14" fill="{dup}" stroke="#b5520b"/>')
    out.append(f'<text x="{left + 20}" y="{legend_y}">evaluated more than once (padding duplicate)</text>')
    out.append(f'<line x1="{left + 7}" y1="{legend_y + 10}" x2="{left + 7}" y2="{legend_y + 25}" '
               'stroke="#333" stroke-width="2"/>')
    out.append(f'<text x="{left + 20}" y="{legend_y + 22}">batch boundary (batch size {max((len(b) for r in seen for b in r), default=0)})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Writing and validating
# ---------------------------------------------------------------------------------------------


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_markdown(card: dict) -> str:
    """The card as Markdown (the text written to ``PATH.md``)."""
    env = card["environment"]
    summary = card["summary"]
    total = sum(summary.values())
    lines = [
        "# The semantics card",
        "",
        "What PyTorch Lightning DDP synchronizes and logs, as established by one run of the ddpprobe facts. "
        "Each row is one test case; its verdict is that test's outcome in this run. "
        "Generated by `ddpprobe.report` (`--semantics-report`); do not edit by hand.",
        "",
        "| | |",
        "| --- | --- |",
        f"| date | {card['generated']} |",
        f"| Python | {env['python']} |",
        f"| torch | {env['torch']} |",
        f"| pytorch-lightning | {env['pytorch_lightning']} |",
        f"| torchmetrics | {env['torchmetrics']} |",
        f"| backend | {card['backend']} |",
        f"| world sizes (parametrised) | {', '.join(map(str, card['world_sizes'])) or '-'} |",
        f"| platform | {_cell(env['platform'])} |",
        f"| CPUs / GPUs | {env['cpu_count']} / {env['gpu_count']} |",
        f"| command | `{_cell(' '.join(['pytest', *card['command']]))}` |",
        "",
        f"**{total} facts** — " + (", ".join(
            f"{VERDICTS[code]}: {summary[code]}" for code in VERDICTS if summary[code]
        ) or "none ran") + ".",
        "",
        "Verdicts: *holds* = the test passed; *does not hold* = it failed; *known upstream bug still present* = "
        "a strict xfail (asserting the correct behaviour) failed as expected; *known bug fixed* = such a test "
        "passed, so the upstream bug is gone and the xfail should be removed; *skipped* = not checked here, "
        "with the reason. `″` repeats the fact above for another parameter set.",
        "",
    ]
    sharding = card["sharding"]
    if sharding is not None:
        lines += ["## Sharding, as a picture", ""]
        if sharding["svg"]:
            dups = ", ".join(map(str, sharding["duplicates"])) or "none"
            lines += [
                f"![Which samples each rank's validation_step saw]({sharding['svg']})",
                "",
                f"A real world: `validation.validate(n={sharding['n']}, batch_size={sharding['batch_size']})` at "
                f"world size {sharding['world_size']} ({sharding['backend']}). Row = rank, column = position in "
                "the rank's shard, number = sample id. Samples evaluated more than once (orange): "
                f"{dups}.",
                "",
            ]
        else:
            lines += [f"Not drawn: the world failed ({_cell(sharding['error'])}).", ""]
    for topic in card["topics"]:
        lines += [f"## {topic['module']}", "", f"`{topic['path']}`" + (f": {_markdown_code(topic['topic'])}"
                                                                       if topic["topic"] else ""), ""]
        lines += ["| fact | case | verdict | numbers | test id |", "| --- | --- | --- | --- | --- |"]
        previous = None
        for fact in topic["facts"]:
            text = "″" if fact["function"] == previous else fact["fact"]
            previous = fact["function"]
            case = ", ".join(f"{k}={v}" for k, v in fact["params"].items()) or (fact["case"] or "")
            verdict = fact["verdict"]
            if fact["outcome"] in ("does_not_hold", "bug_present", "bug_fixed") and fact["detail"]:
                verdict += f" ({fact['detail']})"
            if fact["outcome"] != "holds":
                verdict = f"**{verdict}**"
            numbers = "; ".join(n["text"] for n in fact["numbers"])
            lines.append(f"| {_cell(text)} | {_cell(case)} | {_cell(verdict)} | {_cell(numbers)} | "
                         f"`{_cell(fact['nodeid'])}` |")
        lines.append("")
    if card["left_out"]:
        lines += ["## Left out", "", "Tests of the tooling (marked `not_a_fact`), not facts about DDP:", ""]
        lines += [f"- `{_cell(nodeid)}`" for nodeid in card["left_out"]]
        lines.append("")
    return "\n".join(lines)


def write_card(card: dict, path) -> None:
    """Write ``card`` as Markdown to ``path`` and as JSON to ``path`` with suffix ``.json``.

    Raises:
        ValueError: the card does not match the schema (see :func:`validate_card`).
    """
    validate_card(card)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_markdown(card), encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps(card, indent=2, allow_nan=False) + "\n", encoding="utf-8")


_SCALAR = (int, float, str, bool, type(None))


def _problems_of(card) -> list:
    problems: list = []

    def check(cond: bool, where: str, what: str) -> bool:
        if not cond:
            problems.append(f"{where}: {what}")
        return cond

    def typed(obj, key: str, types, where: str) -> bool:
        if not check(isinstance(obj, dict) and key in obj, where, f"missing key {key!r}"):
            return False
        value = obj[key]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
        return check(ok, f"{where}.{key}", f"expected {_type_names(types)}, got {type(value).__name__}")

    def scalar(value, where: str) -> None:
        check(isinstance(value, _SCALAR) and not (isinstance(value, float) and not math.isfinite(value)),
              where, f"expected a JSON scalar (finite), got {value!r}")

    if not check(isinstance(card, dict), "card", "expected an object"):
        return problems
    if typed(card, "schema", str, "card"):
        check(card["schema"] == SCHEMA, "card.schema", f"expected {SCHEMA!r}, got {card['schema']!r}")
    typed(card, "generated", str, "card")
    if typed(card, "command", list, "card"):
        for i, arg in enumerate(card["command"]):
            check(isinstance(arg, str), f"card.command[{i}]", "expected str")
    if typed(card, "environment", dict, "card"):
        env = card["environment"]
        for key in ("python", "platform"):
            typed(env, key, str, "card.environment")
        for key in ("torch", "pytorch_lightning", "torchmetrics"):
            typed(env, key, (str, type(None)), "card.environment")
        typed(env, "cpu_count", (int, type(None)), "card.environment")
        typed(env, "gpu_count", int, "card.environment")
    typed(card, "backend", (str, type(None)), "card")
    if typed(card, "world_sizes", list, "card"):
        sizes = card["world_sizes"]
        check(all(isinstance(w, int) and not isinstance(w, bool) for w in sizes), "card.world_sizes", "expected ints")
        check(sizes == sorted(set(sizes)), "card.world_sizes", "expected sorted distinct ints")
    if typed(card, "summary", dict, "card"):
        check(set(card["summary"]) == set(VERDICTS), "card.summary", f"expected keys {sorted(VERDICTS)}")
        for code, count in card["summary"].items():
            check(isinstance(count, int) and not isinstance(count, bool) and count >= 0,
                  f"card.summary.{code}", "expected a count >= 0")
    facts: list = []
    if typed(card, "topics", list, "card"):
        for t, topic in enumerate(card["topics"]):
            where = f"card.topics[{t}]"
            if not check(isinstance(topic, dict), where, "expected an object"):
                continue
            for key in ("module", "path", "topic"):
                typed(topic, key, str, where)
            if not typed(topic, "facts", list, where):
                continue
            for f, fact in enumerate(topic["facts"]):
                fw = f"{where}.facts[{f}]"
                if not check(isinstance(fact, dict), fw, "expected an object"):
                    continue
                facts.append(fact)
                for key in ("nodeid", "function", "fact", "name_sentence", "doc", "outcome", "verdict"):
                    typed(fact, key, str, fw)
                for key in ("case", "detail"):
                    typed(fact, key, (str, type(None)), fw)
                typed(fact, "world_size", (int, type(None)), fw)
                typed(fact, "duration_s", (int, float), fw)
                if typed(fact, "params", dict, fw):
                    for key, value in fact["params"].items():
                        check(isinstance(key, str), f"{fw}.params", "expected str keys")
                        scalar(value, f"{fw}.params.{key}")
                if isinstance(fact.get("outcome"), str) and check(fact["outcome"] in VERDICTS, f"{fw}.outcome",
                                                                  f"expected one of {sorted(VERDICTS)}"):
                    if isinstance(fact.get("verdict"), str):
                        check(fact["verdict"] == verdict_words(fact["outcome"], fact.get("detail")),
                              f"{fw}.verdict", f"does not match outcome {fact['outcome']!r}")
                if typed(fact, "numbers", list, fw):
                    for k, number in enumerate(fact["numbers"]):
                        nw = f"{fw}.numbers[{k}]"
                        if not check(isinstance(number, dict), nw, "expected an object"):
                            continue
                        typed(number, "label", str, nw)
                        typed(number, "text", str, nw)
                        if check("value" in number, nw, "missing key 'value'"):
                            scalar(number["value"], f"{nw}.value")
                        if typed(number, "vs", (dict, type(None)), nw) and number["vs"] is not None:
                            typed(number["vs"], "label", str, f"{nw}.vs")
                            if check("value" in number["vs"], f"{nw}.vs", "missing key 'value'"):
                                scalar(number["vs"]["value"], f"{nw}.vs.value")
    if isinstance(card.get("summary"), dict) and set(card["summary"]) == set(VERDICTS):
        counted = {code: sum(isinstance(f, dict) and f.get("outcome") == code for f in facts) for code in VERDICTS}
        check(counted == card["summary"], "card.summary", f"does not count the facts' outcomes {counted}")
    if typed(card, "left_out", list, "card"):
        check(all(isinstance(x, str) for x in card["left_out"]), "card.left_out", "expected node id strings")
    if check("sharding" in card, "card", "missing key 'sharding'") and card["sharding"] is not None:
        sh, where = card["sharding"], "card.sharding"
        if check(isinstance(sh, dict), where, "expected an object or null"):
            for key in ("n", "world_size", "batch_size"):
                typed(sh, key, int, where)
            typed(sh, "backend", str, where)
            for key in ("svg", "error"):
                typed(sh, key, (str, type(None)), where)
            if typed(sh, "duplicates", list, where):
                check(all(isinstance(i, int) for i in sh["duplicates"]), f"{where}.duplicates", "expected ints")
            if typed(sh, "seen", (list, type(None)), where) and sh["seen"] is not None:
                ok = all(isinstance(rank, list) and all(isinstance(b, list) and all(isinstance(i, int) for i in b)
                                                        for b in rank) for rank in sh["seen"])
                check(ok, f"{where}.seen", "expected per rank, per batch, lists of ints")
                check(len(sh["seen"]) == sh.get("world_size"), f"{where}.seen", "expected one entry per rank")
            check((sh.get("svg") is None) != (sh.get("error") is None), where, "expected exactly one of svg, error")
    return problems


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in _as_tuple(types))


def validate_card(card) -> None:
    """Check a card (the JSON twin, decoded) against the schema in this module's docstring.

    Checks keys, types, the outcome codes, that each verdict matches its outcome, that ``summary``
    counts the facts' outcomes, and that ``sharding`` has a picture or an error.

    Raises:
        ValueError: listing every problem, one per line, as ``"card.topics[0].facts[2].outcome: ..."``.
    """
    problems = _problems_of(card)
    if problems:
        raise ValueError(f"semantics card does not match schema {SCHEMA}:\n" + "\n".join(problems))
