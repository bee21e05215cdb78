"""The errors the guard raises: one base type and one type per way the ranks can part, and how a rank's
process prints one it does not catch (``excepthook``)."""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from typing import Optional

#: Set (to anything but ``0``) to print a guard error's full traceback instead of the short report.
FULL_TRACEBACK_ENV = "DDPPROBE_GUARD_TRACEBACK"


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
        #: The rank that raised it (set by the guard's exchange).
        self.rank = None

    def reporter(self) -> int:
        """The rank that prints this error in full when no one catches it: the lowest rank that raises it
        (every rank in ``sides`` but those that failed on their own)."""
        return min((r for r in self.sides if r not in getattr(self, "failed", {})), default=self.rank)


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


class StateDiverged(GuardError):
    """State the DDP contract says must be equal on every rank differs (ddpprobe/contract/: the optimizer's
    settings, the parameters after a step, a module attribute before training ...), found at a state check of
    ``CollectiveGuard(state=...)`` (ddpprobe/guard/_state.py) by the contract's own comparison
    (:func:`ddpprobe.contract.breaks`). Raised on every rank.

    Attributes:
        breaks: each differing field as :meth:`ddpprobe.contract.Break.to_dict` (``field``, ``row``, ``facts``,
            ``boundary``, ``hook``, ``step``, ``epoch``, ``per_rank``), in the contract's order.
        field: the first one's path (``"optimizer[0].group[0].lr"``).
        per_rank: its value on each rank, rank 0 first.
        boundary: where it was first seen differing (``"start"``, ``"train_epoch_end"`` ...).
    """

    def __init__(self, message: str, check: int, sides: dict, breaks: list):
        super().__init__(message, check, sides)
        self.breaks = breaks
        self.field = breaks[0]["field"]
        self.per_rank = breaks[0]["per_rank"]
        self.boundary = breaks[0]["boundary"]


class GuardTimeout(GuardError):
    """A peer did not reach the check within the guard's timeout (it is in slow code, in a collective
    the guard does not check, or gone), named with its last known position.

    Attributes:
        missing: the ranks that did not arrive.
        last_seen: ``{rank: its last check in words}`` of the missing ranks (None before the first).
    """

    def __init__(self, message: str, check: int, sides: dict, missing: list, last_seen: dict):
        super().__init__(message, check, sides)
        self.missing = missing
        self.last_seen = last_seen


def _guard_error_in(exc):
    """``exc`` or the first guard error it was raised from or while handling (``__cause__``/``__context__``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, GuardError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def report(exc: GuardError, tb) -> str:
    """What a rank prints for a guard error it did not catch: the lowest rank that raised it, the message
    and the user's frame it was raised under (the innermost of ``tb`` outside the libraries); every other rank,
    one line pointing to that rank (:func:`printed`)."""
    return printed(exc, user_frame(tb))


def user_frame(tb) -> Optional[str]:
    """``"path/to/train.py:12 in train"``: the innermost frame of the traceback ``tb`` outside the libraries (the
    user's line a rank raised under), or None."""
    frames = [f for f in traceback.extract_tb(tb) if not _library(f.filename)]
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None


def printed(exc: GuardError, under: Optional[str]) -> str:
    """:func:`report` of ``exc`` raised under the user's frame ``under`` (:func:`user_frame`): a function of the
    error alone, the words of its report."""
    name = type(exc).__name__
    if exc.rank is not None and exc.rank != exc.reporter():
        return f"rank {exc.rank}: {name} at check #{exc.check} (rank {exc.reporter()} prints the guard's message)\n"
    deeper = _deeper_line(exc)
    if deeper is not None:
        where = f"  raised under {deeper}\n"
    elif under and isinstance(exc, StateDiverged):  # no set seen: the check ran in the guard's hook, under fit
        where = f"  raised under {under}, at the guard's state check (what ran since the field was equal: above)\n"
    else:
        where = f"  raised under {under}\n" if under else ""
    return f"{name}: {exc}\n{where}(the same on {_others(exc)}; full traceback: {FULL_TRACEBACK_ENV}=1)\n"


def _users_own(entry: dict) -> bool:
    """A collective entry the user's own line made (its call chain names no loop of Lightning's)."""
    fields = entry.get("fields") or {}
    return entry.get("kind") == "collective" and bool(fields.get("call_site")) and not fields.get("loop_step")


def _deeper_line(exc: GuardError):
    """The user's line that made the difference where this rank's own frame cannot show it, else None: for a
    ``StateDiverged``, the line that last set the first differing field (ddpprobe/guard/_writers.py), since the check
    runs in the guard's hook under the user's ``trainer.fit``; for a ``CollectiveMismatch`` where this rank is at a
    hook boundary or in a collective Lightning's loop makes (so its innermost frame of the user's code is the
    ``trainer.fit`` line), the call site of the collective another rank's code made."""
    written = getattr(exc, "written", None)
    if written:
        rank, site = written
        return f"rank {rank}'s {site}, the line that last set {exc.field}"
    entries = getattr(exc, "entries", None) or []
    mine = next((e for e in entries if e.get("rank") == exc.rank), None)
    if mine is None or _users_own(mine):
        return None
    for entry in sorted(entries, key=lambda e: e.get("rank", 0)):
        if entry is not mine and _users_own(entry):
            return f"rank {entry['rank']}'s {entry['fields']['call_site']}, the collective the other ranks do not make"
    return None


def _others(exc: GuardError) -> str:
    ranks = sorted(r for r in exc.sides if r != exc.reporter() and r not in getattr(exc, "failed", {}))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)) if ranks else "no other rank"


#: The standard library's folders: a frame there (``contextlib.py`` under a ``with``) is no user's line.
_STDLIB = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib")})


def _library(filename: str) -> bool:
    """A frame of a library (an installed package, ddpprobe, the standard library) or of no file (``<frozen
    ...>``), not the user's."""
    parts = filename.replace("\\", "/").split("/")
    return (
        any(p in ("site-packages", "dist-packages", "ddpprobe") for p in parts)
        or filename.startswith("<")
        or filename.startswith(_STDLIB)
    )


def excepthook(exc_type, exc, tb, previous=None) -> None:
    """``sys.excepthook`` of a rank with a guard: a guard error nobody caught (under torchrun, SLURM: the
    rank's process ends with it) is printed as ``report`` says, first, instead of Lightning's 90-line
    traceback on every rank; any other exception goes to the previous hook (after the guard's report
    when it was raised while handling a guard error)."""
    previous = previous or sys.__excepthook__
    guard_error = _guard_error_in(exc)
    if guard_error is None or os.environ.get(FULL_TRACEBACK_ENV, "0") != "0":
        return previous(exc_type, exc, tb)
    sys.stderr.write(report(guard_error, tb if guard_error is exc else guard_error.__traceback__))
    if guard_error is not exc:
        previous(exc_type, exc, tb)


def install_excepthook() -> None:
    """Make ``excepthook`` this process's ``sys.excepthook`` (once; the previous hook kept for the rest)."""
    current = sys.excepthook
    if getattr(current, "ddpprobe_guard", False):
        return

    def hook(exc_type, exc, tb):
        excepthook(exc_type, exc, tb, previous=current)

    hook.ddpprobe_guard = True
    sys.excepthook = hook
