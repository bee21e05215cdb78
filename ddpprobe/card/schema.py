"""The card's JSON schema (``schema.json`` next to this file): one definition for the writer and the validator.

``schema.json`` is a JSON Schema (draft 2020-12) whose ``$id`` is the card's ``schema`` value. Besides the
shape of a card it defines the outcome codes a fact can have and how each is shown: the words on the card
(``title``), the cell in the version matrix (``x-cell``), whether a reason follows (``x-detail``) and whether
it is a problem worth bold type (``x-problem``). Everything in ddpprobe that names an outcome reads it from
here (:data:`OUTCOMES`), so a new outcome is one entry in ``schema.json``.

:func:`validate_card` checks a decoded card with ``jsonschema`` and then what a JSON Schema cannot say:
every verdict matches its outcome, ``summary`` counts the facts' outcomes, ``world_sizes`` is sorted and
``sharding.seen`` has one entry per rank.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

#: The schema, decoded from ``schema.json``.
SCHEMA_DOCUMENT: dict = json.loads((Path(__file__).with_name("schema.json")).read_text(encoding="utf-8"))

#: Value of the ``schema`` key of every card (the schema's ``$id``), e.g. ``"ddpprobe.semantics/2"``.
SCHEMA: str = SCHEMA_DOCUMENT["$id"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One outcome code of ``schema.json``'s ``$defs.outcome``, with how the card and the matrix show it."""

    code: str  #: ``"bug_present"``
    words: str  #: the verdict on the card, ``"known upstream bug still present"``
    cell: str  #: the cell in the version matrix, ``"bug present"``
    problem: bool  #: shown in bold (a fact that is false, a fixed bug whose xfail should go, an error)
    detail: bool  #: the verdict reads ``"<words>: <reason>"``
    meaning: str  #: one line for legends


#: Outcome code -> :class:`Outcome`, in the schema's order (holds first).
OUTCOMES: dict = {
    entry["const"]: Outcome(
        entry["const"], entry["title"], entry["x-cell"], entry["x-problem"], entry["x-detail"], entry["description"]
    )
    for entry in SCHEMA_DOCUMENT["$defs"]["outcome"]["oneOf"]
}


#: How a test of the tooling (``not_a_fact``) can end, in pytest's words, in the schema's order
#: (``$defs.test_outcome``): the card's ``tooling.summary`` keys and the version matrix's tooling columns.
TEST_OUTCOMES: tuple = tuple(SCHEMA_DOCUMENT["$defs"]["test_outcome"]["enum"])

#: The pytest word of each outcome code, for a test that states no fact.
TEST_OUTCOME_OF: dict = {
    "holds": "passed",
    "does_not_hold": "failed",
    "bug_present": "xfailed",
    "bug_fixed": "xpassed",
    "skipped": "skipped",
    "error": "error",
    "not_run": "not_run",
}


def verdict_words(outcome: str, detail: Optional[str]) -> str:
    """The verdict as the card shows it: ``"holds"``, ``"skipped: needs 8 GPUs"``.

    Raises:
        KeyError: ``outcome`` is not an outcome code of the schema.
    """
    entry = OUTCOMES[outcome]
    return f"{entry.words}: {detail or 'no reason given'}" if entry.detail else entry.words


def _where(path) -> str:
    where = "card"
    for part in path:
        where += f"[{part}]" if isinstance(part, int) else f".{part}"
    return where


def _message(error) -> str:
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        return "missing key " + ", ".join(map(repr, missing))
    if error.validator == "oneOf" and all("const" in s for s in error.validator_value):
        return f"expected one of {', '.join(s['const'] for s in error.validator_value)}, got {error.instance!r}"
    if error.validator == "additionalProperties" and error.validator_value is False:
        return error.message.replace("Additional properties are not allowed", "unknown key(s)")
    return error.message


def _schema_problems(card) -> list:
    import jsonschema  # here, so reading OUTCOMES needs no jsonschema (the matrix's release list does not)

    validator = jsonschema.Draft202012Validator(SCHEMA_DOCUMENT)
    return [
        f"{_where(e.absolute_path)}: {_message(e)}"
        for e in sorted(validator.iter_errors(card), key=lambda e: [str(p) for p in e.absolute_path])
    ]


def _consistency_problems(card: dict) -> list:
    """What the JSON Schema cannot say; runs only on a card that matches the schema."""
    problems = []
    facts = [
        (f"card.topics[{t}].facts[{f}]", fact)
        for t, topic in enumerate(card["topics"])
        for f, fact in enumerate(topic["facts"])
    ]
    for where, fact in facts:
        if fact["verdict"] != verdict_words(fact["outcome"], fact["detail"]):
            problems.append(f"{where}.verdict: {fact['verdict']!r} does not match outcome {fact['outcome']!r}")
    if set(card["summary"]) != set(OUTCOMES):
        problems.append(f"card.summary: expected keys {', '.join(OUTCOMES)}, got {', '.join(card['summary'])}")
    else:
        counted = {code: sum(fact["outcome"] == code for _, fact in facts) for code in OUTCOMES}
        if counted != card["summary"]:
            problems.append(f"card.summary: does not count the facts' outcomes {counted}")
    tooling = card.get("tooling")
    if tooling is not None:
        if set(tooling["summary"]) != set(TEST_OUTCOMES):
            problems.append(f"card.tooling.summary: expected keys {', '.join(TEST_OUTCOMES)}")
        elif sum(tooling["summary"].values()) != len(card["left_out"]):
            problems.append(f"card.tooling.summary: counts {len(card['left_out'])} left-out tests differently")
        elif len(tooling["not_passed"]) != len(card["left_out"]) - tooling["summary"]["passed"]:
            problems.append("card.tooling.not_passed: expected one entry per left-out test that did not pass")

    if card["world_sizes"] != sorted(card["world_sizes"]):
        problems.append("card.world_sizes: expected sorted distinct ints")
    sharding = card["sharding"]
    if sharding is not None and sharding["seen"] is not None and len(sharding["seen"]) != sharding["world_size"]:
        problems.append(
            f"card.sharding.seen: expected one entry per rank ({sharding['world_size']}), got {len(sharding['seen'])}"
        )
    return problems


def card_problems(card) -> list:
    """Every way ``card`` (a decoded JSON twin) breaks the schema, one ``"card.<path>: <what>"`` string each."""
    problems = _schema_problems(card)
    return problems or _consistency_problems(card)


def validate_card(card) -> None:
    """Check a card (the JSON twin, decoded) against ``schema.json`` and its consistency rules.

    Raises:
        ValueError: listing every problem, one per line, as ``"card.topics[0].facts[2].outcome: ..."``.
    """
    problems = card_problems(card)
    if problems:
        raise ValueError(f"semantics card does not match schema {SCHEMA}:\n" + "\n".join(problems))
