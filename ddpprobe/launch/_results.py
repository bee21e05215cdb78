"""What a world gives back: its ranks' results, or one error naming the ranks that failed and how.

:func:`build_result` is the one place a world's ``RankMessage`` s (ddpprobe/launch/_message.py) become
a ``WorldResult`` or a ``WorldError``, for launched and external worlds alike.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
from typing import Iterator, Optional

from ddpprobe.launch._message import RankMessage, count_world

#: Lines of a failed rank's stderr shown at the end of an error message, after its key lines.
STDERR_TAIL_LINES = 15

#: A stderr line that says what went wrong, kept in an error message however far from the end it is:
#: Python exceptions, C++ aborts (``terminate called ...`` / ``what():``), gloo's and NCCL's own errors
#: ("Connection closed by peer", "Timed out waiting ... for recv", size mismatches, enforce failures).
KEY_STDERR_LINE = re.compile(
    r"Error|Exception|what\(\)|terminate called|enforce fail|Fatal Python error|Connection (closed|reset|refused)"
    r"|[Tt]imed out|[Mm]ismatch|Aborted|Segmentation fault"
)

#: Most key stderr lines an error message keeps per rank (the first ones: the cause comes first).
MAX_KEY_LINES = 40


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What one rank produced.

    Attributes:
        rank: global rank.
        record: the scenario's return value, decoded from JSON (dicts, lists, str, float, int, ...).
        stdout: everything the rank wrote to file descriptor 1 (``print``, Lightning's tables), as text.
        stderr: everything it wrote to file descriptor 2 (warnings, logging), as text.
        files: files found under the rank's working directory after it ended, by path relative to
            it (``"lightning_logs/version_0/metrics.csv"``) -> text content (files over 1 MiB or not
            UTF-8 hold ``"<N bytes>"``).
        pid: the rank's process id (gone by the time you read it).
        exitcode: the process exit code (0 for a rank that returned a record; None in an external world).
    """

    rank: int
    record: object
    stdout: str
    stderr: str
    files: dict
    pid: int
    exitcode: Optional[int]


class WorldResult(tuple):
    """The ranks' results, ordered by rank (``result[r]`` is rank ``r``'s ``RankResult``)."""

    @property
    def records(self) -> list:
        """The scenarios' return values, ordered by rank."""
        return [r.record for r in self]

    @property
    def world_size(self) -> int:
        return len(self)

    @property
    def pids(self) -> list:
        return [r.pid for r in self]

    def __iter__(self) -> Iterator[RankResult]:
        return super().__iter__()


class WorldError(RuntimeError):
    """A world did not produce a record on every rank.

    Attributes:
        ranks: the ranks the failure is about (the ones that raised, died or did not finish).
        pids: process ids of every rank of the world, ordered by rank (all ended when this is raised).
        outputs: ``{rank: (stdout, stderr)}`` captured from every rank.
        rank_errors: ``{rank: text}`` for every rank that did not return a record, whatever the error's
            kind: ``"ValueError: <the exception's full message>"`` for a rank that raised (the backend's
            own text intact, e.g. gloo's "Connection closed by peer"), ``"ended with signal SIGABRT
            (exit code -6) without reporting a result"`` plus the key lines of its stderr for a rank
            that died, ``"did not finish"`` for a rank still running when the world was ended.
        stacks: ``{rank: text}``, the Python stack (faulthandler's format) each rank still running when
            the world was ended was in when it was asked, whatever ended it (a peer's failure or the
            timeout); empty when every rank had ended.
        records: one entry per rank, ordered by rank: the scenario's return value (decoded from JSON, as
            ``WorldResult.records``) for each rank that finished and reported it before the world was
            ended, None for a rank that gave none (it raised, died, or was still running). A rank that
            finished while a peer failed keeps what it recorded here, whatever the failure's kind.
    """

    def __init__(
        self,
        message: str,
        ranks: list,
        pids: list,
        outputs: dict,
        rank_errors: Optional[dict] = None,
        stacks: Optional[dict] = None,
        records: Optional[list] = None,
    ):
        super().__init__(message)
        self.ranks = ranks
        self.pids = pids
        self.outputs = outputs
        self.rank_errors = dict(rank_errors or {})
        self.stacks = dict(stacks or {})
        self.records = list(records) if records is not None else [None] * len(pids)


class RankFailed(WorldError):
    """A rank's scenario raised. ``exc_types[r]`` is the exception's class name on rank ``r``,
    ``tracebacks[r]`` its formatted traceback."""

    def __init__(
        self, message, ranks, pids, outputs, exc_types, tracebacks, rank_errors=None, stacks=None, records=None
    ):
        super().__init__(message, ranks, pids, outputs, rank_errors, stacks, records)
        self.exc_types = exc_types
        self.tracebacks = tracebacks


class RankDied(WorldError):
    """A rank ended without reporting (killed by a signal, ``os._exit``, a crash in C code).
    ``exitcodes[r]`` is the exit code, negative for a signal (``-9`` is SIGKILL)."""

    def __init__(self, message, ranks, pids, outputs, exitcodes, rank_errors=None, stacks=None, records=None):
        super().__init__(message, ranks, pids, outputs, rank_errors, stacks, records)
        self.exitcodes = exitcodes


class WorldTimeout(WorldError):
    """The world ran past its timeout; every rank was killed. ``stacks[r]`` is the Python stack
    rank ``r`` was in when it was asked (faulthandler's format), for each rank that had not finished."""

    def __init__(self, message, ranks, pids, outputs, stacks, rank_errors=None, records=None):
        super().__init__(message, ranks, pids, outputs, rank_errors, stacks, records)


def build_result(
    messages: list, world: str, order: Optional[list] = None, timeout: Optional[float] = None, timed_out: bool = False
) -> WorldResult:
    """Turn one ``RankMessage`` per rank into the world's result, or raise the error that explains it.

    Args:
        messages: one message per rank, any order.
        world: how to name the world in a message, e.g. ``"world of 2 rank(s) running m:f (backend=gloo)"``.
        order: ranks whose failure arrived, in the order it arrived (default: by rank); messages of
            failed ranks not in it follow by rank.
        timeout: the world's timeout in seconds, named when it ran out.
        timed_out: the world ran past its timeout (also implied by any ``stuck`` rank).

    Every error raised carries ``records``: the record of each rank whose message is ``ok``, None for the others.

    Raises (the first that applies; a death is the cause of its peers' "connection closed" errors):
        RankDied: a rank ended without reporting.
        RankFailed: a scenario raised.
        TypeError: a record JSON cannot hold (message: rank, key and type).
        WorldTimeout: ranks were still running when the world was ended.
    """
    count_world(messages)
    by_rank = {m.rank: m for m in messages}
    ranks = sorted(by_rank)
    failed = [r for r in (order or []) if by_rank[r].status not in ("ok", "stuck")]
    failed += [r for r in ranks if by_rank[r].status not in ("ok", "stuck") and r not in failed]
    stuck = [r for r in ranks if by_rank[r].status == "stuck"]
    outputs = {r: (by_rank[r].stdout, by_rank[r].stderr) for r in ranks}
    pids = [by_rank[r].pid for r in ranks]
    rank_errors = {r: _rank_error(by_rank[r]) for r in failed + stuck}
    stacks = {r: by_rank[r].stack for r in stuck}
    records = [json.loads(by_rank[r].record_json) if by_rank[r].status == "ok" else None for r in ranks]

    lines = _failure_lines([by_rank[r] for r in failed])
    if stuck:
        finished = [r for r in ranks if by_rank[r].status == "ok"]
        lines.append(f"finished: {finished or 'none'}   did not finish: {stuck}")
        lines += [f"rank {r} was still running; its Python stack:\n{_indent(by_rank[r].stack)}" for r in stuck]

    def message(what: str, about: list, with_stderr: bool = True) -> str:
        tails = [_stderr_excerpt(r, by_rank[r].stderr) for r in about if with_stderr and by_rank[r].stderr.strip()]
        return "\n".join([f"{world}: rank(s) {about} {what}", *lines, *tails])

    died = [r for r in failed if by_rank[r].status == "died"]
    raised = [r for r in failed if by_rank[r].status == "error"]
    unserialisable = [r for r in failed if by_rank[r].status == "unserialisable"]
    if died:
        raise RankDied(
            message("died", died),
            died,
            pids,
            outputs,
            exitcodes={r: by_rank[r].exitcode for r in died},
            rank_errors=rank_errors,
            stacks=stacks,
            records=records,
        )
    if raised:
        raise RankFailed(
            message("raised an exception", raised),
            raised,
            pids,
            outputs,
            exc_types={r: by_rank[r].exc_type for r in raised},
            tracebacks={r: by_rank[r].traceback for r in raised},
            rank_errors=rank_errors,
            stacks=stacks,
            records=records,
        )
    if unserialisable:
        raise TypeError(message("returned a record JSON cannot hold", unserialisable, with_stderr=False))
    if stuck or timed_out:
        after = f"timed out after {timeout:g}s" if timeout is not None else "timed out"
        raise WorldTimeout(
            message(after, stuck),
            stuck,
            pids,
            outputs,
            stacks=stacks,
            rank_errors=rank_errors,
            records=records,
        )
    return WorldResult(
        RankResult(
            rank=r,
            record=record,
            stdout=by_rank[r].stdout,
            stderr=by_rank[r].stderr,
            files=by_rank[r].files,
            pid=by_rank[r].pid,
            exitcode=by_rank[r].exitcode,
        )
        for r, record in zip(ranks, records)
    )


def _failure_line(m: RankMessage) -> str:
    if m.status == "died":
        return f"rank {m.rank} {_died(m)}"
    if m.status == "error":
        return f"rank {m.rank} raised {m.exc_type}: {m.error}\n{_indent(_without_error(m))}"
    return f"rank {m.rank}: {m.error}"


def _failure_lines(messages: list) -> list:
    """One line per failure, in order; ranks that raised the same exception with the same message (a
    guard error every rank raises) share one: ``ranks 0, 1 raised CollectiveMismatch: ...`` and the first
    one's traceback."""
    groups: dict = {}
    for m in messages:
        key = (m.exc_type, m.error) if m.status == "error" else (m.rank,)
        groups.setdefault(key, []).append(m)
    lines = []
    for group in groups.values():
        m = group[0]
        if len(group) == 1:
            lines.append(_failure_line(m))
        else:
            ranks = ", ".join(str(r) for r in sorted(g.rank for g in group))
            lines.append(f"ranks {ranks} raised {m.exc_type}: {m.error}\n{_indent(_without_error(m))}")
    return lines


def _without_error(m: RankMessage) -> str:
    """The rank's traceback without the exception line it ends with (``[module.]Type: first line``): the
    failure line above already quotes the whole message."""
    lines = (m.traceback or "").rstrip().splitlines()
    first = f"{m.exc_type}: {(m.error or '').splitlines()[0] if m.error else ''}".rstrip()
    for i in range(len(lines) - 1, -1, -1):
        prefix = lines[i][: len(lines[i]) - len(first)]
        if lines[i].endswith(first) and (prefix == "" or (prefix.endswith(".") and " " not in prefix)):
            return "\n".join(lines[:i])
    return "\n".join(lines)


def _rank_error(m: RankMessage) -> str:
    if m.status == "error":
        return f"{m.exc_type}: {m.error}"
    if m.status == "died":
        key = key_lines(m.stderr)
        return _died(m) + (f"; its stderr says:\n{key}" if key else "")
    if m.status == "stuck":
        return "did not finish"
    return m.error or m.status


def _died(m: RankMessage) -> str:
    return f"ended with {describe_exit(m.exitcode)} without reporting a result"


def key_lines(text: str) -> str:
    """The lines of ``text`` that say what went wrong (``KEY_STDERR_LINE``), at most ``MAX_KEY_LINES``."""
    return "\n".join([line for line in text.splitlines() if KEY_STDERR_LINE.search(line)][:MAX_KEY_LINES])


def _stderr_excerpt(rank: int, stderr: str) -> str:
    """A failed rank's stderr for an error message: its key lines wherever they are, then its last lines.

    A rank that aborts in C++ prints the cause (``what(): ...``) and then faulthandler's dump of every
    thread, so the last lines alone would show only stack frames."""
    tail = _tail(stderr)
    key = [line for line in key_lines(stderr).splitlines() if line not in tail.splitlines()]
    parts = []
    if key:
        parts.append(f"--- rank {rank} stderr (lines that say what went wrong) ---\n" + "\n".join(key))
    parts.append(f"--- rank {rank} stderr (last lines) ---\n{tail}")
    return "\n".join(parts)


def describe_exit(code) -> str:
    """``-9`` -> ``"signal SIGKILL (exit code -9)"``, ``3`` -> ``"exit code 3"``."""
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"signal {-code} (exit code {code})"
    return f"exit code {code}"


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in (text or "").rstrip().splitlines())


def _tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
