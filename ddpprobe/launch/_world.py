"""Launching a world: start W rank processes, wait for their records, and never leave one behind."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection
import os
import shutil
import signal
import sys
import time
from typing import Callable, Optional

from ddpprobe.launch import _activity, _external
from ddpprobe.launch._arguments import (
    check_devices,
    check_env,
    check_num_nodes,
    check_params,
    check_world_size,
    scenario_ref,
)
from ddpprobe.launch._files import read_text as _read, snapshot as _snapshot
from ddpprobe.launch._forkserver import context, hash_seed_env
from ddpprobe.launch._message import RankMessage
from ddpprobe.launch._rank import STACK_SIGNAL, paths, rank_main
from ddpprobe.launch._rendezvous import loopback_store, private_world_dir
from ddpprobe.launch._results import WorldResult, build_result
from ddpprobe.launch._settings import resolve_settings
from ddpprobe.launch._spec import LaunchSpec

#: Seconds a rank that reported its record may take to exit by itself before it is killed.
OK_EXIT_GRACE_S = 2.0

#: Seconds the launcher waits for ranks to write their stacks after it asks for them.
STACK_GRACE_S = 1.0

#: Seconds the launcher keeps listening, at most, after a rank reported an exception, for the ranks still
#: running to report too: a peer's death (a rank that dies makes its peers' collectives fail with
#: "connection closed by peer", and that secondary error can reach the launcher before the death does;
#: the death is the cause), the other ranks that lose the same partner, the records of ranks finishing.
#: It stops sooner, once every rank still running is asleep (ddpprobe/launch/_activity.py): blocked in a
#: collective whose partners are not coming. A loaded machine delays a rank's report, not this test.
FAILURE_SETTLE_S = 10.0

#: Seconds every rank still running must stay asleep, after a failure, before the launcher ends the world.
SETTLE_IDLE_S = 0.3

#: Seconds between two looks at the ranks still running while the launcher settles.
SETTLE_POLL_S = 0.05


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
    num_nodes: int = 1,
    hash_seeds: Optional[list] = None,
    **params,
) -> WorldResult:
    """Run ``scenario(rank_info, **params)`` in ``world_size`` fresh rank processes; return their records.

    Each rank is a new OS process that looks to Lightning like a rank started by an external launcher
    (``RANK``, ``LOCAL_RANK``, ``NODE_RANK``/``GROUP_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` set), so ``Trainer(strategy="ddp", devices=...,
    num_nodes=...)`` joins the world instead of spawning processes (``ddpprobe.probes.ddp_trainer``
    passes ``RankInfo.devices`` and ``RankInfo.num_nodes``). The rendezvous store is a ``TCPStore``
    hosted here on 127.0.0.1 only, on a free port chosen by the OS, so worlds run side by side
    (``pytest -n auto``) cannot collide and no other host can reach them (ddpprobe/launch/_rendezvous.py).

    Args:
        scenario: an importable top-level function ``(RankInfo, **params) -> JSON-serialisable record``.
        world_size: number of ranks, 1..64.
        num_nodes: how many "nodes" the ranks form, all on this host (default 1). Rank ``r`` is local
            rank ``r % (world_size // num_nodes)`` of node ``r // (world_size // num_nodes)``, so
            Lightning sees a multi-node world (global rank zero vs each node's local rank zero,
            ``prepare_data`` per node). Must divide ``world_size``; gloo only. Inside an external
            world, 1 or that world's own number of nodes.
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
            (a forked rank does not keep the forkserver's older copy). The variables that describe the
            world (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``GLOO_SOCKET_IFNAME`` ...:
            ``ddpprobe.launch._arguments.LAUNCHER_ENV``) cannot be replaced (``ValueError``).
        keep_cluster_env: keep ``SLURM_*``, ``TORCHELASTIC_*`` and similar variables in the ranks
            (they are removed by default, since they make Lightning pick another cluster environment).
        hash_seeds: one ``PYTHONHASHSEED`` value per rank (strings of digits): rank ``r`` starts in an interpreter
            with that string-hash secret, as processes a launcher starts each have their own (torchrun's do, unless
            the environment sets ``PYTHONHASHSEED``), so a ``set`` of strings iterates in another order on each
            rank. Forkserver ranks fork from a preloaded server per seed (ddpprobe/launch/_forkserver.py
            ``hash_seeded_context``, about 5 s of CPU once per seed per process); spawned ranks get the variable.
            Default None: every rank shares this launcher's secret (forked) or ``PYTHONHASHSEED`` (spawned).
        **params: JSON-like keyword arguments passed to the scenario.

    Returns:
        A ``WorldResult``: one ``RankResult`` per rank, ordered by rank.

    Inside a world launched by torchrun or srun (``ddpprobe.launch.external_world()`` is not None),
    no process is started: the scenario runs in this process as this rank, ``world_size`` must equal
    the external world's, and the ranks exchange records with ``all_gather_object``; see
    ddpprobe/launch/_external.py. Set ``DDPPROBE_NO_EXTERNAL_WORLD=1`` to launch worlds anyway.

    Raises:
        TypeError / ValueError / RuntimeError: bad arguments, before any process starts; a bad
            backend, timeout or start method raises ``SettingsError`` (a ``ValueError``).
        RankFailed: a scenario raised on some rank (message: rank, exception, traceback).
        RankDied: a rank ended without reporting (message: rank and exit code or signal).
        WorldTimeout: the world ran past ``timeout`` (message: unfinished ranks and their stacks).
        TypeError: a rank's record is not JSON-serialisable (message: rank, key and type).
    """
    world_size = check_world_size(world_size)
    ref = scenario_ref(scenario)
    check_params(scenario, ref, params)
    settings = resolve_settings(backend=backend, timeout=timeout, pg_timeout=pg_timeout, start_method=start_method)
    num_nodes = check_num_nodes(num_nodes, world_size, settings.backend)
    outside = _external.external_world()
    if outside is not None:
        check_devices(settings.backend, outside.local_world_size)
        if world_size != outside.world_size:
            raise ValueError(
                f"world_size={world_size} does not match the {outside.launcher} world this process runs in "
                f"(WORLD_SIZE={outside.world_size}); inside an external world every scenario runs at its size"
            )
        if num_nodes != 1 and num_nodes != outside.num_nodes:
            raise ValueError(
                f"num_nodes={num_nodes} does not match the {outside.launcher} world this process runs in "
                f"({outside.num_nodes} node(s) of {outside.local_world_size}); there the launcher lays out the nodes"
            )
        return _external.run_in_external_world(outside, ref, params, settings)
    check_devices(settings.backend, world_size)
    env = check_env(dict(env or {}))

    world_dir = private_world_dir()
    store = None
    try:
        store = loopback_store(settings.pg_timeout)
        spec = LaunchSpec(
            scenario_ref=ref,
            params=params,
            world_size=world_size,
            backend=settings.backend,
            pg_timeout=settings.pg_timeout,
            world_dir=world_dir,
            master_port=store.port,
            num_nodes=num_nodes,
            extra_env=env,
            keep_cluster_env=keep_cluster_env,
            parent_env=dict(os.environ),
        )
        seeds = _check_hash_seeds(hash_seeds, world_size)
        return _World(spec, context(settings.start_method), settings.timeout, seeds, settings.start_method).run()
    finally:
        del store
        if not os.environ.get("DDPPROBE_KEEP_WORLD_DIR"):
            shutil.rmtree(world_dir, ignore_errors=True)


class _World:
    """One launched world: its processes, their pipes, and the bookkeeping of who has finished."""

    def __init__(self, spec: LaunchSpec, ctx, timeout: float, hash_seeds=None, start_method: str = "forkserver"):
        # ``results``: rank -> RankMessage, as received (or "died" when the process ended without one).
        self.spec = spec
        self.ctx = ctx
        self.timeout = timeout
        self.processes = []
        self.results = {}
        self.conns = {}  # connection -> rank
        self.lifelines = []
        self.sentinels = {}  # process sentinel -> rank
        self.arrival = []  # ranks that failed, in the order their failure arrived
        self.timed_out = False
        self.stuck = []  # ranks still running when the world was ended
        self.hash_seeds = hash_seeds
        self.start_method = start_method

    def run(self) -> WorldResult:
        try:
            self._start()
            self._wait()
        finally:
            self._kill_all()
        return self._outcome()

    def _start(self) -> None:
        with _main_not_rerun():
            self._start_ranks()

    def _start_ranks(self) -> None:
        for rank in range(self.spec.world_size):
            ctx = self._context_of(rank)
            result_r, result_w = ctx.Pipe(duplex=False)
            life_r, life_w = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=rank_main,
                args=(self.spec, rank, result_w, life_r),
                name=f"ddpprobe-rank{rank}",
                # Not daemonic: a rank may start children of its own (DataLoader workers); the launcher
                # itself kills and reaps every rank, and a rank ends when the launcher goes away.
                daemon=False,
            )
            with hash_seed_env(self.hash_seeds[rank] if self.hash_seeds and self.start_method == "spawn" else None):
                process.start()
            result_w.close()
            life_r.close()
            self.processes.append(process)
            self.sentinels[process.sentinel] = rank
            self.conns[result_r] = rank
            self.lifelines.append(life_w)

    def _context_of(self, rank: int):
        """The context rank ``rank`` starts from: its hash seed's forkserver where ``hash_seeds`` gives one."""
        if self.hash_seeds and self.start_method == "forkserver":
            from ddpprobe.launch._forkserver import hash_seeded_context

            return hash_seeded_context(self.hash_seeds[rank])
        return self.ctx

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
        to have died, every rank still running has been asleep for ``SETTLE_IDLE_S``, or ``grace``
        seconds passed."""
        end = time.monotonic() + grace
        watch = _activity.Watch(SETTLE_IDLE_S)
        while len(self.results) < self.spec.world_size:
            if any(self.results[r].status == "died" for r in self.arrival):
                return
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            if watch.asleep([self.processes[r].pid for r in self._unfinished()]):
                return
            self._handle(multiprocessing.connection.wait(self._waitables(), timeout=min(remaining, SETTLE_POLL_S)))

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
                    self._record(rank, RankMessage(rank=rank, status="died", pid=self.processes[rank].pid))

    def _record(self, rank: int, message) -> None:
        self.results[rank] = message
        if message.status != "ok":
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
                _signal(self.processes[rank].pid, STACK_SIGNAL)
            self._await_stacks(unfinished)
            self._take_sent()
        # A rank that reported its record is leaving by itself (destroying its process group);
        # give it a moment so its exit code is its own, not our SIGKILL.
        end = time.monotonic() + OK_EXIT_GRACE_S
        for rank, process in enumerate(self.processes):
            if rank in self.results and self.results[rank].status == "ok":
                process.join(timeout=max(0.0, end - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                _signal(process.pid, signal.SIGKILL)
            # Each rank leads its own process group: this also ends children it started and left.
            _killpg(process.pid)
        for process in self.processes:
            process.join(timeout=10)
        self._take_sent()
        for conn in list(self.conns):
            conn.close()
        for life in self.lifelines:
            life.close()
        self.stuck = [r for r in unfinished if r not in self.results]

    def _take_sent(self) -> None:
        """Receive every message already sent: a rank that finished while the world was being ended
        (after a peer's failure or at the timeout) keeps its record instead of being counted unfinished."""
        for conn in list(self.conns):
            if conn.poll():
                self._receive(conn)

    def _await_stacks(self, ranks: list) -> None:
        end = time.monotonic() + STACK_GRACE_S
        files = [paths(self.spec.world_dir, r)["stack"] for r in ranks]
        while time.monotonic() < end:
            if all(os.path.exists(f) and os.path.getsize(f) > 0 for f in files):
                time.sleep(0.05)  # let the last thread's frames land
                return
            time.sleep(0.02)

    # -- reporting ------------------------------------------------------------------------------

    def _outcome(self) -> WorldResult:
        """One ``RankMessage`` per rank, completed with what the launcher knows, through ``build_result``."""
        messages = []
        for rank, process in enumerate(self.processes):
            files = paths(self.spec.world_dir, rank)
            message = self.results.get(rank) or RankMessage(
                rank=rank, status="stuck", stack=_read(files["stack"]) or "(no stack received)"
            )
            messages.append(
                dataclasses.replace(
                    message,
                    pid=process.pid,
                    exitcode=process.exitcode,
                    stdout=_read(files["stdout"]),
                    stderr=_read(files["stderr"]),
                    files=_snapshot(files["dir"]) if message.status == "ok" else {},
                )
            )
        world = (
            f"world of {self.spec.world_size} rank(s) running {self.spec.scenario_ref} (backend={self.spec.backend})"
        )
        return build_result(messages, world, order=self.arrival, timeout=self.timeout, timed_out=self.timed_out)


@contextlib.contextmanager
def _main_not_rerun():
    """While ranks start, hide where this program's ``__main__`` came from, so no rank runs it again.

    multiprocessing's forkserver and spawn children re-import the parent's main script or module as
    ``__mp_main__`` (multiprocessing/spawn.py ``get_preparation_data``: ``init_main_from_path`` /
    ``init_main_from_name``). A script that calls ``run_world`` at top level, without
    ``if __name__ == "__main__":``, would then call it again inside every rank, which dies with
    multiprocessing's "bootstrapping phase" error before its scenario runs. A rank never needs
    ``__main__``: scenarios come from importable modules (``scenario_ref`` refuses ``__main__``).
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {name: main.__dict__[name] for name in ("__spec__", "__file__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


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


def _check_hash_seeds(seeds: Optional[list], world_size: int) -> Optional[list]:
    """``seeds`` as strings, checked: one per rank, each a whole number from 1 to 4294967295 (0 turns hashing's
    randomization off, which no launcher does); None stays None.

    Raises:
        ValueError: naming the bad value and what fits.
    """
    if seeds is None:
        return None
    seeds = [str(s) for s in seeds]
    if len(seeds) != world_size or not all(s.isdigit() and 0 < int(s) <= 4294967295 for s in seeds):
        raise ValueError(
            f"hash_seeds={seeds!r}: give one PYTHONHASHSEED per rank ({world_size}), each a whole number from 1 to "
            "4294967295"
        )
    return seeds
