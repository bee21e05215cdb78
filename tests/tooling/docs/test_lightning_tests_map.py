"""docs/lightning-tests.md is the suite's: each of its rows (one distributed semantic Lightning's own tests
assert) names facts that exist, or gives the reason none does, and its count says how many name one.

A fact is named as ``tests/facts/<file>.py::<function>`` in backticks, without its parameters; a row that
names none says ``Not stated: <reason>``. The facts named are collected the way the default run collects
them (``--backend gloo``), with the ``integration`` marker let in, so a misspelt or removed fact fails here.
Every named fact must run on this machine or skip for a GPU reason (``run_if`` CUDA devices or
``--backend nccl``) or, on another Lightning release, for its release range; never for another reason.

A fact's provenance is its ``@pytest.mark.mirrors("tests_pytorch/...py::test_name", ...)`` marker, not its
file: the page is checked against the markers of every fact under tests/facts. A fact that mirrors a
Lightning test is named in a row whose "Lightning test" cell names each test it mirrors (a cell "same
test" means the row above's), and every row naming a marked fact names one of that fact's tests.
"""

from __future__ import annotations

import pathlib
import re

from ddpprobe.plugin import runif

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "lightning-tests.md"
#: One row of the table: ``| # | semantic | Lightning test | stated by |``.
ROW = re.compile(r"^\| (?P<number>\d+) \| .* \| (?P<stated>[^|]*) \|$")
#: A fact named in a row.
NAMED = re.compile(r"`(?P<path>tests/facts/[\w/]+\.py)::(?P<name>test_\w+)`")
#: The generated count sentence.
COUNT = re.compile(
    r"<!-- parity-count -->\n\*\*(?P<stated>\d+) of the (?P<rows>\d+) rows name a fact\*\*.*?(?P<reasons>\d+) give the"
    r" reason.*?<!-- /parity-count -->",
    re.S,
)
NOT_STATED = "Not stated: "


def rows(text: str) -> list:
    """``[(row number, its "stated by" cell)]`` in the page's order."""
    return [(int(m["number"]), m["stated"]) for m in map(ROW.match, text.splitlines()) if m]


def named(text: str) -> set:
    """Every ``(path, function)`` the page names."""
    return {(m["path"], m["name"]) for _, cell in rows(text) for m in NAMED.finditer(cell)}


def problems(text: str, collected: set) -> list:
    """What is wrong with the page ``text`` given the ``(path, function)`` pairs a collection found: rows
    missing, repeated or out of order, a row with neither a fact nor a reason, a named fact not
    collected, a count that is not the table's. Empty when the page is right."""
    found = []
    count = COUNT.search(text)
    if count is None:
        return ["no <!-- parity-count --> sentence"]
    table = rows(text)
    total = int(count["rows"])
    numbers = [n for n, _ in table]
    if numbers != list(range(1, total + 1)):
        missing = sorted(set(range(1, total + 1)) - set(numbers))
        repeated = sorted({n for n in numbers if numbers.count(n) > 1})
        found.append(f"rows should be 1..{total} in order: missing {missing}, repeated {repeated}, got {numbers}")
    stating = 0
    for number, cell in table:
        facts = [(m["path"], m["name"]) for m in NAMED.finditer(cell)]
        if facts:
            stating += 1
        elif not cell.startswith(NOT_STATED) or len(cell) <= len(NOT_STATED) + 10:
            found.append(f"row {number} names no fact and gives no reason ({NOT_STATED!r}...): {cell!r}")
        found += [
            f"row {number} names {p}::{n}, which is not a collected fact" for p, n in facts if (p, n) not in collected
        ]
    if (int(count["stated"]), int(count["reasons"])) != (stating, len(table) - stating):
        found.append(
            f"the count says {count['stated']} rows name a fact and {count['reasons']} give a reason; the table "
            f"has {stating} and {len(table) - stating}"
        )
    return found


def lightning_cells(text: str) -> dict:
    """``{row number: its "Lightning test" cell}``, a cell starting "same test" replaced by the row above's."""
    cells, previous = {}, ""
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            cell = line.split(" | ")[2]
            previous = previous if cell.startswith("same test") else cell
            cells[int(m["number"])] = previous
    return cells


def _test_name(target: str) -> str:
    """``test_y`` of ``tests_pytorch/.../test_x.py::test_y[params]``."""
    return target.split("::", 1)[1].split("[", 1)[0]


def provenance_problems(text: str, mirrors: dict) -> list:
    """What disagrees between the page ``text`` and ``mirrors`` (``{(path, function): [Lightning tests]}``, every
    fact with a ``mirrors`` marker): a marked fact the page does not name, a mirrored test no row naming the
    fact lists, a row naming a marked fact without listing any test it mirrors. Empty when they agree."""
    found = []
    cells = lightning_cells(text)
    rows_of: dict = {}
    for number, cell in rows(text):
        for m in NAMED.finditer(cell):
            rows_of.setdefault((m["path"], m["name"]), set()).add(number)
    for fact, targets in sorted(mirrors.items()):
        named_in = sorted(rows_of.get(fact, ()))
        if not named_in:
            found.append(f"{fact[0]}::{fact[1]} mirrors {targets} but no row names it")
            continue
        for target in targets:
            if not any(_test_name(target) in cells[n] for n in named_in):
                found.append(f"{fact[0]}::{fact[1]} mirrors {target}, which rows {named_in} do not list")
        for n in named_in:
            if not any(_test_name(target) in cells[n] for target in targets):
                found.append(f"row {n} names {fact[0]}::{fact[1]}, which mirrors none of its tests ({targets})")
    return found


class _Items:
    """A pytest plugin that keeps the items a collection selected."""

    def __init__(self) -> None:
        self.items = []

    def pytest_collection_finish(self, session) -> None:
        self.items = list(session.items)


def _function(item) -> tuple:
    return item.nodeid.split("::", 1)[0], getattr(item, "originalname", None) or item.name.split("[", 1)[0]


#: One collection of every fact file per process, shared by the tests below: torch's extensions cannot be
#: imported a second time, so a module collected twice in one process fails to import.
_COLLECTED: dict = {}


def _all_facts(pytester) -> dict:
    """``_collect`` of every ``tests/facts/test_*.py``, once per process."""
    if not _COLLECTED:
        facts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "facts").glob("test_*.py"))
        _COLLECTED.update(_collect(pytester, facts))
    return _COLLECTED


def _collect(pytester, paths) -> dict:
    """``{(path, function): [collected items]}`` of the fact files ``paths``, as the default run collects
    them with ``--backend gloo`` and the ``integration`` marker let in."""
    capture = _Items()
    pytester.inline_run(
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "",
        "--backend",
        "gloo",
        "--rootdir",
        str(ROOT),
        "-c",
        str(ROOT / "pyproject.toml"),
        *(str(ROOT / p) for p in sorted(paths)),
        plugins=[capture],
    )
    found: dict = {}
    for item in capture.items:
        found.setdefault(_function(item), []).append(item)
    return found


def test_every_row_names_facts_that_exist_or_the_reason_none_does(pytester):
    """Each row 1..65 is there once; each names at least one fact that a collection of its file finds, or
    says ``Not stated:`` and why; the count sentence is the table's."""
    text = PAGE.read_text(encoding="utf-8")
    collected = _all_facts(pytester)

    assert collected, "the collection of the named fact files found no tests"
    found = problems(text, set(collected))
    assert not found, "docs/lightning-tests.md:\n  " + "\n  ".join(found)


def test_every_named_fact_runs_here_or_skips_for_a_gpu_reason_only(pytester):
    """A named fact that cannot run on a machine without GPUs (``--backend gloo``) must say so with a GPU
    need (``run_if(min_gpus=...)`` or ``backend="nccl"``), and no named fact is skipped for any other
    reason than those and a Lightning release range (``run_if(lightning=...)``, for the release matrix):
    the page names facts a laptop runs, and their NCCL twins."""
    text = PAGE.read_text(encoding="utf-8")
    collected = _all_facts(pytester)
    here = runif.RunEnvironment.here("gloo")
    here = runif.RunEnvironment(
        backend="gloo",
        cuda_devices=0,
        lightning_distribution=here.lightning_distribution,
        lightning_version=here.lightning_version,
    )

    other = {}
    for key in sorted(named(text)):
        for item in collected.get(key, []):
            kinds = {kind for kind, _ in runif.unmet(runif.requirements_of(item), here)}
            static = item.get_closest_marker("skip") is not None
            if static or kinds - {runif.DEVICES, runif.BACKEND, runif.LIGHTNING}:
                other[item.nodeid] = sorted(kinds) + (["skip"] if static else [])
    assert not other, f"named facts that skip here for a reason other than GPUs: {other}"


def test_a_misspelt_fact_a_missing_row_a_row_without_reason_and_a_wrong_count_are_each_reported():
    """The checker can fail: on a copy of the page with one fact misspelt, one row removed, one row's
    reason removed and the count left as it was, ``problems`` names each of the four."""
    text = PAGE.read_text(encoding="utf-8")
    good = named(text)
    assert not problems(text, good), problems(text, good)
    path, name = sorted(good)[0]
    broken = text.replace(f"`{path}::{name}`", f"`{path}::{name}_misspelt`", 1)
    broken = "\n".join(line for line in broken.splitlines() if not line.startswith("| 7 | "))
    broken = re.sub(r"\| Not stated: [^|]*\|$", "|  |", broken, count=1, flags=re.M)

    found = problems(broken, good)
    assert any(f"{name}_misspelt" in p for p in found), found
    assert any("missing [7]" in p for p in found), found
    assert any("names no fact and gives no reason" in p for p in found), found
    assert any(p.startswith("the count says") for p in found), found


def _mirrors(collected: dict) -> dict:
    """``{(path, function): [Lightning tests]}`` of the collected facts carrying a ``mirrors`` marker."""
    found = {}
    for key, items in collected.items():
        marks = [m for item in items[:1] for m in item.iter_markers("mirrors")]
        if marks:
            found[key] = sorted({target for m in marks for target in m.args})
    return found


def test_every_fact_that_mirrors_a_lightning_test_is_named_in_the_row_of_that_test(pytester):
    """Every fact under tests/facts with ``@pytest.mark.mirrors(...)`` is named on the page in a row whose
    Lightning-test cell lists each test it mirrors, and no row names a marked fact for a test the fact does
    not mirror: the page's fact column agrees with the facts' own provenance."""
    text = PAGE.read_text(encoding="utf-8")
    mirrors = _mirrors(_all_facts(pytester))

    assert mirrors, "no fact carries a mirrors marker"
    found = provenance_problems(text, mirrors)
    assert not found, "docs/lightning-tests.md against the mirrors markers:\n  " + "\n  ".join(found)


def test_a_fact_mirroring_an_unlisted_test_or_named_in_the_wrong_row_is_reported():
    """The provenance check can fail: a marked fact given one more Lightning test that its row does not list,
    and a marked fact moved into another row, are each reported."""
    text = PAGE.read_text(encoding="utf-8")
    (number, cell), *_ = [(n, c) for n, c in rows(text) if NAMED.search(c)]
    first = NAMED.search(cell)
    fact = (first["path"], first["name"])
    listed = lightning_cells(text)[number]
    target = "tests_pytorch/x/test_x.py::" + re.search(r"(test_\w+)", listed.split("::", 1)[1])[1]
    assert not provenance_problems(text, {fact: [target]})

    found = provenance_problems(text, {fact: [target, "tests_pytorch/x/test_x.py::test_nobody_lists"]})
    assert any("test_nobody_lists" in p for p in found), found
    found = provenance_problems(text, {fact: ["tests_pytorch/x/test_x.py::test_nobody_lists"]})
    assert any(p.startswith(f"row {number} names") for p in found), found
