"""Worlds shared within one pytest session: a world that completed is not started again for the same key.

Used by the ``run_world`` fixture (ddpprobe/plugin/pytest_plugin.py). A *key* names everything a world's records
depend on: the scenario (``module:qualname``), the world size, every keyword of ``run_world``
(scenario parameters, backend, timeouts, start method, ``env``, ``num_nodes``, ...; those left out at
their defaults, :func:`with_defaults`, so ``lr=0.05`` given and left out are one key) with their types
(``1``, ``1.0``, ``True``, a list and a tuple are different keys), and the launcher's environment
(``os.environ`` but ``IGNORED_ENVIRONMENT``), since each rank starts from it. Two calls with one key
would start the same world; the second gets the first one's result.

The store is a folder shared by every process of the session (all pytest-xdist workers of one run), one
file per completed world, written whole and then renamed into place. A world is started by the first
process that asks for its key while the others asking meanwhile wait for it (``fcntl.flock`` on the key's
lock file, released by the kernel if that process dies). Only a world that returned a ``WorldResult`` is
stored: one that raised (``RankFailed``, ``WorldTimeout``, ...) is not, so every test that expects a failure
starts its own world. Each call gets its own copy (read from the file), so a test that changes a record
cannot change what another test reads.

With ``DDPPROBE_WORLD_LOG=<folder>`` every process of the session appends to ``<folder>/<pid>.jsonl`` one
line per ``run_world`` call (:func:`log_call`), one per test (:func:`log_test`) and one for itself at the end
(:func:`log_process`); benchmarks/bench_suite.py counts worlds, distinct keys, CPU per process and the wall,
CPU and waiting of each test from them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import pickle
import resource
import sys
import tempfile
import time
from typing import Callable, Mapping, Optional

#: The environment variable naming the folder of the session's log of worlds (unset: no log).
LOG_ENV = "DDPPROBE_WORLD_LOG"

#: Environment variables that change no world: pytest's name of the current test (new at every test), the
#: folder of the log, and pytest-xdist's names of the worker (set in each worker's ``os.environ``; were they part
#: of the key, a world would be shared only among the tests of one worker).
IGNORED_ENVIRONMENT = ("PYTEST_CURRENT_TEST", LOG_ENV, "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")


def _typed(value):
    """``value`` as JSON in which every scalar and container carries its type: ``1`` and ``1.0``,
    ``True`` and ``1``, ``[1]`` and ``(1,)`` give different text (Python's ``==`` would merge them)."""
    if isinstance(value, dict):
        return ["dict", [[_typed(k), _typed(v)] for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_typed(v) for v in value]]
    if value is None or isinstance(value, (str, int, float, bool)):
        return [type(value).__name__, value]
    return [type(value).__name__, repr(value)]


def with_defaults(function: Callable, kwargs: Mapping, skip: tuple = ()) -> dict:
    """``kwargs`` completed with ``function``'s default for every parameter it has one for and ``kwargs`` does
    not give (but those named in ``skip``), so a call that gives a default and one that leaves it out have
    one key: ``with_defaults(fit, {"n": 8})`` is ``{"n": 8, "lr": 0.05}`` for ``def fit(info, n, lr=0.05)``.
    A function whose signature cannot be read leaves ``kwargs`` as they are."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return dict(kwargs)
    filled = dict(kwargs)
    for name, parameter in parameters.items():
        if name in skip or name in filled or parameter.default is inspect.Parameter.empty:
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        filled[name] = parameter.default
    return filled


def world_key(ref: str, world_size, kwargs: Mapping, environ: Optional[Mapping[str, str]] = None) -> str:
    """A hex digest naming one world: scenario ``ref``, ``world_size``, every ``run_world`` keyword
    (``kwargs``, types included) and the launcher's environment (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    launcher_env = sorted((k, v) for k, v in env.items() if k not in IGNORED_ENVIRONMENT)
    text = json.dumps([ref, _typed(world_size), _typed(dict(kwargs)), launcher_env], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class SharedWorlds:
    """The completed worlds of one session, in ``folder`` (created if missing, mode ``0o700``).

    ``started`` and ``reused`` count this process's calls of :meth:`run`: worlds it started, and
    results it took from the store instead.
    """

    def __init__(self, folder: str):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.folder = folder
        self.started = 0
        self.reused = 0

    def _path(self, key: str, suffix: str) -> str:
        return os.path.join(self.folder, key + suffix)

    def run(self, key: str, start: Callable, reuse: bool = True):
        """``start()``'s result for ``key``: a stored copy when a world of that key completed in this
        session (and ``reuse``), else a new world's (stored when it returned; an exception propagates and
        nothing is stored).

        Returns ``(result, reused)``.
        """
        with self._locked(key) if reuse else contextlib.nullcontext():
            stored = self._load(key) if reuse else None
            if stored is not None:
                self.reused += 1
                return stored, True
            self.started += 1
            result = start()
            self._store(key, result)
            return result, False

    @contextlib.contextmanager
    def _locked(self, key: str):
        fd = os.open(self._path(key, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _load(self, key: str):
        try:
            with open(self._path(key, ".pickle"), "rb") as fh:
                return pickle.load(fh)
        except FileNotFoundError:
            return None

    def _store(self, key: str, result) -> None:
        fd, partial = tempfile.mkstemp(dir=self.folder, prefix=key, suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(result, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, self._path(key, ".pickle"))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise


def _append(line: dict) -> None:
    folder = os.environ.get(LOG_ENV)
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")


def log_call(
    test: str,
    ref: str,
    world_size,
    key: str,
    seconds: float,
    reused: bool,
    ok: bool,
    warm: bool = False,
    fell_back: bool = False,
) -> None:
    """One ``run_world`` call, when ``DDPPROBE_WORLD_LOG`` is set: the test, the scenario, its world size
    and key, the seconds it took, whether the result was a stored one, whether it returned, whether a
    warm world ran it (ddpprobe/plugin/_warm.py) and whether a warm world failed it first (``fell_back``: the
    call then ran fresh)."""
    _append(
        {
            "test": test,
            "scenario": ref,
            "world_size": world_size,
            "key": key,
            "seconds": round(seconds, 4),
            "reused": reused,
            "ok": ok,
            "warm": warm,
            "fell_back": fell_back,
        }
    )


def logging() -> bool:
    """Whether ``DDPPROBE_WORLD_LOG`` is set (the session's processes log what they do)."""
    return bool(os.environ.get(LOG_ENV))


def cpu_seconds() -> float:
    """This process's CPU seconds and those of its children it waited for (user + system)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def log_test(test: str, wall_s: float, cpu_s: float, rank_cpu_s: float, worlds: int) -> None:
    """One test (setup, call and teardown), when ``DDPPROBE_WORLD_LOG`` is set: its wall seconds, the CPU
    seconds of this process and of the children it waited for meanwhile (a command-line run, a spawned
    interpreter), the worlds it launched (through the fixture, the audit, the guard's runs, ...) and the CPU
    their ranks spent in their scenarios (``ddpprobe.launch.world_usage``; the ranks are the forkserver's
    children, not this process's)."""
    _append(
        {
            "run": test,
            "wall_s": round(wall_s, 4),
            "cpu_s": round(cpu_s, 4),
            "rank_cpu_s": round(rank_cpu_s, 4),
            "worlds": worlds,
        }
    )


def log_process(role: str) -> None:
    """This process at its session's end, when ``DDPPROBE_WORLD_LOG`` is set: its role (``controller``, an
    xdist worker's id, ``main``), its own CPU seconds (user + system, children not included) and whether it
    imported torch."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _append({"process": role, "cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "torch": "torch" in sys.modules})


@contextlib.contextmanager
def timed(nodeid: str):
    """Around one test, with ``DDPPROBE_WORLD_LOG`` set: log its wall time, the CPU of this process and its
    children, the worlds it launched and their ranks' CPU (:func:`log_test`), for benchmarks/bench_suite.py."""
    if not logging():
        yield
        return
    from ddpprobe.launch import world_usage

    wall, cpu, usage = time.monotonic(), cpu_seconds(), world_usage()
    yield
    after = world_usage()
    log_test(
        nodeid,
        time.monotonic() - wall,
        cpu_seconds() - cpu,
        after["rank_cpu_s"] - usage["rank_cpu_s"],
        after["worlds"] - usage["worlds"],
    )
