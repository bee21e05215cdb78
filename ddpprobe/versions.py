"""Which pytorch-lightning releases a fact applies to, and the facts x versions matrix.

Facts about an API that changed between releases declare the range they apply to::

    from ddpprobe.versions import requires_lightning

    @requires_lightning("<2.0")
    def test_validation_epoch_end_receives_only_the_ranks_own_outputs(run_world): ...

Outside the range the fact is skipped with a reason that names both sides
("applies to pytorch-lightning <2.0; installed 2.6.6"), so the semantics card and the version matrix
show it as *not applicable* on that release rather than as a failure.

The matrix: ``noxfile.py`` runs the suite once per release, each run writing a semantics card JSON
(schema ``ddpprobe.semantics/1``, see ddpprobe/report.py); :func:`build_matrix` merges those cards
and :func:`render_matrix` writes the Markdown table. This module needs only the standard library and
``packaging`` (no torch, no Lightning), so it also runs as a script::

    python ddpprobe/versions.py matrix .nox-out/semantics-*.json --out docs/matrix.md
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import pathlib
import sys
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

#: The distribution whose version ranges refer to (the ``pytorch_lightning`` import package).
DISTRIBUTION = "pytorch-lightning"

#: The JSON schema of a semantics card this module reads (ddpprobe/report.py).
CARD_SCHEMA = "ddpprobe.semantics/1"


# ---------------------------------------------------------------------------------------------
# Version ranges of facts
# ---------------------------------------------------------------------------------------------


def installed_lightning() -> Optional[str]:
    """The installed pytorch-lightning version string (``"2.6.6"``), or None if it is not installed.

    Read from the distribution's metadata, so Lightning is not imported.
    """
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def lightning_in(spec: str, installed: Optional[str] = None) -> bool:
    """Whether ``installed`` (default: the installed pytorch-lightning) lies in ``spec``.

    Args:
        spec: a PEP 440 specifier set, e.g. ``">=2.0"``, ``"<2.0"``, ``">=2.0,<2.2"``. Post-releases
            count as their release (``2.0.9.post0`` is in ``">=2.0"``).
        installed: a version string; default :func:`installed_lightning`.

    Raises:
        packaging.specifiers.InvalidSpecifier: ``spec`` is not a specifier set.
        RuntimeError: no version was given and pytorch-lightning is not installed.
    """
    specifiers = SpecifierSet(spec)
    installed = installed if installed is not None else installed_lightning()
    if installed is None:
        raise RuntimeError(f"{DISTRIBUTION} is not installed; cannot tell whether it is {spec}")
    return specifiers.contains(Version(installed), prereleases=True)


def requires_lightning(spec: str):
    """A ``pytest.mark.skipif`` that runs the fact only on pytorch-lightning releases in ``spec``.

    The skip reason reads ``"applies to pytorch-lightning >=2.0; installed 1.9.5"``.

    Args:
        spec: a PEP 440 specifier set, e.g. ``">=2.0"`` or ``"<2.0"``.

    Raises:
        packaging.specifiers.InvalidSpecifier: ``spec`` is not a specifier set (at import of the test).
    """
    import pytest

    installed = installed_lightning()
    applies = installed is not None and lightning_in(spec, installed)
    return pytest.mark.skipif(
        not applies, reason=f"applies to {DISTRIBUTION} {spec}; installed {installed or 'none'}"
    )


# ---------------------------------------------------------------------------------------------
# The matrix: facts x versions
# ---------------------------------------------------------------------------------------------

#: Card outcome code -> cell text in the matrix.
CELL = {
    "holds": "holds",
    "does_not_hold": "**does not hold**",
    "bug_present": "bug present",
    "bug_fixed": "**bug absent**",
    "skipped": "n/a",
    "error": "**error**",
    "not_run": "not run",
    None: "–",
}

LEGEND = [
    ("holds", "the fact holds on that release (the test passed)"),
    ("**does not hold**", "the test failed on that release: the fact is false there"),
    ("bug present", "a known upstream bug (a strict xfail asserting the correct value) is still present"),
    ("**bug absent**", "the strict xfail passed: the known bug is not in that release (fixed, or not yet introduced)"),
    ("n/a", "not applicable: the fact skipped there (reason below, e.g. its API does not exist there)"),
    ("**error**", "the fact's set-up or tear-down failed"),
    ("not run", "collected but not run"),
    ("–", "the fact is not in that release's run (the test did not exist then)"),
]


def load_card(path) -> dict:
    """Read one semantics card JSON file.

    Raises:
        ValueError: the file is not a ``ddpprobe.semantics/1`` card, or names no pytorch-lightning version.
    """
    card = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if card.get("schema") != CARD_SCHEMA:
        raise ValueError(f"{path}: schema {card.get('schema')!r}, expected {CARD_SCHEMA!r}")
    if not (card.get("environment") or {}).get("pytorch_lightning"):
        raise ValueError(f"{path}: the card names no pytorch-lightning version")
    return card


def build_matrix(cards: list) -> dict:
    """Merge semantics cards (one per pytorch-lightning release) into a facts x versions matrix.

    Args:
        cards: card dicts (:func:`load_card`), any order, one per version (a later card of the same
            version replaces an earlier one).

    Returns:
        ``{"versions": [{"pytorch_lightning", "torchmetrics", "torch", "python", "summary",
        "generated"}], "topics": [{"module", "path", "topic", "rows": [{"nodeid", "function", "case",
        "fact", "cells": {version: {"outcome", "verdict", "detail"} | None}}]}]}``, versions ascending.
        Topics and rows keep the order of the newest card, then facts only older cards have.
    """
    by_version = {}
    for card in cards:
        by_version[card["environment"]["pytorch_lightning"]] = card
    versions = sorted(by_version, key=Version)
    topics: dict = {}
    rows: dict = {}
    for version in reversed(versions):  # newest first: its wording and order win
        for topic in by_version[version]["topics"]:
            entry = topics.setdefault(topic["module"], {
                "module": topic["module"], "path": topic["path"], "topic": topic["topic"], "rows": []})
            for fact in topic["facts"]:
                row = rows.get(fact["nodeid"])
                if row is None:
                    row = rows[fact["nodeid"]] = {
                        "nodeid": fact["nodeid"], "function": fact["function"], "case": fact["case"],
                        "fact": fact["fact"], "cells": {v: None for v in versions}}
                    entry["rows"].append(row)
                row["cells"][version] = {k: fact.get(k) for k in ("outcome", "verdict", "detail")}
    return {
        "versions": [
            {
                "pytorch_lightning": v,
                "torchmetrics": by_version[v]["environment"].get("torchmetrics"),
                "torch": by_version[v]["environment"].get("torch"),
                "python": by_version[v]["environment"].get("python"),
                "summary": by_version[v]["summary"],
                "generated": by_version[v]["generated"],
            }
            for v in versions
        ],
        "topics": list(topics.values()),
    }


def _outcome(cell) -> Optional[str]:
    return None if cell is None else cell["outcome"]


def differing_rows(matrix: dict) -> list:
    """Rows whose outcome is not the same on every version (a fact absent from a run counts as differing)."""
    return [row for topic in matrix["topics"] for row in topic["rows"]
            if len({_outcome(c) for c in row["cells"].values()}) > 1]


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _short(text, limit: int = 220) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fact_label(row: dict, previous_function: Optional[str]) -> str:
    fact = "″" if row["function"] == previous_function else _md(row["fact"])
    case = f" `[{row['case']}]`" if row["case"] else ""
    return f"{fact}{case}"


def render_matrix(matrix: dict, command: str = "nox -s facts matrix") -> str:
    """The matrix as Markdown: header, legend, the facts that differ across versions (with the reason
    for every cell that is not *holds*), then every fact by topic."""
    versions = [v["pytorch_lightning"] for v in matrix["versions"]]
    lines = [
        "# Version matrix: which facts hold on which pytorch-lightning release",
        "",
        f"Generated by `{command}` (noxfile.py) on "
        f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}: the whole suite ran once "
        "per release, each in its own virtual environment with the same torch, and each run's semantics card "
        "(`--semantics-report`) was merged here. Do not edit by hand; rerun the command.",
        "",
        "| pytorch-lightning | torchmetrics | torch | Python | facts | holds | does not hold | bug present "
        "| bug absent | n/a (skipped) | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in matrix["versions"]:
        s = v["summary"]
        lines.append(
            f"| {v['pytorch_lightning']} | {v['torchmetrics']} | {v['torch']} | {v['python']} | {sum(s.values())} "
            f"| {s.get('holds', 0)} | {s.get('does_not_hold', 0)} | {s.get('bug_present', 0)} "
            f"| {s.get('bug_fixed', 0)} | {s.get('skipped', 0)} | {s.get('error', 0) + s.get('not_run', 0)} |"
        )
    lines += ["", "Cells:", ""]
    lines += [f"- {cell}: {meaning}" for cell, meaning in LEGEND]

    head = "| fact | " + " | ".join(versions) + " |"
    rule = "| --- | " + " | ".join("---" for _ in versions) + " |"

    differ = differing_rows(matrix)
    lines += ["", "## Facts that differ across versions", ""]
    if not differ:
        lines.append("None: every fact has the same verdict on every release.")
    else:
        lines += [f"{len(differ)} test case(s) do not have the same verdict on every release.", "", head, rule]
        previous = None
        for row in differ:
            cells = " | ".join(CELL[_outcome(row["cells"][v])] for v in versions)
            lines.append(f"| {_fact_label(row, previous)} | {cells} |")
            previous = row["function"]
        lines += ["", "Why, for every cell above that is not *holds* (versions with the same reason together):", ""]
        for row in differ:
            lines.append(f"- `{row['nodeid']}`")
            reasons: dict = {}
            for v in versions:
                cell = row["cells"][v]
                if cell is None:
                    reasons.setdefault("not in that run", []).append(v)
                elif cell["outcome"] != "holds":
                    if cell["outcome"] == "skipped":  # "applies to ...; installed 1.9.5": the column says which
                        why = (cell["detail"] or cell["verdict"]).split("; installed ")[0]
                    else:
                        why = cell["detail"] or cell["verdict"]
                    word = CELL[cell["outcome"]].strip("*")
                    reasons.setdefault(f"{word}: {_md(_short(why))}", []).append(v)
            lines += [f"  - {', '.join(vs)}: {why}" for why, vs in reasons.items()]

    lines += ["", "## Every fact", ""]
    for topic in matrix["topics"]:
        lines += [f"### {topic['module']}", "", f"`{topic['path']}`" + (f": {_md(_short(topic['topic'], 400))}" if topic["topic"] else ""), "", head, rule]
        previous = None
        for row in topic["rows"]:
            cells = " | ".join(CELL[_outcome(row["cells"][v])] for v in versions)
            lines.append(f"| {_fact_label(row, previous)} | {cells} |")
            previous = row["function"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python ddpprobe/versions.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("matrix", help="merge semantics card JSON files into a facts x versions Markdown table")
    merge.add_argument("cards", nargs="+", help="semantics card JSON files, one per pytorch-lightning release")
    merge.add_argument("--out", default="docs/matrix.md", help="Markdown file to write (default docs/matrix.md)")
    merge.add_argument("--json", default=None, help="also write the merged matrix as JSON here")
    merge.add_argument("--command", default="nox -s facts matrix", help="the command named in the header")
    args = parser.parse_args(argv)

    matrix = build_matrix([load_card(p) for p in args.cards])
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_matrix(matrix, command=args.command), encoding="utf-8")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(matrix, indent=1) + "\n", encoding="utf-8")
    differ = differing_rows(matrix)
    print(f"{out}: {sum(len(t['rows']) for t in matrix['topics'])} test cases x "
          f"{len(matrix['versions'])} versions ({', '.join(v['pytorch_lightning'] for v in matrix['versions'])}); "
          f"{len(differ)} differ across versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
