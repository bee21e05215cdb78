"""Launching a world: start W rank processes, wait for their records, and never leave one behind."""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
from typing import Callable, Iterator, Optional

from ddpprobe.launch import _external, _rank
from ddpprobe.launch._files import read_text as _read, snapshot as _snapshot
from ddpprobe.launch._spec import (
    BACKENDS,
    DEFAULT_TIMEOUT_S,
    MAX_WORLD_SIZE,
    PG_TIMEOUT_SHARE,
    START_METHODS,
    LaunchSpec,
    env_float,
)

#: Modules the forkserver imports once, so that forked ranks start with them loaded.
#: ``ddpprobe.probes`` imports the Lightning package chosen by ``DDPPROBE_LIGHTNING`` (ddpprobe/_lightning.py).
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torchmetrics", "ddpprobe.launch._rank", "ddpprobe.probes"]

#: Accepted range of ``timeout`` and ``pg_timeout``, in seconds.
MIN_SECONDS = 0.01
MAX_SECONDS = 7 * 24 * 3600.0

#: Seconds a rank that reported its record may take to exit by itself before it is killed.
OK_EXIT_GRACE_S = 2.0

#: Seconds the launcher waits for ranks to write their stacks after it asks for them.
STACK_GRACE_S = 1.0

#: Seconds the launcher keeps listening after a rank reported an exception, for a peer's death to
#: arrive: a rank that dies (``os._exit``, a signal) makes its peers' collectives fail with
#: "connection closed by peer", and that secondary error can reach the launcher a moment before the
#: death does. The death is the cause, so it is waited for; ranks blocked in a collective just cost this.
FAILURE_SETTLE_S = 0.5

#: Seconds the launcher waits at interpreter exit for the forkserver it started to end.
FORKSERVER_STOP_S = 5.0


# ---------------------------------------------------------------------------------------------
# Results and failures
# ---------------------------------------------------------------------------------------------


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
        exitcode: the process exit code (0 for a rank that returned a record).
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
    """

    def __init__(self, message: str, ranks: list, pids: list, outputs: dict):
        super().__init__(message)
        self.ranks = ranks
        self.pids = pids
        self.outputs = outputs


class RankFailed(WorldError):
    """A rank's scenario raised. ``exc_types[r]`` is the exception's class name on rank ``r``,
    ``tracebacks[r]`` its formatted traceback."""

    def __init__(self, message, ranks, pids, outputs, exc_types, tracebacks):
        super().__init__(message, ranks, pids, outputs)
        self.exc_types = exc_types
        self.tracebacks = tracebacks


class RankDied(WorldError):
    """A rank ended without reporting (killed by a signal, ``os._exit``, a crash in C code).
    ``exitcodes[r]`` is the exit code, negative for a signal (``-9`` is SIGKILL)."""

    def __init__(self, message, ranks, pids, outputs, exitcodes):
        super().__init__(message, ranks, pids, outputs)
        self.exitcodes = exitcodes


class WorldTimeout(WorldError):
    """The world ran past its timeout; every rank was killed. ``stacks[r]`` is the Python stack
    rank ``r`` was in when it was asked (faulthandler's format), for each rank that had not finished."""

    def __init__(self, message, ranks, pids, outputs, stacks):
        super().__init__(message, ranks, pids, outputs)
        self.stacks = stacks


# ---------------------------------------------------------------------------------------------
# Checking what the caller asked for, before any process starts
# ---------------------------------------------------------------------------------------------


def _scenario_ref(scenario: Callable) -> str:
    if not inspect.isfunction(scenario):
        kind = ("a class" if inspect.isclass(scenario) else "a bound method" if inspect.ismethod(scenario)
                else "a builtin" if inspect.isbuiltin(scenario) else f"a {type(scenario).__name__}")
        raise TypeError(
            f"scenario must be a function defined with `def` at the top level of an importable module, "
            f"got {kind}: {scenario!r}; wrap it in such a function (parameters go in run_world(**params))"
        )
    module = getattr(scenario, "__module__", None)
    qualname = getattr(scenario, "__qualname__", "")
    if module in (None, "__main__") or "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(
            f"scenario {qualname or scenario!r} (module {module!r}) is not an importable top-level "
            "function; each rank imports it by name, so define it with `def` at the top level of an "
            "importable module (lambdas, closures and functions in __main__ cannot be imported)"
        )
    ref = f"{module}:{qualname}"
    try:
        found = _rank.resolve(ref)
    except (ImportError, AttributeError) as exc:
        raise TypeError(f"scenario {ref} cannot be imported by name ({exc}); define it at module top level") from None
    if found is not scenario and getattr(found, "__wrapped__", None) is not scenario:
        raise TypeError(f"scenario {ref} resolves to a different object; define it once at module top level")
    return ref


def _check_params(scenario: Callable, ref: str, params: dict) -> None:
    try:
        inspect.signature(scenario).bind(None, **params)
    except TypeError as exc:
        raise TypeError(f"scenario {ref} does not accept these parameters {sorted(params)}: {exc}") from None
    try:
        json.dumps(params)
    except (TypeError, ValueError):
        where, type_name = _rank.find_unserialisable(params, "params") or ("params", "?")
        raise TypeError(f"{where} is a {type_name}; scenario parameters must be JSON-like") from None


def _check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__} {world_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size={world_size} is out of range; use 1 <= world_size <= {MAX_WORLD_SIZE}")
    return world_size


def cuda_device_count() -> int:
    """Number of CUDA devices torch sees (0 without CUDA). Does not initialise a CUDA context."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_backend(backend, world_size: int) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; use one of {', '.join(BACKENDS)}")
    if backend == "nccl":
        available = cuda_device_count()
        if available < world_size:
            raise RuntimeError(
                f"backend='nccl' needs one CUDA device per rank: world_size={world_size} but this "
                f"machine has {available} CUDA device(s); use backend='gloo' or a smaller world_size"
            )
    return backend


def _check_seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    if not MIN_SECONDS <= value <= MAX_SECONDS:  # also rejects nan
        raise ValueError(f"{name}={value!r} must be a number of seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g}")
    return float(value)


def _check_env(env: dict) -> dict:
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {key!r}: {value!r}")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(
                f"env entry {key!r}: {value!r} is not a valid environment variable "
                "(a name must be non-empty without '=' or NUL, a value without NUL)"
            )
    return env


def _check_start_method(start_method, backend: str) -> str:
    if start_method is None:
        start_method = os.environ.get("DDPPROBE_START_METHOD") or ("spawn" if backend == "nccl" else "forkserver")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r} is not supported; use one of {', '.join(START_METHODS)}")
    return start_method


# ---------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------


def _context(start_method: str):
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        _stop_forkserver_at_exit()
    return ctx


_stop_registered_in_pid = None


def _stop_forkserver_at_exit() -> None:
    """Register (once per process) an exit handler that ends this process's forkserver and waits for it.

    The forkserver ends by itself when the process that started it exits (it reads EOF on a pipe),
    but a moment later, so a check for leftover processes right after ``pytest`` returns could still
    see it. Ending it explicitly and reaping it makes "no process outlives the suite" hold at once.
    """
    global _stop_registered_in_pid
    if _stop_registered_in_pid == os.getpid():
        return
    _stop_registered_in_pid = os.getpid()
    atexit.register(_stop_forkserver)


def _stop_forkserver() -> None:
    from multiprocessing import forkserver

    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if pid is None or alive_fd is None or _stop_registered_in_pid != os.getpid():
        return
    # Closing the "alive" pipe is how multiprocessing asks its forkserver to stop
    # (multiprocessing/forkserver.py ForkServer._stop_unlocked); wait boundedly, then kill.
    try:
        os.close(alive_fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None
    end = time.monotonic() + FORKSERVER_STOP_S
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            break
        if done or time.monotonic() > end:
            if not done:
                _signal(pid, signal.SIGKILL)
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            break
        time.sleep(0.01)
    server._forkserver_pid = None


def run_world(
    scenario: Callable,
    world_size: int = 2,
    *,
    backend: str = "gloo",
    timeout: Optional[float] = None,
    pg_timeout: Optional[float] = None,
    start_method: Optional[str] = None,
    env: Optional[dict] = None,
    keep_cluster_env: bool = False,
    **params,
) -> WorldResult:
    """Run ``scenario(rank_info, **params)`` in ``world_size`` fresh rank processes; return their records.

    Each rank is a new OS process that looks to Lightning like a rank started by an external launcher
    (``LOCAL_RANK``, ``NODE_RANK=0``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` set),
    so ``Trainer(strategy="ddp", devices=world_size)`` joins the world instead of spawning processes.
    The rendezvous store is a ``TCPStore`` hosted here on a free port chosen by the OS, so worlds run
    side by side (``pytest -n auto``) cannot collide.

    Args:
        scenario: an importable top-level function ``(RankInfo, **params) -> JSON-serialisable record``.
        world_size: number of ranks, 1..64.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one CUDA device per rank).
        timeout: seconds the whole world may run; then each unfinished rank's Python stack is
            captured and every rank is killed. Default ``DDPPROBE_TIMEOUT`` or 120.
        pg_timeout: seconds a collective may block before the process group raises in the rank;
            must be below ``timeout``. Default ``DDPPROBE_PG_TIMEOUT`` or half of ``timeout``.
        start_method: ``"forkserver"`` (ranks forked from a server with torch and Lightning imported;
            default for gloo) or ``"spawn"`` (fresh interpreters; always used by default for nccl, so
            no process that touched CUDA is ever forked). Default ``DDPPROBE_START_METHOD``.
        env: extra environment variables for every rank, set after the launcher's own. Each rank
            starts from this process's ``os.environ`` as it is at the call, with either start method
            (a forked rank does not keep the forkserver's older copy).
        keep_cluster_env: keep ``SLURM_*``, ``TORCHELASTIC_*`` and similar variables in the ranks
            (they are removed by default, since they make Lightning pick another cluster environment).
        **params: JSON-like keyword arguments passed to the scenario.

    Returns:
        A ``WorldResult``: one ``RankResult`` per rank, ordered by rank.

    Inside a world launched by torchrun or srun (``ddpprobe.launch.external_world()`` is not None),
    no process is started: the scenario runs in this process as this rank, ``world_size`` must equal
    the external world's, and the ranks exchange records with ``all_gather_object``; see
    ddpprobe/launch/_external.py. Set ``DDPPROBE_NO_EXTERNAL_WORLD=1`` to launch worlds anyway.

    Raises:
        TypeError / ValueError / RuntimeError: bad arguments, before any process starts.
        RankFailed: a scenario raised on some rank (message: rank, exception, traceback).
        RankDied: a rank ended without reporting (message: rank and exit code or signal).
        WorldTimeout: the world ran past ``timeout`` (message: unfinished ranks and their stacks).
        TypeError: a rank's record is not JSON-serialisable (message: rank, key and type).
    """
    world_size = _check_world_size(world_size)
    ref = _scenario_ref(scenario)
    _check_params(scenario, ref, params)
    timeout = _check_seconds("timeout", timeout) if timeout is not None else env_float("DDPPROBE_TIMEOUT", DEFAULT_TIMEOUT_S)
    if pg_timeout is None:
        pg_timeout = env_float("DDPPROBE_PG_TIMEOUT", timeout * PG_TIMEOUT_SHARE)
    pg_timeout = _check_seconds("pg_timeout", pg_timeout)
    if pg_timeout >= timeout:
        raise ValueError(
            f"pg_timeout={pg_timeout:g}s must be shorter than timeout={timeout:g}s, so a stuck collective "
            "is reported by the process group before the world is killed; lower pg_timeout or raise timeout"
        )
    outside = _external.external_world()
    if outside is not None:
        _check_backend(backend, outside.local_world_size)
        if world_size != outside.world_size:
            raise ValueError(
                f"world_size={world_size} does not match the {outside.launcher} world this process runs in "
                f"(WORLD_SIZE={outside.world_size}); inside an external world every scenario runs at its size"
            )
        messages = _external.run_in_external_world(outside, ref, params, backend, timeout, pg_timeout)
        return _external_result(messages, ref, backend)
    backend = _check_backend(backend, world_size)
    start_method = _check_start_method(start_method, backend)
    env = _check_env(dict(env or {}))

    from torch.distributed import TCPStore

    world_dir = tempfile.mkdtemp(prefix="ddpprobe-world-")
    store = None
    try:
        store = TCPStore("127.0.0.1", 0, None, True, timeout=_timedelta(pg_timeout), wait_for_workers=False)
        spec = LaunchSpec(
            scenario_ref=ref,
            params=params,
            world_size=world_size,
            backend=backend,
            pg_timeout=pg_timeout,
            world_dir=world_dir,
            master_port=store.port,
            extra_env=env,
            keep_cluster_env=keep_cluster_env,
            parent_env=dict(os.environ),
        )
        return _World(spec, _context(start_method), timeout).run()
    finally:
        del store
        if not os.environ.get("DDPPROBE_KEEP_WORLD_DIR"):
            shutil.rmtree(world_dir, ignore_errors=True)


def _external_result(messages: list, ref: str, backend: str) -> WorldResult:
    """Turn the ranks' exchanged messages (``_external.run_in_external_world``) into a result or error."""
    outputs = {m["rank"]: (m["stdout"], m["stderr"]) for m in messages}
    pids = [m["pid"] for m in messages]
    head = f"external world of {len(messages)} rank(s) running {ref} (backend={backend}): rank(s) "
    raised = [m for m in messages if m["status"] == "error"]
    if raised:
        ranks = [m["rank"] for m in raised]
        lines = [f"rank {m['rank']} raised {m['error'][0]}: {m['error'][1]}\n{_indent(m['error'][2])}" for m in raised]
        raise RankFailed("\n".join([head + f"{ranks} raised an exception", *lines]), ranks, pids, outputs,
                         exc_types={m["rank"]: m["error"][0] for m in raised},
                         tracebacks={m["rank"]: m["error"][2] for m in raised})
    bad = [m for m in messages if m["status"] == "unserialisable"]
    if bad:
        raise TypeError("\n".join([head + f"{[m['rank'] for m in bad]} returned a record JSON cannot hold",
                                   *[f"rank {m['rank']}: {m['error']}" for m in bad]]))
    return WorldResult(
        RankResult(rank=m["rank"], record=json.loads(m["record_json"]), stdout=m["stdout"], stderr=m["stderr"],
                   files=m["files"], pid=m["pid"], exitcode=None)
        for m in sorted(messages, key=lambda m: m["rank"])
    )


def _timedelta(seconds: float):
    import datetime

    return datetime.timedelta(seconds=seconds)


class _World:
    """One launched world: its processes, their pipes, and the bookkeeping of who has finished."""

    def __init__(self, spec: LaunchSpec, ctx, timeout: float):
        self.spec = spec
        self.ctx = ctx
        self.timeout = timeout
        self.processes = []
        self.results = {}  # rank -> received message
        self.conns = {}  # connection -> rank
        self.lifelines = []
        self.sentinels = {}  # process sentinel -> rank
        self.arrival = []  # ranks that failed, in the order their failure arrived
        self.timed_out = False
        self.stuck = []  # ranks still running when the world was ended

    def run(self) -> WorldResult:
        try:
            self._start()
            self._wait()
        finally:
            self._kill_all()
        return self._outcome()

    def _start(self) -> None:
        for rank in range(self.spec.world_size):
            result_r, result_w = self.ctx.Pipe(duplex=False)
            life_r, life_w = self.ctx.Pipe(duplex=False)
            process = self.ctx.Process(
                target=_rank.rank_main,
                args=(self.spec, rank, result_w, life_r),
                name=f"ddpprobe-rank{rank}",
                # Not daemonic: a rank may start children of its own (DataLoader workers); the launcher
                # itself kills and reaps every rank, and a rank ends when the launcher goes away.
                daemon=False,
            )
            process.start()
            result_w.close()
            life_r.close()
            self.processes.append(process)
            self.sentinels[process.sentinel] = rank
            self.conns[result_r] = rank
            self.lifelines.append(life_w)

    def _wait(self) -> None:
        """Wait until every rank reported, one failed, or the deadline passed."""
        deadline = time.monotonic() + self.timeout
        while len(self.results) < self.spec.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                return
            self._handle(multiprocessing.connection.wait(self._waitables(), timeout=remaining))
            if self.arrival:
                # A rank failed: the others are most likely blocked in a collective with it. Take what
                # arrives in a short grace (a peer's death, the likely cause, may be a moment behind),
                # then stop waiting; _kill_all records the stacks of those still running.
                self._settle(min(FAILURE_SETTLE_S, max(0.0, deadline - time.monotonic())))
                return

    def _settle(self, grace: float) -> None:
        """After a failure: keep handling reports until every rank is accounted for, one rank is known
        to have died, or ``grace`` seconds passed."""
        end = time.monotonic() + grace
        while len(self.results) < self.spec.world_size:
            if any(self.results[r][0] == "died" for r in self.arrival):
                return
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._handle(multiprocessing.connection.wait(self._waitables(), timeout=remaining))

    def _waitables(self) -> list:
        return list(self.conns) + [s for s, r in self.sentinels.items() if r not in self.results]

    def _handle(self, ready_list) -> None:
        for ready in ready_list:
            if ready in self.conns:
                self._receive(ready)
            elif ready in self.sentinels:
                rank = self.sentinels[ready]
                self._drain(rank)
                if rank not in self.results:
                    self.processes[rank].join()
                    self._record(rank, ("died", self.processes[rank].exitcode))

    def _record(self, rank: int, message) -> None:
        self.results[rank] = message
        if message[0] != "ok":
            self.arrival.append(rank)

    def _receive(self, conn) -> None:
        rank = self.conns.pop(conn)
        try:
            self._record(rank, conn.recv())
        except (EOFError, OSError):
            pass  # the rank died before reporting; its sentinel tells how
        conn.close()

    def _drain(self, rank: int) -> None:
        """A rank's process ended: take its message if it sent one before exiting."""
        for conn, conn_rank in list(self.conns.items()):
            if conn_rank == rank and conn.poll():
                self._receive(conn)

    def _unfinished(self) -> list:
        return [r for r in range(self.spec.world_size) if r not in self.results]

    def _kill_all(self) -> None:
        """Ask unfinished ranks for their stacks (if any), then kill and reap every rank."""
        # Only started processes: if starting rank r raised, ranks r.. have no process and the
        # original error must propagate, not an IndexError from here.
        unfinished = [r for r in self._unfinished() if r < len(self.processes) and self.processes[r].is_alive()]
        if unfinished:
            for rank in unfinished:
                _signal(self.processes[rank].pid, _rank.STACK_SIGNAL)
            self._await_stacks(unfinished)
        # A rank that reported its record is leaving by itself (destroying its process group);
        # give it a moment so its exit code is its own, not our SIGKILL.
        end = time.monotonic() + OK_EXIT_GRACE_S
        for rank, process in enumerate(self.processes):
            if self.results.get(rank, ("",))[0] == "ok":
                process.join(timeout=max(0.0, end - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                _signal(process.pid, signal.SIGKILL)
            # Each rank leads its own process group: this also ends children it started and left.
            _killpg(process.pid)
        for process in self.processes:
            process.join(timeout=10)
        for conn in list(self.conns):
            conn.close()
        for life in self.lifelines:
            life.close()
        self.stuck = unfinished

    def _await_stacks(self, ranks: list) -> None:
        end = time.monotonic() + STACK_GRACE_S
        files = [_rank.paths(self.spec.world_dir, r)["stack"] for r in ranks]
        while time.monotonic() < end:
            if all(os.path.exists(f) and os.path.getsize(f) > 0 for f in files):
                time.sleep(0.05)  # let the last thread's frames land
                return
            time.sleep(0.02)

    # -- reporting ------------------------------------------------------------------------------

    def _outcome(self) -> WorldResult:
        n = self.spec.world_size
        outputs = {r: (_read(self._path(r, "stdout")), _read(self._path(r, "stderr"))) for r in range(n)}
        pids = [p.pid for p in self.processes]
        stacks = {r: _read(self._path(r, "stack")) or "(no stack received)" for r in self.stuck}
        kinds = {r: self.results[r][0] for r in self.arrival}
        died = [r for r in self.arrival if kinds[r] == "died"]
        raised = [r for r in self.arrival if kinds[r] == "error"]
        unserialisable = [r for r in self.arrival if kinds[r] == "unserialisable"]

        lines = []
        for r in self.arrival:
            message = self.results[r]
            if message[0] == "died":
                lines.append(f"rank {r} ended with {_describe_exit(message[1])} without reporting a result")
            elif message[0] == "error":
                lines.append(f"rank {r} raised {message[1]}: {message[2]}\n{_indent(message[3])}")
            else:
                lines.append(f"rank {r}: {message[1]}")
        finished = [r for r in range(n) if self.results.get(r, ("",))[0] == "ok"]
        if self.stuck:
            lines.append(f"finished: {finished or 'none'}   did not finish: {self.stuck}")
            lines += [f"rank {r} was still running; its Python stack:\n{_indent(stacks[r])}" for r in self.stuck]

        # A rank that died takes its peers' collectives down with it ("connection reset"), so a death
        # is reported as the cause even when a peer's error arrived first.
        if died:
            raise RankDied(self._message("died", died, lines, outputs), died, pids, outputs,
                           exitcodes={r: self.results[r][1] for r in died})
        if raised:
            raise RankFailed(
                self._message("raised an exception", raised, lines, outputs), raised, pids, outputs,
                exc_types={r: self.results[r][1] for r in raised},
                tracebacks={r: self.results[r][3] for r in raised},
            )
        if unserialisable:
            raise TypeError(self._message("returned a record JSON cannot hold", unserialisable, lines, {}))
        if self.stuck or self.timed_out:
            stuck = self.stuck or self._unfinished()
            raise WorldTimeout(self._message(f"timed out after {self.timeout:g}s", stuck, lines, outputs),
                               stuck, pids, outputs, stacks)
        return WorldResult(
            RankResult(
                rank=r,
                record=json.loads(self.results[r][1]),
                stdout=outputs[r][0],
                stderr=outputs[r][1],
                files=_snapshot(self._path(r, "dir")),
                pid=self.processes[r].pid,
                exitcode=self.processes[r].exitcode,
            )
            for r in range(n)
        )

    def _path(self, rank: int, kind: str) -> str:
        return _rank.paths(self.spec.world_dir, rank)[kind]

    def _message(self, what: str, ranks: list, lines: list, outputs: dict) -> str:
        head = (
            f"world of {self.spec.world_size} rank(s) running {self.spec.scenario_ref} "
            f"(backend={self.spec.backend}): rank(s) {ranks} {what}"
        )
        tails = []
        for r in ranks:
            if r in outputs and outputs[r][1].strip():
                tails.append(f"--- rank {r} stderr (last lines) ---\n{_tail(outputs[r][1])}")
        return "\n".join([head, *lines, *tails])


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_exit(code) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"signal {-code} (exit code {code})"
    return f"exit code {code}"


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
