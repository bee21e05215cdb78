"""The card's schema as the one definition, and the version matrix built from cards (ddpprobe/card/schema.py,
releases.py, matrix.py). No worlds run here: cards are built in memory and checked with the validator."""

import copy
import json

import pytest

from ddpprobe.card import matrix, releases
from ddpprobe.card.plugin import fact_row
from ddpprobe.card.schema import (
    OUTCOMES,
    SCHEMA,
    SCHEMA_DOCUMENT,
    TEST_OUTCOMES,
    card_problems,
    validate_card,
    verdict_words,
)


def _fact(function: str, outcome: str, case=None, detail=None) -> dict:
    meta = {
        "nodeid": f"tests/facts/test_x.py::{function}" + (f"[{case}]" if case else ""),
        "function": function,
        "case": case,
        "params": {},
        "world_size": None,
        "doc": "",
    }
    row = fact_row(meta, {}, [])
    row.update(outcome=outcome, detail=detail, verdict=verdict_words(outcome, detail))
    return row


def _card(distribution: str, version: str, facts: list, tooling=None) -> dict:
    """A valid card of ``distribution==version`` holding ``facts`` in one topic; ``tooling``: the left-out
    tests as ``[(nodeid, pytest outcome, detail)]`` (None: a card written before it had a tooling entry)."""
    package = {"pytorch-lightning": "pytorch_lightning", "lightning": "lightning"}[distribution]
    card = {
        "schema": SCHEMA,
        "generated": "2026-01-01T00:00:00+00:00",
        "command": ["-q"],
        "environment": {
            "python": "3.11.7",
            "torch": "2.13.0",
            "lightning_package": package,
            "lightning_distribution": distribution,
            "lightning": version,
            "torchmetrics": "1.9.0",
            "platform": "Linux",
            "cpu_count": 2,
            "gpu_count": 0,
        },
        "backend": "gloo",
        "world_sizes": [],
        "summary": {code: sum(f["outcome"] == code for f in facts) for code in OUTCOMES},
        "topics": [{"module": "test_x", "path": "tests/facts/test_x.py", "topic": "X.", "facts": facts}],
        "left_out": [nodeid for nodeid, _, _ in tooling or []],
        "sharding": None,
    }
    if tooling is not None:
        card["tooling"] = {
            "summary": {w: sum(outcome == w for _, outcome, _ in tooling) for w in TEST_OUTCOMES},
            "not_passed": [{"nodeid": n, "outcome": o, "detail": d} for n, o, d in tooling if o != "passed"],
        }
    validate_card(card)
    return card


def test_the_outcome_codes_and_their_words_live_in_the_schema_file_only():
    """``schema.json``'s ``$defs.outcome`` lists the outcome codes with their card words and matrix cells;
    ``OUTCOMES`` (used by the writer, the Markdown, the validator and the matrix) is read from it, and
    the schema's ``$id`` is the ``schema`` value every card carries."""
    entries = SCHEMA_DOCUMENT["$defs"]["outcome"]["oneOf"]
    assert [e["const"] for e in entries] == list(OUTCOMES)
    assert {e["const"]: e["title"] for e in entries} == {code: o.words for code, o in OUTCOMES.items()}
    assert SCHEMA == SCHEMA_DOCUMENT["$id"] == SCHEMA_DOCUMENT["properties"]["schema"]["const"]
    assert matrix.cell_text("bug_fixed") == "**bug absent**" and matrix.cell_text("bug_present") == "bug present"
    assert verdict_words("skipped", "needs 8 GPUs") == "skipped: needs 8 GPUs"


def test_the_validator_names_each_place_a_card_breaks_the_schema():
    """A wrong package name, an unknown key, a verdict that does not match its outcome and a picture with
    neither svg nor error are each reported with their path in the card."""
    card = _card("pytorch-lightning", "2.6.6", [_fact("test_a", "holds")])
    broken = copy.deepcopy(card)
    broken["environment"]["lightning_package"] = "pl"
    broken["topics"][0]["facts"][0]["colour"] = "red"
    problems = card_problems(broken)
    assert any(p.startswith("card.environment.lightning_package: ") for p in problems), problems
    assert any(p.startswith("card.topics[0].facts[0]: unknown key") and "colour" in p for p in problems), problems

    wrong_verdict = copy.deepcopy(card)
    wrong_verdict["topics"][0]["facts"][0]["verdict"] = "does not hold"
    with pytest.raises(ValueError, match=r"card.topics\[0\].facts\[0\].verdict: 'does not hold' does not match"):
        validate_card(wrong_verdict)

    no_picture = copy.deepcopy(card)
    no_picture["sharding"] = {
        "n": 10,
        "world_size": 4,
        "batch_size": 2,
        "backend": "gloo",
        "seen": None,
        "duplicates": [],
        "padding": [],
        "svg": None,
        "error": None,
    }
    with pytest.raises(ValueError, match=r"card.sharding: "):
        validate_card(no_picture)


def test_the_matrix_releases_are_the_last_1x_and_the_last_patch_of_every_2x_minor_of_the_index_list():
    """From an index list the rule picks 1.9.5 (the last 1.x), 2.0.9.post0 (a post-release is its release's
    latest), 2.5.6 (not 2.5.1) and skips release candidates; ``lightning`` gets only the newest."""
    listed = [
        "2.6.1rc1",
        "2.6.0",
        "2.5.6",
        "2.5.1.post0",
        "2.5.1",
        "2.0.9.post0",
        "2.0.9",
        "1.9.5",
        "1.9.4",
        "1.8.6",
        "0.10.0",
        "not-a-version",
    ]
    assert releases.matrix_releases(listed) == ["1.9.5", "2.0.9.post0", "2.5.6", "2.6.0"]
    assert releases.releases("lightning", newest_only=True, versions=listed) == ["2.6.0"]


def test_without_the_index_the_matrix_uses_the_pinned_releases_and_says_so(monkeypatch, capsys):
    """When ``pip index versions`` cannot answer, :data:`releases.PINNED` is used and stderr says why."""

    def offline(distribution, timeout=60.0):
        raise RuntimeError("pip index versions pytorch-lightning exited 1: no network")

    monkeypatch.setattr(releases, "registry_versions", offline)
    assert releases.releases("pytorch-lightning") == releases.PINNED["pytorch-lightning"]
    assert "no network" in capsys.readouterr().err
    assert releases.matrix_releases(releases.PINNED["pytorch-lightning"]) == releases.PINNED["pytorch-lightning"]


def test_a_fact_that_differs_between_the_two_packages_at_one_release_is_listed_as_such(tmp_path):
    """Cards of pytorch-lightning 2.6.6, lightning 2.6.6 and pytorch-lightning 2.5.6: ``test_b`` holds with
    ``pytorch_lightning`` and does not with ``lightning`` at 2.6.6, so the matrix lists it under "differ
    between the two packages" with the reason, in columns ``2.6.6`` and ``lightning 2.6.6``; ``test_a``
    holds everywhere and ``test_c`` ran with ``lightning`` only, so neither is listed there (``test_c`` is
    counted as not compared). The CLI merges the JSON files and refuses a broken one."""
    cards = [
        _card("pytorch-lightning", "2.6.6", [_fact("test_a", "holds"), _fact("test_b", "holds")]),
        _card(
            "lightning",
            "2.6.6",
            [
                _fact("test_a", "holds"),
                _fact("test_b", "does_not_hold", detail="rank 1 differs"),
                _fact("test_c", "holds"),
            ],
        ),
        _card("pytorch-lightning", "2.5.6", [_fact("test_a", "holds"), _fact("test_b", "holds")]),
    ]
    built = matrix.build_matrix(cards)
    assert [c["column"] for c in built["columns"]] == ["2.5.6", "2.6.6", "lightning 2.6.6"]
    assert matrix.package_pairs(built) == [("2.6.6", "lightning 2.6.6")]
    differ, one_run = matrix.package_differences(built, "2.6.6", "lightning 2.6.6")
    assert ([r["function"] for r in differ], [r["function"] for r in one_run]) == (["test_b"], ["test_c"])

    text = matrix.render_matrix(built)
    section = text.split("## Facts that differ between the two packages at the same release")[1].split("\n## ")[0]
    assert "| fact | 2.6.6 | lightning 2.6.6 |" in section
    assert "| B. | holds | **does not hold** |" in section and "| A. |" not in section and "| C. |" not in section
    assert "1 test case(s) ran with one of the two packages only" in section
    assert "rank 1 differs" in section

    paths = []
    for i, card in enumerate(cards):
        paths.append(tmp_path / f"semantics-{i}.json")
        paths[-1].write_text(json.dumps(card))
    out = tmp_path / "matrix.md"
    assert matrix.main([*map(str, paths), "--out", str(out)]) == 0
    assert "lightning 2.6.6" in out.read_text()
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**cards[0], "schema": "ddpprobe.semantics/1"}))
    assert matrix.main([str(broken), "--out", str(out)]) == 2


def test_the_tooling_column_counts_each_releases_tooling_tests_and_names_every_one_that_did_not_pass():
    """Cards of 1.9.5 (one tooling test failed, one skipped for a feature 1.9.5 lacks), 2.6.6 (all passed)
    and 2.5.6 written before cards had a tooling entry: the matrix shows per release the tests, passed,
    failed and skipped (a failure in bold, "–" where the card has none), then each test that did not pass
    with the reason per release (the skip without "; installed ..."); ``tooling_failures`` counts 1. A
    card whose tooling counts do not add up to its left-out tests is refused."""
    fact = [_fact("test_a", "holds")]
    ok, fails, skips = "tests/tooling/t.py::test_ok", "tests/tooling/t.py::test_fails", "tests/tooling/t.py::test_new"
    reason = "applies to pytorch-lightning >=2.6 (EarlyStopping.stopping_reason); installed 1.9.5"
    cards = [
        _card(
            "pytorch-lightning",
            "1.9.5",
            fact,
            [(ok, "passed", None), (fails, "failed", "assert 1 == 2"), (skips, "skipped", reason)],
        ),
        _card(
            "pytorch-lightning", "2.6.6", fact, [(ok, "passed", None), (fails, "passed", None), (skips, "passed", None)]
        ),
        _card("pytorch-lightning", "2.5.6", fact),
    ]
    built = matrix.build_matrix(cards)
    assert matrix.tooling_failures(built) == 1

    section = matrix.render_matrix(built).split("## The tooling's own tests on each release")[1].split("\n## ")[0]
    assert "| release | tests | passed | failed | skipped | xfailed | xpassed | error | not run |" in section
    assert "| 1.9.5 | 3 | 1 | **1** | 1 | 0 | 0 | 0 | 0 |" in section
    assert "| 2.5.6 | – | – | – | – | – | – | – | – |" in section
    assert "| 2.6.6 | 3 | 3 | 0 | 0 | 0 | 0 | 0 | 0 |" in section
    assert f"- `{fails}`\n  - 1.9.5: failed: assert 1 == 2" in section
    assert (
        f"- `{skips}`\n  - 1.9.5: skipped: applies to pytorch-lightning >=2.6 (EarlyStopping.stopping_reason)\n"
        in section
    )
    assert f"`{ok}`" not in section

    miscounted = copy.deepcopy(cards[0])
    miscounted["tooling"]["summary"]["passed"] = 2
    assert any(p.startswith("card.tooling.summary: ") for p in card_problems(miscounted)), card_problems(miscounted)


def test_the_runs_table_states_each_releases_tooling_failures_and_whether_the_audit_and_guard_run_there():
    """Cards of 2.1.4 (two tooling tests failed), 2.6.6 (none) and a 2.7.0 no matrix ran before: the runs
    table shows 2 (bold) and 0 tooling failures, and *refused* below the support range (ddpprobe/_support.py:
    2.1 lacks the process group before prepare_data), *supported* inside it, *untested* above it;
    ``facts_per_column`` reads back each run's count of facts (skipped ones included); the header states
    the whole run's wall time when given."""
    facts = [_fact("test_a", "holds"), _fact("test_b", "skipped", detail="applies to pytorch-lightning >=2.6")]
    failing = [("tests/tooling/t.py::test_1", "failed", "x"), ("tests/tooling/t.py::test_2", "error", "y")]
    passing = [("tests/tooling/t.py::test_1", "passed", None), ("tests/tooling/t.py::test_2", "passed", None)]
    cards = [
        _card("pytorch-lightning", "2.1.4", facts, failing),
        _card("pytorch-lightning", "2.6.6", facts, passing),
        _card("pytorch-lightning", "2.7.0", facts[:1], passing),
    ]
    text = matrix.render_matrix(matrix.build_matrix(cards), wall_s=5400)
    runs = text.split("\nCells:")[0]
    rows = {line.split("|")[1].strip(): line for line in runs.splitlines() if line.startswith("| 2.")}
    assert rows["2.1.4"].endswith("| **2** | refused |"), rows["2.1.4"]
    assert rows["2.6.6"].endswith("| 0 | supported |"), rows["2.6.6"]
    assert rows["2.7.0"].endswith("| 0 | untested |"), rows["2.7.0"]
    assert matrix.facts_per_column(text) == {"2.1.4": 2, "2.6.6": 2, "2.7.0": 1}
    assert "The whole run took 1 h 30 min of wall time." in text
    assert matrix.facts_per_column("# no table here\n") == {}


def test_each_fact_that_changes_between_releases_is_listed_with_the_release_where_it_changes_and_why(monkeypatch):
    """Three pytorch-lightning releases: ``test_a`` fails on 1.9.5 and holds from 2.0.9.post0 on (both its
    cases), ``test_b`` holds on 1.9.5 and 2.0.9.post0 and is skipped on 2.6.6, ``test_c`` holds everywhere.
    The section names ``test_a`` with "does not hold → holds at 2.0.9.post0" and its reason from
    ddpprobe/card/changes.py, ``test_b`` with "holds → n/a at 2.6.6" as not yet explained, and not ``test_c``;
    a difference only the lightning column has is not a change between releases."""
    from ddpprobe.card import changes

    monkeypatch.setitem(
        changes.CHANGES, "tests/facts/test_x.py::test_a", changes.Change("Lightning 2.0 changed A.", "CHANGELOG 2.0.0")
    )
    old = [_fact("test_a", "does_not_hold", case=c, detail="no") for c in ("1", "2")] + [
        _fact("test_b", "holds"),
        _fact("test_c", "holds"),
    ]
    new = [_fact("test_a", "holds", case=c) for c in ("1", "2")] + [_fact("test_b", "holds"), _fact("test_c", "holds")]
    newest = [_fact("test_a", "holds", case=c) for c in ("1", "2")] + [
        _fact("test_b", "skipped", detail="applies to pytorch-lightning <2.6"),
        _fact("test_c", "holds"),
    ]
    only_lightning = newest[:3] + [_fact("test_c", "does_not_hold", detail="lightning only")]
    built = matrix.build_matrix(
        [
            _card("pytorch-lightning", "1.9.5", old),
            _card("pytorch-lightning", "2.0.9.post0", new),
            _card("pytorch-lightning", "2.6.6", newest),
            _card("lightning", "2.6.6", only_lightning),
        ]
    )
    section = matrix.render_matrix(built).split("## What changes between releases, and why")[1].split("\n## ")[0]
    assert (
        "- `tests/facts/test_x.py::test_a` (2 cases): does not hold → holds at 2.0.9.post0. "
        "Lightning 2.0 changed A. Source: CHANGELOG 2.0.0." in section
    ), section
    assert (
        "- `tests/facts/test_x.py::test_b` (1 case): holds → n/a at 2.6.6. "
        "Why: not yet explained in ddpprobe/card/changes.py." in section
    ), section
    assert "test_c" not in section, section
    assert "2 fact(s) (3 test cases) change their verdict" in section and "; 1 with the Lightning change" in section


def test_every_change_the_matrix_explains_names_a_test_function_of_the_facts():
    """Each key of ddpprobe/card/changes.py is ``tests/facts/<file>.py::<function>`` of a test that exists, so an
    explanation cannot outlive a renamed or removed fact unnoticed."""
    import pathlib
    import re

    from ddpprobe.card.changes import CHANGES

    root = pathlib.Path(__file__).resolve().parents[3]
    missing = []
    for key in CHANGES:
        path, _, function = key.partition("::")
        source = root / path
        if not (source.is_file() and re.search(rf"^\s*def {re.escape(function)}\(", source.read_text(), re.M)):
            missing.append(key)
    assert not missing, "ddpprobe/card/changes.py explains tests that do not exist:\n  " + "\n  ".join(missing)


def test_a_pip_without_index_versions_json_is_asked_again_for_the_text_form(monkeypatch):
    """An older pip (23.2) has ``pip index versions`` without ``--json`` (it exits 2, "no such option: --json"): the
    releases are then read from its text form, so the matrix does not fall back to the pinned list there."""
    import subprocess

    asked = []

    def old_pip(command, **kwargs):
        asked.append(list(command))
        if "--json" in command:
            return subprocess.CompletedProcess(command, 2, "", "ERROR: no such option: --json\n")
        return subprocess.CompletedProcess(
            command, 0, "lightning (2.6.6)\nAvailable versions: 2.6.6, 2.5.6, 1.9.5\n", ""
        )

    monkeypatch.setattr(subprocess, "run", old_pip)
    assert releases.registry_versions("lightning") == ["2.6.6", "2.5.6", "1.9.5"]
    assert ["--json" in command for command in asked] == [True, False]
