"""The pytest plugin that writes the semantics card: ``--semantics-report``, the ``semantics`` fixture, the hooks.

Enable it from a ``conftest.py`` (``pytest_plugins = [..., "ddpprobe.card.plugin"]``) or with
``-p ddpprobe.card.plugin``, then ask for a card::

    pytest --semantics-report=docs/semantics.md

After the run this writes ``docs/semantics.md`` (:mod:`ddpprobe.card.markdown`), its JSON twin
``docs/semantics.json`` (``ddpprobe/card/schema.json``, checked before writing) and the sharding picture
``docs/semantics-sharding.svg`` (:mod:`ddpprobe.card.sharding`; ``--semantics-no-picture`` leaves it out).
One row per test case; tests marked ``@pytest.mark.not_a_fact("reason")`` (tests of the tooling rather
than of DDP) are listed apart under ``left_out``, and how they ended under ``tooling`` (pytest's counts and
every test that did not pass, with its reason: the version matrix's tooling column).

Under pytest-xdist every worker attaches the fact's metadata (docstrings, parameters) to its set-up report
as ``report.semantics_fact`` (pytest serialises extra report attributes for xdist) and numbers travel in
``user_properties``; only the controller (the process without ``config.workerinput``) collects reports in
``pytest_runtest_logreport`` and writes the card, once.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Optional

import pytest

from ddpprobe.card import record
from ddpprobe.card.environment import environment
from ddpprobe.card.markdown import render_markdown
from ddpprobe.card.record import SemanticsRecorder
from ddpprobe.card.schema import OUTCOMES, SCHEMA, TEST_OUTCOME_OF, TEST_OUTCOMES, validate_card, verdict_words
from ddpprobe.card.sharding import PICTURE_WORLD_SIZE, sharding_entry
from ddpprobe.card.summary import order_topics

_PLUGIN_NAME = "ddpprobe-semantics-card"


@pytest.fixture
def semantics(request) -> SemanticsRecorder:
    """Records numbers shown in this fact's row of the semantics card (``--semantics-report``).

    ``semantics.number("synced mean", 4.58, vs=("single-process mean", 5.0))``. Harmless without the
    option: the numbers then only sit in ``item.user_properties``.
    """
    return SemanticsRecorder(request.node)


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
        config.pluginmanager.register(CardCollector(config), _PLUGIN_NAME)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "setup" and item.config.getoption("semantics_report", None):
        report.semantics_fact = record.fact_metadata(item)
    return report


def write_card(card: dict, path) -> None:
    """Write ``card`` as Markdown to ``path`` and as JSON to ``path`` with suffix ``.json``.

    Raises:
        ValueError: the card does not match ``schema.json`` (see :func:`ddpprobe.card.schema.validate_card`).
    """
    validate_card(card)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_markdown(card), encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps(card, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def fact_row(meta: dict, reports: dict, numbers: list) -> dict:
    """One fact of the card (``$defs.fact`` of ``schema.json``) from a test's metadata, reports and numbers."""
    outcome, detail = record.outcome_of(reports)
    duration = sum(getattr(r, "duration", 0.0) or 0.0 for r in reports.values())
    doc = meta["doc"]
    return {
        "nodeid": meta["nodeid"],
        "function": meta["function"],
        "case": meta["case"],
        "params": meta["params"],
        "world_size": meta["world_size"],
        "fact": record.fact_sentence(meta["function"], doc),
        "explanation": record.markdown_code(" ".join(doc.split())),
        "doc": doc,
        "outcome": outcome,
        "verdict": verdict_words(outcome, detail),
        "detail": detail,
        "numbers": numbers,
        "duration_s": round(float(duration), 4),
    }


def tooling_entry(reports_of: list) -> dict:
    """The card's ``tooling``: how the left-out tests ended, from ``[(nodeid, {phase: report})]`` in
    collection order; ``{"summary": {pytest outcome: count}, "not_passed": [{"nodeid", "outcome", "detail"}]}``."""
    summary = {word: 0 for word in TEST_OUTCOMES}
    not_passed = []
    for nodeid, reports in reports_of:
        code, detail = record.outcome_of(reports)
        word = TEST_OUTCOME_OF[code]
        summary[word] += 1
        if word != "passed":
            not_passed.append({"nodeid": nodeid, "outcome": word, "detail": detail})
    return {"summary": summary, "not_passed": not_passed}


class CardCollector:
    """Collects reports in the controller and writes the card at the end of the session."""

    def __init__(self, config):
        self.config = config
        self.path = Path(config.getoption("semantics_report")).expanduser()
        self.order: list = []  # node ids in collection order
        self.meta: dict = {}  # node id -> record.fact_metadata
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
            self.meta[item.nodeid] = record.fact_metadata(item)
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
        numbers = record.numbers_of(report)
        # every phase carries all numbers recorded so far; keep the longest list
        if numbers and len(numbers) >= len(self.numbers.get(report.nodeid, [])):
            self.numbers[report.nodeid] = numbers

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self._is_worker():
            return
        write_card(self.build_card(), self.path)
        self.written = self.path

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.written is None:
            return
        terminalreporter.write_sep("-", "semantics card")
        terminalreporter.write_line(f"semantics card: {self.written} (+ {self.written.with_suffix('.json').name})")
        if self.picture_error:
            terminalreporter.write_line(f"sharding picture not drawn: {self.picture_error}", yellow=True)

    def build_card(self) -> dict:
        """The card's data (``schema.json``) from the reports collected so far."""
        topics: dict = {}
        left_out: list = []
        for nodeid in self.order:
            meta = self.meta.get(nodeid) or record.metadata_from_nodeid(nodeid)
            if meta["not_a_fact"]:
                left_out.append(nodeid)
                continue
            topic = topics.setdefault(
                meta["path"], {"module": meta["module"], "path": meta["path"], "topic": "", "facts": []}
            )
            if not topic["topic"] and meta["module_doc"]:
                topic["topic"] = record.markdown_code(record.first_paragraph(meta["module_doc"]))
            topic["facts"].append(fact_row(meta, self.reports.get(nodeid, {}), self.numbers.get(nodeid, [])))
        facts = [f for t in topics.values() for f in t["facts"]]
        return {
            "schema": SCHEMA,
            "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": [str(a) for a in self.config.invocation_params.args],
            "environment": environment(),
            "backend": self.config.getoption("backend", None),
            "world_sizes": sorted({f["world_size"] for f in facts if f["world_size"] is not None}),
            "summary": {code: sum(f["outcome"] == code for f in facts) for code in OUTCOMES},
            "topics": order_topics(list(topics.values())),
            "left_out": left_out,
            "tooling": tooling_entry([(nodeid, self.reports.get(nodeid, {})) for nodeid in left_out]),
            "sharding": None if self.config.getoption("semantics_no_picture", False) else self._sharding(),
        }

    def _sharding(self) -> dict:
        backend = "gloo"
        if self.config.getoption("backend", None) == "nccl" and environment()["gpu_count"] >= PICTURE_WORLD_SIZE:
            backend = "nccl"
        entry = sharding_entry(
            self.path,
            backend,
            timeout=self.config.getoption("world_timeout", None),
            start_method=self.config.getoption("start_method", None),
        )
        self.picture_error = entry["error"]
        return entry
