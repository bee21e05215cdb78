"""docs/lightning-tests.md is the suite's: each of its rows (one distributed semantic Lightning's own tests
assert) names facts that exist, or gives the reason none does, and its count says how many name one.

A fact is named as ``tests/facts/<file>.py::<function>`` in backticks, without its parameters; a row that
names none says ``Not stated: <reason>``. The facts named are collected the way the default run collects
them (``--backend gloo``), with the ``integration`` marker let in, so a misspelt or removed fact fails here.
Every named fact must run on this machine or skip for a GPU reason (``run_if`` CUDA devices or
``--backend nccl``) or, on another Lightning release, for its release range; never for another reason.

A fact's provenance is its ``@pytest.mark.mirrors("tests_pytorch/...py::test_name", ..., row=N)`` marker, not its
file, and the page's fact column is generated from the markers of every fact under tests/facts: a marked fact
is named in every row whose "Lightning test" cell lists a test it mirrors (a cell "same test" lists the row
above's), or, where such a test is listed in several rows, in the rows ``row`` (an int or a tuple) picks. The
entries of a row that name no marked fact are the page's own, kept as written. To rewrite the column and the
count after a marked fact is added, moved or renamed, run from the repository root::

    python -m tests.tooling.docs.test_lightning_tests_map --write
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import pathlib
import re
import sys

import pytest

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


#: One Lightning test named in a "Lightning test" cell: ``dir/test_x.py::test_y``, or ``::test_y`` of the file named
#: before it in the cell.
LIGHTNING_TEST = re.compile(r"(?P<file>[\w./]*test_\w+\.py)?::(?P<test>test_\w+)")


def lightning_tests(cell: str, previous: tuple = ()) -> tuple:
    """``((file, test), ...)`` a "Lightning test" cell names; ``file`` as the cell spells it (a path suffix). A
    cell starting "same test" names the tests of the row above, ``previous``."""
    if cell.startswith("same test"):
        return previous
    found, file = [], ""
    for m in LIGHTNING_TEST.finditer(cell):
        file = m["file"] or file
        found.append((file, m["test"]))
    return tuple(found)


def lightning_rows(text: str) -> dict:
    """``{row number: ((file, test), ...)}``, the Lightning tests each row of the page names."""
    found, previous = {}, ()
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            previous = lightning_tests(line.split(" | ")[2], previous)
            found[int(m["number"])] = previous
    return found


def _lists(pairs: tuple, target: str) -> bool:
    """Whether the cell's ``pairs`` name ``target`` (``tests_pytorch/dir/test_x.py::test_y[params]``)."""
    path, name = target.split("[", 1)[0].split("::", 1)
    return any(test == name and (path == file or path.endswith("/" + file)) for file, test in pairs)


@dataclasses.dataclass(frozen=True)
class Mirror:
    """A fact with a ``@pytest.mark.mirrors(*targets, row=...)`` marker, as the page names it.

    Attributes:
        path, name: ``tests/facts/test_x.py`` and the function's name.
        targets: the Lightning tests it mirrors (``tests_pytorch/...py::test_y``).
        rows: the marker's ``row`` (an int or a tuple of them), the rows it belongs to where a test it mirrors is
            listed in several rows (Lightning tests that assert several semantics); empty when not given.
        note: what the entry says after the fact: ``(integration)`` for a fact the default run leaves out,
            ``(GPU, NCCL)`` for one that needs ``--backend nccl``.
    """

    path: str
    name: str
    targets: tuple
    rows: tuple = ()
    note: str = ""

    @property
    def entry(self) -> str:
        return f"`{self.path}::{self.name}`" + (f" {self.note}" if self.note else "")

    @property
    def gpu(self) -> bool:
        return self.note.startswith("(GPU")


def placement(text: str, mirrors: list) -> tuple:
    """Where each fact of ``mirrors`` (:class:`Mirror`, in the facts' collection order) belongs on the page
    ``text``: every row whose "Lightning test" cell lists a test it mirrors, or, where its marker gives
    ``row``, those rows. Returns ``({row number: [Mirror]}, [problem])``; a problem is a mirrored test no row
    lists, a test listed in several rows without ``row`` to choose, or a ``row`` that lists none of its tests."""
    tests_of = lightning_rows(text)
    placed: dict = {}
    found = []
    for fact in mirrors:
        label = f"{fact.path}::{fact.name}"
        listing = {target: [n for n, pairs in tests_of.items() if _lists(pairs, target)] for target in fact.targets}
        for target, numbers in listing.items():
            if not numbers:
                found.append(f"{label} mirrors {target}, which no row lists")
            elif len(numbers) > 1 and not fact.rows:
                found.append(f"{label} mirrors {target}, listed in rows {numbers}: say which with row=")
        wrong = [n for n in fact.rows if not any(n in numbers for numbers in listing.values())]
        if wrong:
            found.append(f"{label}: row= names rows {wrong}, which list none of its tests {list(fact.targets)}")
        rows = fact.rows or sorted({n for numbers in listing.values() for n in numbers})
        for target, numbers in listing.items():
            if numbers and fact.rows and not set(numbers) & set(fact.rows):
                found.append(f"{label} mirrors {target}, listed in rows {numbers}, none of its row= {list(rows)}")
        for n in rows:
            placed.setdefault(n, []).append(fact)
    return placed, found


def _entries(cell: str) -> list:
    """The ``"; "``-separated entries of a "stated by" cell (a ``;`` inside parentheses stays in its entry)."""
    entries, depth, start = [], 0, 0
    for i, char in enumerate(cell):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and cell.startswith("; ", i):
            entries.append(cell[start:i])
            start = i + 2
    return entries + [cell[start:]]


#: What may stand before a marked fact in its entry (pages written before the notes were generated said
#: "NCCL twin `...`").
LABELS = ("", "NCCL twin ", "GPU ")


def _marked_entry(entry: str, marked: set) -> bool:
    """An entry that states a marked fact: the page's generated part, rewritten by :func:`render`."""
    first = NAMED.search(entry)
    return first is not None and (first["path"], first["name"]) in marked and entry[: first.start()] in LABELS


def render(text: str, mirrors: list) -> str:
    """The page ``text`` with its fact column brought up to date with ``mirrors`` (:class:`Mirror`): in each row,
    the entries naming a marked fact are replaced by the facts :func:`placement` puts there (those that run here
    first, then the row's other entries as written, then those that need GPUs), and the count sentence is
    recomputed. Rows no marked fact belongs to keep their cell."""
    placed, _ = placement(text, mirrors)
    marked = {(fact.path, fact.name) for fact in mirrors}
    lines = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            number = int(m["number"])
            kept = [e for e in _entries(m["stated"]) if e.strip() and not _marked_entry(e, marked)]
            facts = placed.get(number, [])
            cell = "; ".join([f.entry for f in facts if not f.gpu] + kept + [f.entry for f in facts if f.gpu])
            line = line[: m.start("stated")] + cell + line[m.end("stated") :]
        lines.append(line)
    page = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    table = rows(page)
    stating = sum(1 for _, cell in table if NAMED.search(cell))
    count = (
        f"<!-- parity-count -->\n**{stating} of the {len(table)} rows name a fact** (`tests/facts/...::name`, without"
        f" its parameters); {len(table) - stating} give the reason\nnone does.\n<!-- /parity-count -->"
    )
    return COUNT.sub(lambda _: count, page, count=1)


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
        _COLLECTED.update(_collect(pytester, _fact_files()))
    return _COLLECTED


def collect_arguments(paths) -> list:
    """The collection of the fact files ``paths`` as the default run collects them, with ``--backend gloo`` and
    the ``integration`` marker let in."""
    return [
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
    ]


def _fact_files() -> list:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "facts").glob("test_*.py"))


def _by_function(items) -> dict:
    """``{(path, function): [collected items]}``, in collection order."""
    found: dict = {}
    for item in items:
        found.setdefault(_function(item), []).append(item)
    return found


def _collect(pytester, paths) -> dict:
    """``{(path, function): [collected items]}`` of the fact files ``paths`` (:func:`collect_arguments`)."""
    capture = _Items()
    pytester.inline_run(*collect_arguments(paths), plugins=[capture])
    return _by_function(capture.items)


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


#: The environment a fact's note is judged in: a machine without GPUs, ``--backend gloo``.
_CPU = runif.RunEnvironment(backend="gloo", cuda_devices=0)


def mirrors_of(collected: dict) -> list:
    """The :class:`Mirror` of each collected fact carrying a ``mirrors`` marker, in collection order."""
    found = []
    for (path, name), items in collected.items():
        marks = list(items[0].iter_markers("mirrors"))
        if not marks:
            continue
        rows_given = [m.kwargs["row"] for m in marks if "row" in m.kwargs]
        rows_given = sorted({n for r in rows_given for n in ((r,) if isinstance(r, int) else r)})
        kinds = {kind for kind, _ in runif.unmet(runif.requirements_of(items[0]), _CPU)}
        if kinds & {runif.DEVICES, runif.BACKEND}:
            note = "(GPU, NCCL)"
        elif items[0].get_closest_marker("integration") is not None:
            note = "(integration)"
        else:
            note = ""
        targets = tuple(sorted({target for m in marks for target in m.args}))
        found.append(Mirror(path, name, targets, tuple(rows_given), note))
    return found


def test_the_fact_column_is_generated_from_the_mirrors_markers(pytester):
    """Every fact under tests/facts with ``@pytest.mark.mirrors(...)`` is named in the rows whose Lightning-test
    cell lists a test it mirrors (or the rows its ``row=`` picks), and nowhere else; the page is what
    ``python -m tests.tooling.docs.test_lightning_tests_map --write`` writes from the markers."""
    text = PAGE.read_text(encoding="utf-8")
    mirrors = mirrors_of(_all_facts(pytester))

    assert mirrors, "no fact carries a mirrors marker"
    _, found = placement(text, mirrors)
    assert not found, "the mirrors markers against docs/lightning-tests.md:\n  " + "\n  ".join(found)
    fresh = render(text, mirrors)
    if fresh != text:
        diff = difflib.unified_diff(text.splitlines(), fresh.splitlines(), "page", "from the markers", lineterm="")
        pytest.fail(
            "docs/lightning-tests.md is stale:\n"
            + "\n".join(diff)
            + "\nupdate it with: python -m tests.tooling.docs.test_lightning_tests_map --write",
            pytrace=False,
        )


def test_a_marked_fact_is_written_into_its_rows_and_a_stale_or_unplaceable_one_is_reported():
    """The generator on a page of three rows (the second "same test"): a marked fact goes to the row of its
    test, replacing its old entry in another row while the rows' other entries stay; a fact mirroring a test
    two rows list needs ``row=``; a test no row lists, and a ``row=`` listing none of its tests, are reported."""
    page = (
        "<!-- parity-count -->\n**2 of the 4 rows name a fact** (`tests/facts/...::name`, without its parameters);"
        " 2 give the reason\nnone does.\n<!-- /parity-count -->\n\n"
        "| # | Semantic | Lightning test | Stated by |\n| --- | --- | --- | --- |\n"
        "| 1 | a | dir/test_a.py::test_one | `tests/facts/test_f.py::test_fact`; `tests/facts/test_h.py::test_y` |\n"
        "| 2 | b | same test | `tests/facts/test_h.py::test_z` |\n"
        "| 3 | c | test_b.py::test_two, ::test_three | `tests/facts/test_g.py::test_x` (kept; as written) |\n"
        "| 4 | d | test_c.py::test_four | Not stated: a reason long enough |\n"
    )
    fact = Mirror("tests/facts/test_f.py", "test_fact", ("tests_pytorch/dir/test_b.py::test_three",))
    twin = Mirror(
        "tests/facts/test_f.py", "test_twin", ("tests_pytorch/x/dir/test_a.py::test_one",), (2,), "(GPU, NCCL)"
    )

    assert placement(page, [fact, twin])[1] == []
    written = render(page, [fact, twin])
    assert rows(written) == [
        (1, "`tests/facts/test_h.py::test_y`"),
        (2, "`tests/facts/test_h.py::test_z`; `tests/facts/test_f.py::test_twin` (GPU, NCCL)"),
        (3, "`tests/facts/test_f.py::test_fact`; `tests/facts/test_g.py::test_x` (kept; as written)"),
        (4, "Not stated: a reason long enough"),
    ], rows(written)
    assert render(written, [fact, twin]) == written
    assert "**3 of the 4 rows name a fact**" in written and "; 1 give the reason" in written, written

    ambiguous = Mirror("tests/facts/test_f.py", "test_fact", ("tests_pytorch/dir/test_a.py::test_one",))
    assert any("say which with row=" in p for p in placement(page, [ambiguous])[1])
    nowhere = Mirror("tests/facts/test_f.py", "test_fact", ("tests_pytorch/dir/test_a.py::test_nobody_lists",))
    assert any("no row lists" in p for p in placement(page, [nowhere])[1])
    wrong_row = Mirror("tests/facts/test_f.py", "test_fact", ("tests_pytorch/dir/test_a.py::test_one",), (3,))
    assert any("row= names rows [3]" in p for p in placement(page, [wrong_row])[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.tooling.docs.test_lightning_tests_map",
        description="Show (or --write into docs/lightning-tests.md) the fact column the mirrors markers give.",
    )
    parser.add_argument("--write", action="store_true", help="rewrite docs/lightning-tests.md")
    args = parser.parse_args(argv)
    capture = _Items()
    code = pytest.main(collect_arguments(_fact_files()), plugins=[capture])
    if code != 0 or not capture.items:
        print(f"collection failed (pytest exit code {code})", file=sys.stderr)
        return 1
    text = PAGE.read_text(encoding="utf-8")
    mirrors = mirrors_of(_by_function(capture.items))
    placed, found = placement(text, mirrors)
    for problem in found:
        print(problem, file=sys.stderr)
    fresh = render(text, mirrors)
    sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), fresh.splitlines(True), "page", "markers"))
    if args.write and not found:
        PAGE.write_text(fresh, encoding="utf-8")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
