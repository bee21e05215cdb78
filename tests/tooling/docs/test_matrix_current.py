"""docs/matrix.md reports every fact of the suite: each release's run in it holds at least as many facts as the
suite's default run collects from ``tests/facts/``, so a fact added to the suite fails here until the matrix is
regenerated with ``nox -s facts matrix`` (docs/versions.md). The count of a run is read from the matrix's own
table (``ddpprobe.card.matrix.facts_per_column``, tested on rendered matrices in tests/tooling/card/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpprobe.card import matrix

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.not_a_fact("checks that docs/matrix.md reports every fact of the suite")

ROOT = Path(__file__).resolve().parents[3]
MATRIX = ROOT / "docs" / "matrix.md"


class _Items:
    """A pytest plugin that keeps the items a collection selected."""

    def __init__(self) -> None:
        self.items = []

    def pytest_collection_finish(self, session) -> None:
        self.items = list(session.items)


def test_docs_matrix_holds_every_fact_the_suite_has_on_every_release_it_shows(pytester):
    capture = _Items()
    pytester.inline_run(
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        "--backend",
        "gloo",
        "--rootdir",
        str(ROOT),
        "-c",
        str(ROOT / "pyproject.toml"),
        str(ROOT / "tests" / "facts"),
        plugins=[capture],
    )
    suite = len([item for item in capture.items if item.nodeid.startswith("tests/facts/")])
    assert suite, "the collection of tests/facts/ selected no facts"

    shown = matrix.facts_per_column(MATRIX.read_text(encoding="utf-8"))
    assert shown, f"{MATRIX} has no runs table; regenerate it with: nox -s facts matrix"
    behind = {column: facts for column, facts in shown.items() if facts < suite}
    assert not behind, (
        f"docs/matrix.md reports fewer facts than the suite's {suite}: "
        + ", ".join(f"{column}: {facts}" for column, facts in behind.items())
        + "; regenerate it with: nox -s facts matrix (docs/versions.md)"
    )
