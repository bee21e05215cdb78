"""The one message a rank's run of a scenario produces, in launched and external worlds alike.

A launched rank sends it to the launcher through a pipe (ddpprobe/launch/_rank.py); a rank of an
external world exchanges it with its peers (``all_gather_object``, ddpprobe/launch/_external.py).
Either way one builder (ddpprobe/launch/_results.py ``build_result``) turns the world's messages into
a ``WorldResult`` or an error. Plain data only: it is pickled across processes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import resource
import traceback
from typing import Optional

#: What a rank's run came to. The first three are sent by the rank itself; the launcher records
#: ``died`` (the process ended without sending) and ``stuck`` (still running when the world ended).
STATUSES = ("ok", "error", "unserialisable", "died", "stuck")


@dataclasses.dataclass(frozen=True)
class RankMessage:
    """One rank's outcome.

    Attributes:
        rank: global rank.
        status: one of ``STATUSES``.
        pid: the rank's process id.
        record_json: the scenario's return value as JSON text (``ok``).
        exc_type: the exception's class name (``error``).
        error: the exception's full message (``error``), what JSON cannot hold (``unserialisable``).
        traceback: the formatted traceback (``error``).
        exitcode: the process exit code, negative for a signal (``died``; launched worlds fill it for all).
        stack: the Python stack the rank was in when asked, faulthandler's format (``stuck``).
        stdout, stderr: what the rank wrote to file descriptors 1 and 2.
        files: ``{path relative to the rank's folder: text}`` (ddpprobe/launch/_files.py ``snapshot``).
        cpu_s: CPU seconds (user + system, all threads) the rank spent in the scenario; a measurement for
            benchmarks/bench_suite.py, left out of :meth:`to_json_dict`.
    """

    rank: int
    status: str
    pid: Optional[int] = None
    record_json: Optional[str] = None
    exc_type: Optional[str] = None
    error: Optional[str] = None
    traceback: Optional[str] = None
    exitcode: Optional[int] = None
    stack: Optional[str] = None
    stdout: str = ""
    stderr: str = ""
    files: dict = dataclasses.field(default_factory=dict)
    cpu_s: Optional[float] = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}; use one of {', '.join(STATUSES)}")

    def to_json_dict(self) -> dict:
        """A readable dict: every field, with ``record`` (decoded) in place of ``record_json``."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("record_json", "cpu_s") and v is not None}
        if self.record_json is not None:
            out["record"] = json.loads(self.record_json)
        return out


def resolve(ref: str):
    """Import ``"package.module:qualname"`` and return the object."""
    module_name, _, qualname = ref.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def find_unserialisable(value, path: str = "record"):
    """Return ``(path, type_name)`` of the first part of ``value`` that JSON cannot hold, else None."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                return f"{path} key {key!r}", type(key).__name__
            found = find_unserialisable(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = find_unserialisable(item, f"{path}[{index}]")
            if found:
                return found
        return None
    return path, type(value).__name__


def run_scenario(scenario_ref: str, info, params: dict, pid: int, catch=Exception) -> RankMessage:
    """Run ``scenario(info, **params)`` and encode what came of it (``ok``, ``error`` or ``unserialisable``).

    ``catch`` is what counts as the scenario failing: ``Exception`` in a shared process (an external
    world's pytest session, where Ctrl-C must still stop pytest), ``BaseException`` in a rank process
    of its own (a ``sys.exit`` in a scenario is then reported like an exception).
    """
    cpu_before = _cpu_seconds()
    try:
        record = resolve(scenario_ref)(info, **params)
        try:
            return RankMessage(
                rank=info.rank, status="ok", pid=pid, record_json=json.dumps(record), cpu_s=_cpu_seconds() - cpu_before
            )
        except (TypeError, ValueError):
            where, type_name = find_unserialisable(record) or ("record", type(record).__name__)
            return RankMessage(
                rank=info.rank,
                status="unserialisable",
                pid=pid,
                error=f"{where} is a {type_name}, which JSON cannot hold; return plain lists, dicts, "
                "str, int, float, bool or None (e.g. tensor.tolist() or float(tensor))",
                cpu_s=_cpu_seconds() - cpu_before,
            )
    except catch as exc:  # noqa: BLE001 - every failure is reported
        return RankMessage(
            rank=info.rank,
            status="error",
            pid=pid,
            exc_type=type(exc).__name__,
            error=str(exc),
            traceback=traceback.format_exc(),
            cpu_s=_cpu_seconds() - cpu_before,
        )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


#: Worlds whose messages this process turned into a result or an error, and the CPU seconds their ranks
#: spent in their scenarios (:func:`count_world`, called by ``build_result``).
_USAGE = {"worlds": 0, "rank_cpu_s": 0.0}


def count_world(messages) -> None:
    """Count one world and add the scenario CPU each of its messages reports (:func:`world_usage`)."""
    _USAGE["worlds"] += 1
    _USAGE["rank_cpu_s"] += sum(m.cpu_s or 0.0 for m in messages)


def world_usage() -> dict:
    """``{"worlds": n, "rank_cpu_s": s}`` so far in this process: the worlds whose result it built (each launched
    world once, warm or fresh, failed or not) and the CPU seconds their ranks spent in their scenarios (ranks still
    running when their world was ended report none). The pytest plugin logs it per test for
    benchmarks/bench_suite.py: a rank forked from the forkserver is no child of the process that launched it, so
    ``getrusage(RUSAGE_CHILDREN)`` never counts it."""
    return dict(_USAGE)
