"""The semantics card (``pytest --semantics-report=PATH.md``, ddpprobe/card/): what it says about a run.

Each test runs a tiny inner pytest session over a fake fact module whose outcomes are fixed by
construction (a passing fact, a failing one, a strict xfail that fails, one that passes, a skip, a
parametrised fact) and reads the card it wrote. Only the picture test starts a world (the real one
the card draws: ``validation.validate`` with N=10 at world size 4).
"""

import json
import math
import xml.etree.ElementTree as ET
from importlib.metadata import version

import pytest

from ddpprobe import _lightning
from ddpprobe.card.schema import SCHEMA, TEST_OUTCOMES, validate_card
from ddpprobe.card.sharding import picture_path
from tests.support import oracle

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.not_a_fact("tests the semantics card itself, not a fact about DDP")

FAKE_FACTS = '''
"""Arithmetic, as a tiny topic.

A second paragraph that the card leaves out."""
import pytest
from ddpprobe.card.record import record_number


def test_two_plus_two_is_four(request, semantics):
    """Two plus two is four. Further sentences stay in the docstring."""
    semantics.number("synced mean", 17 / 3, vs=("single-process mean", 5.0))
    record_number(request, "duplicates", 2)
    assert 2 + 2 == 4


def test_one_is_two():
    """One is two, deliberately wrong."""
    assert 1 == 2, "one is not two"


@pytest.mark.xfail(strict=True, reason="example.org/issue/1: one is not two yet")
def test_an_upstream_bug():
    assert 1 == 2


@pytest.mark.xfail(strict=True, reason="example.org/issue/2: fixed upstream")
def test_a_fixed_bug():
    assert 1 == 1


@pytest.mark.parametrize("world_size", [1, 3])
def test_world_sizes_are_positive(world_size):
    assert world_size > 0


def test_needs_more_gpus():
    pytest.skip("needs 8 GPUs")


@pytest.mark.not_a_fact("tooling")
def test_the_tooling_works():
    pass
'''

#: The verdict each fake fact must get, by construction of FAKE_FACTS.
EXPECTED_VERDICTS = {
    "test_fake_facts.py::test_two_plus_two_is_four": "holds",
    "test_fake_facts.py::test_one_is_two": "does not hold",
    "test_fake_facts.py::test_an_upstream_bug": "known upstream bug still present",
    "test_fake_facts.py::test_a_fixed_bug": "known bug fixed",
    "test_fake_facts.py::test_world_sizes_are_positive[1]": "holds",
    "test_fake_facts.py::test_world_sizes_are_positive[3]": "holds",
    "test_fake_facts.py::test_needs_more_gpus": "skipped: needs 8 GPUs",
}
TOOLING = "test_fake_facts.py::test_the_tooling_works"

#: An inner conftest that logs which process (xdist worker id or "controller") writes a card.
WRITER_LOG = """
import os
import ddpprobe.card.plugin

_write_card = ddpprobe.card.plugin.write_card


def _logged_write_card(card, path):
    with open(os.path.join(os.path.dirname(os.path.dirname(str(path))), "writers.log"), "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "controller") + "\\n")
    _write_card(card, path)


ddpprobe.card.plugin.write_card = _logged_write_card
"""

PLUGINS = [
    "-p",
    "ddpprobe.plugin.pytest_plugin",
    "-p",
    "ddpprobe.card.plugin",
    "-p",
    "no:cacheprovider",
    "--strict-markers",
]


def _make_card(pytester, *extra, subprocess=False, source=FAKE_FACTS):
    """Run the fake facts with ``--semantics-report``; return (result, Markdown text, decoded JSON)."""
    pytester.makepyfile(test_fake_facts=source)
    card = pytester.path / "out" / "card.md"
    args = [*PLUGINS, "--backend", "gloo", f"--semantics-report={card}", *extra]
    result = pytester.runpytest_subprocess(*args) if subprocess else pytester.runpytest_inprocess(*args)
    assert card.exists(), result.stdout.str()
    return result, card.read_text(), json.loads(card.with_suffix(".json").read_text())


def _rows(markdown: str) -> dict:
    """Table rows of the card's fact sections, by test id (the last cell, in backticks)."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| ") and line.endswith("` |"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if len(cells) == 5:  # fact | case | verdict | numbers | test id
                rows[cells[-1].strip("`")] = cells
    return rows


def _facts(card: dict) -> dict:
    return {fact["nodeid"]: fact for topic in card["topics"] for fact in topic["facts"]}


def test_the_cards_json_validates_against_its_documented_schema_and_a_broken_card_does_not(pytester):
    """The JSON twin passes ``validate_card``; its header names this environment's versions, the
    backend and the world sizes the facts were parametrised with; and the validator rejects a card
    with a missing key, an unknown outcome, or a summary that does not count the facts."""
    _, _, card = _make_card(pytester, "--semantics-no-picture")

    validate_card(card)
    assert card["schema"] == SCHEMA
    assert card["environment"]["torch"] == version("torch")
    assert card["environment"]["lightning_package"] == _lightning.chosen()
    assert card["environment"]["lightning"] == version(_lightning.distribution())
    assert card["environment"]["torchmetrics"] == version("torchmetrics")
    assert card["backend"] == "gloo"
    assert card["world_sizes"] == [1, 3]
    assert card["sharding"] is None

    missing = {k: v for k, v in card.items() if k != "summary"}
    with pytest.raises(ValueError, match=r"card: missing key 'summary'"):
        validate_card(missing)
    unknown = json.loads(json.dumps(card))
    unknown["topics"][0]["facts"][0]["outcome"] = "maybe"
    with pytest.raises(ValueError, match=r"card.topics\[0\].facts\[0\].outcome"):
        validate_card(unknown)
    miscounted = json.loads(json.dumps(card))
    miscounted["summary"]["holds"] += 1
    with pytest.raises(ValueError, match=r"card.summary: does not count"):
        validate_card(miscounted)


def test_a_deliberately_failing_fact_is_reported_as_does_not_hold(pytester):
    """A fact whose assertion fails gets the verdict "does not hold", with the assertion's message."""
    result, markdown, card = _make_card(pytester, "--semantics-no-picture")
    result.assert_outcomes(passed=4, failed=2, skipped=1, xfailed=1)

    nodeid = "test_fake_facts.py::test_one_is_two"
    fact = _facts(card)[nodeid]
    assert (fact["outcome"], fact["verdict"]) == ("does_not_hold", "does not hold")
    assert "one is not two" in fact["detail"]
    assert _rows(markdown)[nodeid][2].startswith("**does not hold")


def test_a_strict_xfail_that_fails_is_reported_as_known_upstream_bug_still_present(pytester):
    """A ``xfail(strict=True)`` fact that fails (the bug is still there) reads "known upstream bug still
    present" with the xfail's reason; one that passes (pytest reports a strict XPASS as failed) reads
    "known bug fixed"; a skip reads "skipped: <reason>"."""
    _, markdown, card = _make_card(pytester, "--semantics-no-picture")

    facts, rows = _facts(card), _rows(markdown)
    for nodeid in (
        "test_fake_facts.py::test_an_upstream_bug",
        "test_fake_facts.py::test_a_fixed_bug",
        "test_fake_facts.py::test_needs_more_gpus",
    ):
        assert facts[nodeid]["verdict"] == EXPECTED_VERDICTS[nodeid], facts[nodeid]
        assert EXPECTED_VERDICTS[nodeid] in rows[nodeid][2], rows[nodeid]
    assert "example.org/issue/1" in facts["test_fake_facts.py::test_an_upstream_bug"]["detail"]


def test_the_markdown_has_a_row_for_every_collected_fact_and_leaves_out_tooling_tests(pytester):
    """Every test the inner run reported has exactly one row, with its verdict; a ``not_a_fact`` test
    has none and is listed under "Left out"; the section is headed by the module name and introduced
    by its docstring's first paragraph; a fact without a docstring is its name as a sentence."""
    result, markdown, card = _make_card(pytester, "--semantics-no-picture")

    ran = {rep.nodeid for rep in result.reprec.getreports("pytest_runtest_logreport")}
    rows = _rows(markdown)
    assert set(rows) == ran - {TOOLING}
    assert set(rows) == set(EXPECTED_VERDICTS)
    assert {nodeid: _facts(card)[nodeid]["verdict"] for nodeid in rows} == EXPECTED_VERDICTS
    assert card["left_out"] == [TOOLING] and f"- `{TOOLING}`" in markdown
    assert card["tooling"]["summary"] == {**{w: 0 for w in TEST_OUTCOMES}, "passed": 1}, card["tooling"]
    assert card["tooling"]["not_passed"] == []
    assert "## test_fake_facts" in markdown
    assert "`test_fake_facts.py`: Arithmetic, as a tiny topic." in markdown
    assert "second paragraph" not in markdown
    assert rows["test_fake_facts.py::test_two_plus_two_is_four"][0] == "Two plus two is four."
    assert rows["test_fake_facts.py::test_needs_more_gpus"][0] == "Needs more gpus."
    assert rows["test_fake_facts.py::test_world_sizes_are_positive[3]"][1] == "world_size=3"


def test_numbers_a_fact_records_appear_in_its_row(pytester):
    """``semantics.number(label, value, vs=(label, value))`` and ``record_number(request, ...)`` show up in
    the fact's row, floats with 6 significant digits, in the order recorded."""
    _, markdown, card = _make_card(pytester, "--semantics-no-picture")

    nodeid = "test_fake_facts.py::test_two_plus_two_is_four"
    expected = f"synced mean {17 / 3:.6g} vs single-process mean {5.0:.6g}; duplicates 2"
    assert _rows(markdown)[nodeid][3] == expected
    assert [n["value"] for n in _facts(card)[nodeid]["numbers"]] == [pytest.approx(17 / 3), 2]


@pytest.mark.integration
def test_under_xdist_the_controller_writes_one_card_with_the_workers_numbers(pytester, monkeypatch):
    """With ``-n 2`` the facts run on two workers; the controller alone writes the card, and it has the
    same rows and verdicts as a run without xdist, numbers included (they travel in user_properties)."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)  # this test may itself run on an xdist worker
    pytester.makeconftest(WRITER_LOG)
    result, markdown, card = _make_card(pytester, "-n", "2", "--semantics-no-picture", subprocess=True)

    result.stdout.fnmatch_lines(["*created: 2/2 workers*"])
    assert (pytester.path / "writers.log").read_text().split() == ["controller"]
    validate_card(card)
    assert {nodeid: fact["verdict"] for nodeid, fact in _facts(card).items()} == EXPECTED_VERDICTS
    assert _rows(markdown)["test_fake_facts.py::test_two_plus_two_is_four"][3].startswith("synced mean 5.66667")
    assert len([line for line in result.outlines if line.startswith("semantics card: ")]) == 1


def test_the_sharding_picture_has_one_cell_per_rank_and_slot_from_a_real_world(pytester):
    """The card's picture comes from a real world (N=10, world size 4): one SVG cell per (rank, slot)
    holding the sample id ``DistributedSampler`` deals there; only the padding is highlighted, i.e. the
    later copy of each repeated sample (padded list position ``slot * W + rank >= N``), not its original;
    and the card links to it."""
    n, world_size = 10, 4
    source = 'def test_one_fact():\n    """One fact."""\n'
    _, markdown, card = _make_card(pytester, source=source)

    svg = picture_path(pytester.path / "out" / "card.md")
    assert svg.exists() and svg.stat().st_size > 0, card["sharding"]
    assert f"]({svg.name})" in markdown
    seen = [sum(batches, []) for batches in card["sharding"]["seen"]]
    expected = [oracle.shard(n, world_size, r) for r in range(world_size)]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    duplicated = set(oracle.duplicates(n, world_size))
    assert card["sharding"]["duplicates"] == sorted(duplicated)

    cells = [
        el
        for el in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}rect")
        if el.get("class", "").split()[:1] == ["cell"]
    ]
    slots = math.ceil(n / world_size)
    by_position = {(int(c.get("data-rank")), int(c.get("data-slot"))): c for c in cells}
    assert len(cells) == len(by_position) == world_size * slots
    assert set(by_position) == {(r, s) for r in range(world_size) for s in range(slots)}
    for (rank, slot), cell in by_position.items():
        sample = int(cell.get("data-sample"))
        assert sample == expected[rank][slot]
        is_padding = slot * world_size + rank >= n  # DistributedSampler's list: 0..N-1, then the repeats
        assert ("duplicate" in cell.get("class").split()) == is_padding, (rank, slot, sample)
    marked = sorted([int(c.get("data-rank")), int(c.get("data-slot"))] for c in cells if "duplicate" in c.get("class"))
    assert marked == sorted(card["sharding"]["padding"])
    assert len(marked) == sum(oracle.duplicates(n, world_size).values()) == len(duplicated)
