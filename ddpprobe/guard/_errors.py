"""The errors the guard raises: one base type and one type per way the ranks can part."""

from __future__ import annotations


class GuardError(RuntimeError):
    """The ranks of a guarded run are not making the same collective calls (``CollectiveGuard``).

    Attributes:
        check: the guard's sequence number of the check that failed (0, 1, ... per ``Trainer`` stage).
        sides: ``{rank: what the rank was doing there}`` in words, for the ranks the guard heard from.
    """

    def __init__(self, message: str, check: int, sides: dict):
        super().__init__(message)
        self.check = check
        self.sides = sides


class CollectiveMismatch(GuardError):
    """At the same check, the ranks are about to make different collectives (another op, key, metric,
    dtype or shape), or some are about to make a collective while others are at a hook boundary, or the
    ranks are at different hook boundaries (uneven numbers of batches). Raised on every rank."""


class PeerFailed(GuardError):
    """A peer raised (its own exception, named here) before reaching the check this rank is at: without
    the guard this rank would wait for it in the collective until the process-group timeout.

    Attributes:
        failed: ``{rank: "Type: message"}`` of the ranks that raised.
    """

    def __init__(self, message: str, check: int, sides: dict, failed: dict):
        super().__init__(message, check, sides)
        self.failed = failed


class GuardTimeout(GuardError):
    """A peer did not reach the check within the guard's timeout (it is in slow code, in a collective
    made from C++, or gone), named with its last known position.

    Attributes:
        missing: the ranks that did not arrive.
        last_seen: ``{rank: its last check in words}`` of the missing ranks (None before the first).
    """

    def __init__(self, message: str, check: int, sides: dict, missing: list, last_seen: dict):
        super().__init__(message, check, sides)
        self.missing = missing
        self.last_seen = last_seen
