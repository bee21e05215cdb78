# ruff: noqa: E501 - a fact test's name states the fact, and the entries cite them whole
"""The registry's entry type: :class:`Hazard`, and the preconditions its fixes share (predicates over a run's
evidence dict)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

F = "tests/facts/"


def _always(evidence: dict) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class OtherFix:
    """A fix of an entry for a case its main fix's wording does not fit (the main fix says "outside the branch on
    the rank" where the evidence shows no branch on the rank), printed where the main fix's preconditions fail and
    this one's hold (:func:`ddpprobe.hazards.advice`).

    Attributes:
        fix: what to change.
        fix_fact: the fact test that shows what the fix relies on.
        requires: its preconditions in words.
        precondition: the same as a predicate over the run's evidence dict.
    """

    fix: str
    fix_fact: str
    requires: str
    precondition: Callable[[dict], bool]

    def applies(self, evidence: dict) -> bool:
        try:
            return bool(self.precondition(evidence))
        except (KeyError, TypeError):
            return False


@dataclasses.dataclass(frozen=True)
class Hazard:
    """One hazard.

    Attributes:
        name: the entry's name (what reports and JSON call it).
        summary: the hazard in a few words (the table of docs/audit.md).
        facts: the fact tests (``path::name``) that prove the cause.
        template: the cause, with ``{field}`` places for this run's numbers (:meth:`cause`).
        evidence: the recorded quantities the cause is proven from (names of an evidence dict: ``"samples
            per rank"``, ``"duplicates"``, ``"ranks"`` ...), shown where no fix applies.
        fix: what to change, or None where no fact proves a fix.
        fix_fact: the fact test that shows the fix gives the right value (or no hang).
        requires: the fix's preconditions in words (printed where they do not hold).
        precondition: the same as a predicate over the run's evidence dict.
        other_fixes: :class:`OtherFix` values for the cases the main fix's wording does not fit, in order.
    """

    name: str
    summary: str
    facts: tuple
    template: str
    evidence: tuple = ()
    fix: Optional[str] = None
    fix_fact: Optional[str] = None
    requires: str = "nothing beyond the cause"
    precondition: Callable[[dict], bool] = _always
    other_fixes: tuple = ()

    def cause(self, **numbers) -> str:
        """The cause worded with ``numbers`` (every ``{field}`` of :attr:`template`). Raises ``KeyError``
        naming a missing field."""
        return self.template.format(**numbers)

    def applies(self, evidence: dict) -> bool:
        """The fix's preconditions hold in ``evidence`` (False for an entry without a fix)."""
        if self.fix is None:
            return False
        try:
            return bool(self.precondition(evidence))
        except (KeyError, TypeError):
            return False


def _iterable(evidence: dict) -> bool:
    """The loader's sampler is one Lightning cannot shard: an ``IterableDataset``'s (torch's
    ``_InfiniteConstantSampler``), not a map-style dataset run with ``use_distributed_sampler=False``."""
    return evidence.get("sampler") in (None, "_InfiniteConstantSampler")


def _tensor_sync_dist(evidence: dict) -> bool:
    return bool(evidence.get("sync_dist")) and not evidence.get("metric_object")


def _shards_differ(evidence: dict) -> bool:
    """The ranks' shards hold different numbers of batches (recorded, or every rank ran its loop to the end)."""
    shards = evidence.get("batches per shard")
    return bool(shards) and len(set(shards)) > 1


def _list_state(evidence: dict) -> bool:
    return any("list" in str(size) for size in (evidence.get("state sizes") or {}).values())
