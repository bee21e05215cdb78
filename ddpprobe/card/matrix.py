"""The version matrix: semantics cards of several Lightning releases merged into one facts x releases table.

``noxfile.py`` runs the suite once per release (:mod:`ddpprobe.card.releases`), each run writing a card's
JSON twin; :func:`build_matrix` merges them and :func:`render_matrix` writes ``docs/matrix.md``: the facts'
verdicts, and a column of the tooling's own tests per release (``tooling`` of each card: pytest's counts and
every test that did not pass, with its reason). A column is
one (distribution, version): ``pytorch-lightning`` releases, and the unified ``lightning`` package at the
releases it ran, so a fact that differs between the two packages at the same release is listed as such.
The cell words come from the card's schema (``x-cell`` of each outcome in ``schema.json``). Needs the
standard library, ``packaging`` and ``jsonschema`` (no torch, no Lightning)::

    python -m ddpprobe.card.matrix .nox-out/semantics-*.json --out docs/matrix.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import sys
from typing import Optional

from packaging.version import Version

from ddpprobe import _support
from ddpprobe.card.changes import change_of
from ddpprobe.card.schema import OUTCOMES, SCHEMA, TEST_OUTCOMES, card_problems

#: The cell of a fact a run did not have (the test did not exist in that release's run).
ABSENT = "–"

#: Distributions in column order at the same version.
_DISTRIBUTIONS = ("pytorch-lightning", "lightning")


def cell_text(outcome: Optional[str]) -> str:
    """The matrix cell of an outcome code (``None``: not in that run); problems in bold."""
    if outcome is None:
        return ABSENT
    entry = OUTCOMES[outcome]
    return f"**{entry.cell}**" if entry.problem else entry.cell


def legend() -> list:
    """``(cell, meaning)`` pairs for every outcome and for an absent fact."""
    return [(cell_text(code), o.meaning) for code, o in OUTCOMES.items()] + [
        (ABSENT, "the fact is not in that release's run (the test did not exist then)")
    ]


def load_card(path) -> dict:
    """Read and check one semantics card JSON file.

    Raises:
        ValueError: the file is not a valid ``schema.json`` card (the message names the file and the
            problems; a card of an older schema says to regenerate it).
    """
    card = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if isinstance(card, dict) and card.get("schema") != SCHEMA:
        raise ValueError(
            f"{path}: schema {card.get('schema')!r}, expected {SCHEMA!r}; regenerate it with `nox -s facts`"
        )
    problems = card_problems(card)
    if problems:
        raise ValueError(f"{path}: not a semantics card:\n" + "\n".join(problems[:20]))
    if not card["environment"]["lightning"]:
        raise ValueError(f"{path}: the card names no Lightning version")
    return card


def column_of(card: dict) -> str:
    """The column a card fills: ``"2.6.6"`` for pytorch-lightning, ``"lightning 2.6.6"`` for the unified package."""
    env = card["environment"]
    prefix = "" if env["lightning_distribution"] == "pytorch-lightning" else f"{env['lightning_distribution']} "
    return prefix + env["lightning"]


def _column_key(card: dict) -> tuple:
    env = card["environment"]
    return Version(env["lightning"]), _DISTRIBUTIONS.index(env["lightning_distribution"])


def build_matrix(cards: list) -> dict:
    """Merge semantics cards (one per distribution and release) into a facts x releases matrix.

    Args:
        cards: card dicts (:func:`load_card`), any order; a later card of the same column replaces an
            earlier one.

    Returns:
        ``{"columns": [{"column", "distribution", "version", "torchmetrics", "torch", "python", "summary",
        "tooling", "generated"}], "topics": [{"module", "path", "topic", "rows": [{"nodeid", "function", "case",
        "fact", "cells": {column: {"outcome", "verdict", "detail"} | None}}]}]}``, columns by version,
        pytorch-lightning before lightning. Topics and rows keep the order of the newest card, then facts
        only older cards have. ``tooling`` is the card's (None for a card written before it had one).
    """
    by_column = {column_of(card): card for card in cards}
    columns = sorted(by_column, key=lambda c: _column_key(by_column[c]))
    topics: dict = {}
    rows: dict = {}
    for column in reversed(columns):  # newest first: its wording and order win
        for topic in by_column[column]["topics"]:
            entry = topics.setdefault(
                topic["module"], {"module": topic["module"], "path": topic["path"], "topic": topic["topic"], "rows": []}
            )
            for fact in topic["facts"]:
                row = rows.get(fact["nodeid"])
                if row is None:
                    row = rows[fact["nodeid"]] = {
                        "nodeid": fact["nodeid"],
                        "function": fact["function"],
                        "case": fact["case"],
                        "fact": fact["fact"],
                        "cells": {c: None for c in columns},
                    }
                    entry["rows"].append(row)
                row["cells"][column] = {k: fact[k] for k in ("outcome", "verdict", "detail")}
    described = []
    for column in columns:
        env, card = by_column[column]["environment"], by_column[column]
        described.append(
            {
                "column": column,
                "distribution": env["lightning_distribution"],
                "version": env["lightning"],
                "torchmetrics": env["torchmetrics"],
                "torch": env["torch"],
                "python": env["python"],
                "summary": card["summary"],
                "tooling": card.get("tooling"),
                "generated": card["generated"],
            }
        )
    return {"columns": described, "topics": list(topics.values())}


def _outcome(cell) -> Optional[str]:
    return None if cell is None else cell["outcome"]


def differing_rows(matrix: dict, columns: Optional[list] = None) -> list:
    """Rows whose outcome is not the same in every column of ``columns`` (default all; absent counts)."""
    columns = columns if columns is not None else [c["column"] for c in matrix["columns"]]
    return [
        row
        for topic in matrix["topics"]
        for row in topic["rows"]
        if len({_outcome(row["cells"][c]) for c in columns}) > 1
    ]


def package_differences(matrix: dict, pl_column: str, l_column: str) -> tuple:
    """``(rows that differ, rows in one run only)`` between a pytorch-lightning and a lightning column:
    a row differs when both runs have it and their outcomes are not the same."""
    both, one = [], []
    for row in differing_rows(matrix, [pl_column, l_column]):
        (both if row["cells"][pl_column] is not None and row["cells"][l_column] is not None else one).append(row)
    return both, one


def package_pairs(matrix: dict) -> list:
    """``(pytorch-lightning column, lightning column)`` for every release both packages ran."""
    by_version: dict = {}
    for c in matrix["columns"]:
        by_version.setdefault(c["version"], {})[c["distribution"]] = c["column"]
    return [(d["pytorch-lightning"], d["lightning"]) for d in by_version.values() if len(d) == 2]


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _short(text, limit: int = 220) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fact_label(row: dict, previous_function: Optional[str]) -> str:
    fact = "″" if row["function"] == previous_function else _md(row["fact"])
    return fact + (f" `[{row['case']}]`" if row["case"] else "")


def _table(rows: list, columns: list) -> list:
    lines = ["| fact | " + " | ".join(columns) + " |", "| --- | " + " | ".join("---" for _ in columns) + " |"]
    previous = None
    for row in rows:
        lines.append(
            f"| {_fact_label(row, previous)} | "
            + " | ".join(cell_text(_outcome(row["cells"][c])) for c in columns)
            + " |"
        )
        previous = row["function"]
    return lines


def _reasons(rows: list, columns: list) -> list:
    lines = []
    for row in rows:
        lines.append(f"- `{row['nodeid']}`")
        reasons: dict = {}
        for column in columns:
            cell = row["cells"][column]
            if cell is None:
                reasons.setdefault("not in that run", []).append(column)
            elif cell["outcome"] != "holds":
                why = cell["detail"] or cell["verdict"]
                if cell["outcome"] == "skipped":  # "applies to ...; installed 1.9.5": the column says which
                    why = why.split("; installed ")[0]
                reasons.setdefault(f"{OUTCOMES[cell['outcome']].cell}: {_md(_short(why))}", []).append(column)
        lines += [f"  - {', '.join(cs)}: {why}" for why, cs in reasons.items()]
    return lines


def tooling_failures(matrix: dict) -> int:
    """How many tests of the tooling failed or errored, summed over the columns (0: the tooling holds on
    every release)."""
    return sum(
        c["tooling"]["summary"]["failed"] + c["tooling"]["summary"]["error"] for c in matrix["columns"] if c["tooling"]
    )


def _tooling(matrix: dict) -> list:
    """The tooling's counts per column, then every test that did not pass somewhere, with the reason per column."""
    words = [w for w in TEST_OUTCOMES if w != "not_run"]
    lines = [
        "",
        "## The tooling's own tests on each release",
        "",
        "Each session also ran the tests of ddpprobe itself (`tests/tooling/`: the launcher, the audit, the "
        "guard, the trace, the card), which must pass on every release: a test skips only where the release "
        "lacks the Lightning feature it needs, named in its reason (docs/versions.md lists them).",
        "",
        "| release | tests | " + " | ".join(words) + " | not run |",
        "| --- | --- | " + " | ".join("---" for _ in words) + " | --- |",
    ]
    for c in matrix["columns"]:
        t = c["tooling"]
        if t is None:
            lines.append(f"| {c['column']} | {ABSENT} | " + " | ".join(ABSENT for _ in words) + f" | {ABSENT} |")
            continue
        s = t["summary"]
        cells = [f"**{s[w]}**" if s[w] and w in ("failed", "error", "xpassed") else str(s[w]) for w in words]
        lines.append(f"| {c['column']} | {sum(s.values())} | " + " | ".join(cells) + f" | {s['not_run']} |")
    by_test: dict = {}
    for c in matrix["columns"]:
        for entry in (c["tooling"] or {}).get("not_passed", []):
            why = entry["detail"] or "no reason given"
            if entry["outcome"] == "skipped":
                why = why.split("; installed ")[0]
            reason = f"{entry['outcome'].replace('_', ' ')}: {_md(_short(why))}"
            by_test.setdefault(entry["nodeid"], {}).setdefault(reason, []).append(c["column"])
    if by_test:
        lines += ["", "The tests that did not pass everywhere, with the reason per release:", ""]
        for nodeid, reasons in by_test.items():
            lines.append(f"- `{nodeid}`")
            lines += [f"  - {', '.join(cs)}: {why}" for why, cs in reasons.items()]
    return lines


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _tooling_failed(column: dict) -> str:
    t = column["tooling"]
    if t is None:
        return ABSENT
    failed = t["summary"]["failed"] + t["summary"]["error"]
    return f"**{failed}**" if failed else "0"


def support_cell(version: str) -> str:
    """Whether ``ddpprobe audit`` and ``CollectiveGuard`` run on a release (ddpprobe/_support.py): *supported*,
    *refused* (below the range: what the release lacks is in the refusal) or *untested* (newer than the range)."""
    if _support.missing_features(version):
        return "refused"
    minor = _support._minor(version)
    return "untested" if minor is not None and minor > _support.NEWEST_TESTED else "supported"


def transitions(row: dict, columns: list) -> list:
    """``[(column, outcome before, outcome from there)]``: where a row's outcome changes from one column to the
    next of ``columns`` (in order; a column the row is absent from is skipped)."""
    found, previous = [], None
    for column in columns:
        cell = row["cells"][column]
        if cell is None:
            continue
        if previous is not None and cell["outcome"] != previous:
            found.append((column, previous, cell["outcome"]))
        previous = cell["outcome"]
    return found


def _changes(matrix: dict) -> list:
    """One line per test function whose verdict changes between pytorch-lightning releases: where it changes,
    from what to what, and why (:mod:`ddpprobe.card.changes`)."""
    columns = [c["column"] for c in matrix["columns"] if c["distribution"] == "pytorch-lightning"]
    by_function: dict = {}
    for row in differing_rows(matrix, columns):
        steps = transitions(row, columns)
        if not steps:
            continue
        key = row["nodeid"].split("[", 1)[0]
        entry = by_function.setdefault(key, {"cases": 0, "steps": {}})
        entry["cases"] += 1
        for column, before, after in steps:
            entry["steps"].setdefault((column, before, after), 0)
            entry["steps"][(column, before, after)] += 1
    lines = ["", "## What changes between releases, and why", ""]
    if not by_function:
        return lines + ["No fact changes its verdict between the pytorch-lightning releases of this run."]
    explained = sum(change_of(k) is not None for k in by_function)
    lines += [
        f"{len(by_function)} fact(s) ({sum(e['cases'] for e in by_function.values())} test cases) change their "
        f"verdict between the pytorch-lightning releases of this run; {explained} with the Lightning change "
        "behind it (ddpprobe/card/changes.py). *At R* means: between the release before R in this run and R (the "
        "sentence names the Lightning release that made the change).",
        "",
    ]
    for key, entry in by_function.items():
        steps = "; ".join(
            f"{OUTCOMES[before].cell} → {OUTCOMES[after].cell} at {column}"
            + (f" ({n} of {entry['cases']} cases)" if n != entry["cases"] else "")
            for (column, before, after), n in entry["steps"].items()
        )
        change = change_of(key)
        why = (
            f"{change.why} Source: {change.source}."
            if change
            else "Why: not yet explained in ddpprobe/card/changes.py."
        )
        lines.append(f"- `{key}` ({entry['cases']} case{'s' if entry['cases'] > 1 else ''}): {steps}. {why}")
    return lines


def render_matrix(
    matrix: dict, command: str = "nox -s facts matrix", wall_s: Optional[float] = None, note: Optional[str] = None
) -> str:
    """The matrix as Markdown: the runs, a legend, the facts that change between releases with the release
    and why (:mod:`ddpprobe.card.changes`), the facts that differ between the two packages at the same
    release, the facts that differ across releases (each with the reason for every cell that is not
    *holds*), then every fact by topic.

    Args:
        matrix: :func:`build_matrix`'s result.
        command: the command named in the header.
        wall_s: seconds of wall time the whole run took (every ``facts`` session), stated in the header.
        note: a sentence added to the header (e.g. which releases a partial run left out).
    """
    columns = [c["column"] for c in matrix["columns"]]
    took = f" The whole run took {_duration(wall_s)} of wall time." if wall_s is not None else ""
    lines = [
        "# Version matrix: which facts hold on which Lightning release",
        "",
        f"Generated by `{command}` (noxfile.py) on "
        f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}: the whole suite ran once "
        "per release, each in its own virtual environment with the same torch, and each run's semantics card "
        "(`--semantics-report`) was merged here. A column named by a version alone is `pytorch-lightning`; "
        "`lightning X` is the unified package (`import lightning.pytorch`). Do not edit by hand; rerun the "
        f"command.{took}" + (f" {note}" if note else ""),
        "",
        _RUNS_HEADER + " holds | does not hold | bug present "
        "| bug absent | n/a (skipped) | error | tooling failed | audit and guard |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in matrix["columns"]:
        s = c["summary"]
        lines.append(
            f"| {c['column']} | {c['torchmetrics']} | {c['torch']} | {c['python']} | {sum(s.values())} "
            f"| {s['holds']} | {s['does_not_hold']} | {s['bug_present']} | {s['bug_fixed']} | {s['skipped']} "
            f"| {s['error'] + s['not_run']} | {_tooling_failed(c)} | {support_cell(c['version'])} |"
        )
    lines += ["", "Cells:", ""] + [f"- {cell}: {meaning}" for cell, meaning in legend()]
    lines += _tooling(matrix)
    lines += _changes(matrix)

    pairs = package_pairs(matrix)
    if pairs:
        lines += ["", "## Facts that differ between the two packages at the same release", ""]
        for pl_column, l_column in pairs:
            differ, one_run = package_differences(matrix, pl_column, l_column)
            alone = (
                f" {len(one_run)} test case(s) ran with one of the two packages only (not compared: "
                "the suite changed between the runs)."
                if one_run
                else ""
            )
            if not differ:
                lines += [
                    f"{pl_column}: none; every fact both runs have has the same verdict with "
                    f"`pytorch_lightning` and `lightning.pytorch`.{alone}",
                    "",
                ]
                continue
            lines += [f"{pl_column}: {len(differ)} test case(s) differ.{alone}", ""] + _table(
                differ, [pl_column, l_column]
            )
            lines += [""] + _reasons(differ, [pl_column, l_column]) + [""]

    differ = differing_rows(matrix)
    lines += ["", "## Facts that differ across releases", ""]
    if not differ:
        lines.append("None: every fact has the same verdict on every release.")
    else:
        lines += [f"{len(differ)} test case(s) do not have the same verdict on every release.", ""]
        lines += _table(differ, columns)
        lines += ["", "Why, for every cell above that is not *holds* (columns with the same reason together):", ""]
        lines += _reasons(differ, columns)

    lines += ["", "## Every fact", ""]
    for topic in matrix["topics"]:
        intro = f"`{topic['path']}`" + (f": {_md(_short(topic['topic'], 400))}" if topic["topic"] else "")
        lines += [f"### {topic['module']}", "", intro, ""] + _table(topic["rows"], columns) + [""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip() + "\n"


#: The first cells of the runs table's header row (:func:`render_matrix`), which :func:`facts_per_column` reads.
_RUNS_HEADER = "| release | torchmetrics | torch | Python | facts |"


def facts_per_column(markdown: str) -> dict:
    """``{column: facts}`` from a rendered matrix's runs table (the ``facts`` cell of each release's row):
    how many facts each run reported, skipped ones included. Empty when the text has no runs table.

    ``tests/tooling/docs/test_matrix_current.py`` compares it with the suite's facts, so a fact added to the
    suite fails there until ``nox -s facts matrix`` reports it.
    """
    found: dict = {}
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(_RUNS_HEADER):
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                found[cells[0]] = int(cells[4])
            break
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpprobe.card.matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("cards", nargs="+", help="semantics card JSON files, one per Lightning release and package")
    parser.add_argument("--out", default="docs/matrix.md", help="Markdown file to write (default docs/matrix.md)")
    parser.add_argument("--json", default=None, help="also write the merged matrix as JSON here")
    parser.add_argument("--command", default="nox -s facts matrix", help="the command named in the header")
    parser.add_argument("--wall-s", type=float, default=None, help="seconds of wall time the whole run took")
    parser.add_argument("--note", default=None, help="a sentence for the header (e.g. what a partial run left out)")
    args = parser.parse_args(argv)

    try:
        matrix = build_matrix([load_card(p) for p in args.cards])
    except (OSError, ValueError) as exc:
        print(f"python -m ddpprobe.card.matrix: {exc}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_matrix(matrix, command=args.command, wall_s=args.wall_s, note=args.note), encoding="utf-8")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(matrix, indent=1) + "\n", encoding="utf-8")
    print(
        f"{out}: {sum(len(t['rows']) for t in matrix['topics'])} test cases x {len(matrix['columns'])} "
        f"columns ({', '.join(c['column'] for c in matrix['columns'])}); {len(differing_rows(matrix))} differ "
        f"across releases, {sum(len(package_differences(matrix, *p)[0]) for p in package_pairs(matrix))} between "
        f"the two packages; {tooling_failures(matrix)} tests of the tooling failed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
