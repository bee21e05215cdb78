"""What a reader of the semantics card sees first, and in which order (ddpprobe/card/summary.py, markdown.py).

Inner pytest runs over fake fact modules whose outcomes are fixed by construction: the seed question's
summary opens the card and answers only from facts that held, with their recorded numbers; sections
follow ``TOPIC_ORDER`` (ddpprobe/card/summary.py), as the README's table of tests does; the fact column
is the test's name and the docstring its explanation; the header names the Lightning package the facts
ran and its version.
"""

import importlib.util
import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from ddpprobe import _lightning
from ddpprobe.card import summary
from ddpprobe.card.record import fact_sentence
from ddpprobe.card.schema import validate_card

pytest_plugins = ["pytester"]

PLUGINS = [
    "-p",
    "ddpprobe.plugin.pytest_plugin",
    "-p",
    "ddpprobe.card.plugin",
    "-p",
    "no:cacheprovider",
    "--strict-markers",
]

#: Fake modules named like the seed question's fact modules: part 1 holds with a number, part 4 has one
#: fact that fails; parts 2 and 3 have no facts in the run.
SEED_MODULES = {
    "test_epoch_end_outputs": '''
"""Epoch end, faked."""


def test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end(semantics):
    """Rank 0 holds three of six samples."""
    semantics.number("samples in rank 0's epoch-end list", 3, vs=("all ranks together", 6))
''',
    "test_logging_sync_dist": '''
"""sync_dist, faked."""


def test_without_sync_dist_each_rank_keeps_its_own_value_and_only_rank_0s_reaches_the_log_file():
    pass


def test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset(semantics):
    semantics.number("synced mean", 5.0, vs=("single-process mean", 6.0))
    assert False, "deliberately not holding"
''',
}


def _run(pytester, files: dict, *extra, readme=None, subprocess=False):
    pytester.makepyfile(**files)
    if readme is not None:
        (pytester.path / "README.md").write_text(readme)
    card = pytester.path / "out" / "card.md"
    args = [*PLUGINS, "--backend", "gloo", f"--semantics-report={card}", "--semantics-no-picture", *extra]
    result = pytester.runpytest_subprocess(*args) if subprocess else pytester.runpytest_inprocess(*args)
    assert card.exists(), result.stdout.str()
    data = json.loads(card.with_suffix(".json").read_text())
    validate_card(data)
    return card.read_text(), data


def test_the_card_opens_with_the_seed_question_answered_only_by_facts_that_held_with_their_numbers(pytester):
    """The first section is the seed question: part 1 (its fact held) gives the answer, the fact's
    numbers and a link to its section; part 4 (one of its facts failed) says it is not established and
    why instead of answering; parts without facts in the run say so. Only then comes the run's header."""
    markdown, card = _run(pytester, SEED_MODULES)

    headings = [line for line in markdown.splitlines() if line.startswith("## ")]
    assert headings[0] == "## The seed question, answered by this run", headings
    assert headings.index("## This run") == 1, headings
    block = markdown.split("## The seed question, answered by this run")[1].split("## This run")[0]
    parts = dict(re.findall(r"^(\d)\. (.*?)(?=^\d\. |\Z)", block, flags=re.M | re.S))
    assert sorted(parts) == ["1", "2", "3", "4", "5"], block

    assert summary.SEED_QUESTIONS[0].answer in parts["1"]
    assert "samples in rank 0's epoch-end list 3 vs all ranks together 6" in parts["1"]
    assert "(#test_epoch_end_outputs)" in parts["1"]
    assert "**Not established by this run**" in parts["4"] and summary.SEED_QUESTIONS[3].answer not in markdown
    assert (
        "`test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset`: 0 of 1 cases hold"
        in parts["4"]
    )
    assert "not in this run" in parts["2"] and "not in this run" in parts["3"] and "not in this run" in parts["5"]
    answers = summary.seed_answers(card)
    assert [a["answer"] is not None for a in answers] == [True, False, False, False, False]


def test_the_summary_points_beyond_the_seed_question_to_the_sections_of_the_pattern_facts_that_ran(
    pytester, monkeypatch
):
    """After the seed question, the summary points to each pattern page (``FURTHER_READING``) with links to
    the sections of its fact modules that are in the run: ``test_kiwi`` ran, ``test_absent`` did not, so
    only the first pointer appears, linking ``#test_kiwi`` alone, before the run's header."""
    monkeypatch.setattr(
        summary,
        "FURTHER_READING",
        (("Kiwis", "docs/kiwi.md", ("test_absent", "test_kiwi")), ("Absent", "docs/absent.md", ("test_absent",))),
    )
    markdown, card = _run(pytester, {"test_kiwi": "def test_one():\n    pass\n"})

    block = markdown.split("## The seed question, answered by this run")[1].split("## This run")[0]
    assert "- **Kiwis** (`docs/kiwi.md`): [test_kiwi](#test_kiwi)" in block, block
    assert "Absent" not in markdown and "test_absent" not in markdown
    assert summary.further_reading(card) == [{"title": "Kiwis", "page": "docs/kiwi.md", "modules": ["test_kiwi"]}]


def test_sections_follow_the_topic_order_in_code_and_the_rest_come_after_alphabetically(pytester, monkeypatch):
    """With ``TOPIC_ORDER`` listing ``test_zebra.py`` before ``test_apple.py``, the card's sections (JSON
    ``topics`` and Markdown headings) follow it, and the modules absent from it (``test_kiwi.py``,
    ``test_mango.py``) come after, alphabetically. A README beside them listing the files in another order
    changes nothing: the card reads no README."""
    monkeypatch.setattr(summary, "TOPIC_ORDER", ("test_zebra.py", "test_apple.py"))
    readme = """# x

## What the tests answer

| file | question |
| --- | --- |
| `test_mango.py` | m? |
| `test_apple.py` | a? |
| `test_kiwi.py` | k? |
| `test_zebra.py` | z? |
"""
    files = {name: "def test_one():\n    pass\n" for name in ("test_apple", "test_kiwi", "test_mango", "test_zebra")}
    markdown, card = _run(pytester, files, readme=readme)

    order = ["test_zebra", "test_apple", "test_kiwi", "test_mango"]
    assert [t["module"] for t in card["topics"]] == order
    assert [line[3:] for line in markdown.splitlines() if line[3:] in order] == order


def table_paths(markdown: str) -> list:
    """The ``.py`` paths in the first column of the "What the tests answer" table (under a heading of any
    level with that title), in order."""
    match = re.search(r"^#+ What the tests answer\s*$(.*?)(?=^#+ |\Z)", markdown, flags=re.M | re.S)
    assert match, "no 'What the tests answer' section"
    paths = []
    for line in match.group(1).splitlines():
        if line.startswith("|"):
            first_cell = line.strip("|").split("|")[0]
            paths += [p for p in re.findall(r"`([^`]+\.py)`", first_cell) if p not in paths]
    return paths


@pytest.mark.parametrize("page", ["README.md", "docs/tests.md"])
def test_the_tables_of_tests_list_every_topic_of_the_card_in_the_cards_order(page):
    """The "What the tests answer" tables (the README's, and the full map in docs/tests.md) and the card's
    sections agree: the fact modules a table names are exactly those of ``TOPIC_ORDER``, in that order,
    and each exists. (A fact module in neither still gets its section on the card, after these.)"""
    root = Path(__file__).resolve().parents[3]
    order = list(summary.TOPIC_ORDER)
    missing = [path for path in order if not (root / path).is_file()]
    assert not missing, f"TOPIC_ORDER names files that do not exist: {missing}"
    table = [p for p in table_paths((root / page).read_text(encoding="utf-8")) if p.startswith("tests/facts/")]
    assert table == order, (
        f"{page}'s 'What the tests answer' table and ddpprobe.card.summary.TOPIC_ORDER differ:\n"
        f"  only in {page}: {[p for p in table if p not in order]}\n"
        f"  only in TOPIC_ORDER: {[p for p in order if p not in table]}\n"
        f"  {page} order: {table}\n  TOPIC_ORDER: {order}"
    )


def test_the_fact_column_is_the_tests_name_and_the_docstring_is_its_explanation(pytester):
    """A docstring whose first sentence is the set-up (or a claim the test refutes) does not become the
    fact: the row shows the test's name as a sentence, identifiers named in the docstring as code and
    capitals the docstring uses restored; the whole docstring follows the table as the explanation."""
    source = '''
def test_with_sync_dist_the_f1_is_not_the_mean_of_batch_f1():
    """The docs say F1 is averaged. That claim is wrong: with ``sync_dist`` Lightning averages batch F1."""
'''
    markdown, card = _run(pytester, {"test_fake": source})

    fact = card["topics"][0]["facts"][0]
    expected = "With `sync_dist` the F1 is not the mean of batch F1."
    assert fact["fact"] == expected == fact_sentence(fact["function"], fact["doc"])
    assert (
        fact["explanation"]
        == "The docs say F1 is averaged. That claim is wrong: with `sync_dist` Lightning averages batch F1."
    )
    row = next(line for line in markdown.splitlines() if line.startswith("| With"))
    assert row.split(" | ")[0] == f"| {expected}"
    assert "The docs say" not in row
    details = markdown.split("<details>", 1)[1]
    assert f"- **{expected}** {fact['explanation']}" in details


#: The Lightning import packages installed here (``lightning`` is an optional extra).
INSTALLED = [p for p, (module, _, _) in _lightning.PACKAGES.items() if importlib.util.find_spec(module.split(".")[0])]


@pytest.mark.parametrize("package", INSTALLED)
@pytest.mark.integration
def test_the_header_names_the_lightning_package_the_facts_ran_and_its_version(pytester, monkeypatch, package):
    """With ``DDPPROBE_LIGHTNING=<package>`` the card's environment and header name that import package,
    its distribution and the distribution's installed version (read from its metadata), for
    ``pytorch_lightning`` and for the unified ``lightning`` alike (each one installed here)."""
    distribution = _lightning.PACKAGES[package][2]
    installed = version(distribution)
    monkeypatch.setenv(_lightning.ENV_VAR, package)
    markdown, card = _run(pytester, {"test_fake": "def test_one():\n    pass\n"}, subprocess=True)

    env = card["environment"]
    assert (env["lightning_package"], env["lightning_distribution"], env["lightning"]) == (
        package,
        distribution,
        installed,
    )
    assert f"| Lightning | `{package}` ({distribution} {installed}) |" in markdown
    assert f"on `{package}` {installed}." in markdown.split("\n\n")[1]
