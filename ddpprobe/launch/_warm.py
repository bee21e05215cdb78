"""A warm world: W rank processes that stay up and run one scenario after another, each as a fresh world would.

``WarmWorld(world_size, ...)`` forks its ranks (ddpprobe/launch/_warm_rank.py) at its first scenario;
``run(ref, params, settings, extra_env)`` gives every rank the scenario with a new world folder and a new
loopback rendezvous store (each scenario makes its own process group, as in a fresh world) and returns the
``WorldResult`` a fresh world returns: the same ``build_result``, the same world name, each rank's stdout,
stderr and files of this scenario only, exit code 0 for every rank that returned its record.

It never reports a failure: if any rank raises, dies, returns what JSON cannot hold, does not finish within
the world timeout, or cannot start its next scenario clean, the world is ended (every rank killed and
reaped, with the children each leads) and ``run`` returns None. The caller then runs the call in a fresh
world (``run_world``), whose outcome, result or error, is the one reported. Used by the pytest plugin's
pool of warm worlds (ddpprobe/plugin/_warm.py); gloo only (a rank that touched CUDA is never reused).
"""

from __future__ import annotations

import dataclasses
import multiprocessing.connection
import os
import shutil
import signal
import time
from typing import Callable, Optional

from ddpprobe.launch import _external
from ddpprobe.launch._arguments import (
    check_devices,
    check_env,
    check_num_nodes,
    check_params,
    check_world_size,
    scenario_ref,
)
from ddpprobe.launch._files import read_text, snapshot
from ddpprobe.launch._forkserver import context
from ddpprobe.launch._rank import paths
from ddpprobe.launch._rendezvous import loopback_store, private_world_dir
from ddpprobe.launch._results import WorldResult, build_result
from ddpprobe.launch._settings import Settings, resolve_settings
from ddpprobe.launch._spec import LaunchSpec
from ddpprobe.launch._warm_rank import warm_rank_main
from ddpprobe.launch._world import _main_not_rerun

#: Seconds ``close`` waits for each rank to be reaped after killing it.
REAP_S = 10.0

#: Environment variables that make a rank keep per-process state no reset can clear: torch's Flight Recorder
#: keeps one buffer per process across process groups (no reset in torch 2.13), so its entries would carry
#: earlier scenarios' collectives. A world with one of them set runs fresh.
PROCESS_STATE_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


@dataclasses.dataclass(frozen=True)
class WarmCall:
    """One ``run_world`` call, checked as ``run_world`` checks it, as a warm world runs it.

    ``world`` is what a warm world is made for (world size, nodes, backend, start method, cluster variables);
    the rest changes from scenario to scenario."""

    ref: str
    params: dict
    settings: Settings
    env: dict
    world: tuple  # (world_size, num_nodes, backend, start_method, keep_cluster_env)


def warm_call(
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
    **params,
) -> Optional[WarmCall]:
    """``run_world``'s arguments as a ``WarmCall``, or None where only a fresh world will do: inside an
    external world, with nccl (a rank that touched CUDA is never reused), or with ``PROCESS_STATE_ENV`` set.

    Raises what ``run_world`` raises for the same bad arguments (the same checks, ddpprobe/launch/_arguments.py).
    """
    world_size = check_world_size(world_size)
    ref = scenario_ref(scenario)
    check_params(scenario, ref, params)
    settings = resolve_settings(backend=backend, timeout=timeout, pg_timeout=pg_timeout, start_method=start_method)
    num_nodes = check_num_nodes(num_nodes, world_size, settings.backend)
    if _external.external_world() is not None or settings.backend != "gloo":
        return None
    check_devices(settings.backend, world_size)
    env = check_env(dict(env or {}))
    if any(name in env or name in os.environ for name in PROCESS_STATE_ENV):
        return None
    return WarmCall(
        ref,
        params,
        settings,
        env,
        (world_size, num_nodes, settings.backend, settings.start_method, bool(keep_cluster_env)),
    )


class WarmWorld:
    """The ranks of one warm world: ``world_size`` processes of ``start_method`` (forkserver or spawn) that
    joined nothing yet; each scenario run on them makes and destroys its own process group.

    Args:
        world_size, num_nodes, backend, keep_cluster_env: as ``run_world``'s, fixed for the world's life.
        start_method: how the ranks start (``forkserver``: forked from the preloaded server).
    """

    def __init__(self, world_size: int, num_nodes: int, backend: str, start_method: str, keep_cluster_env: bool):
        self.world_size = world_size
        self.num_nodes = num_nodes
        self.backend = backend
        self.start_method = start_method
        self.keep_cluster_env = keep_cluster_env
        self.processes = []
        self.conns = []
        self.lifelines = []
        self.scenarios = 0  # scenarios this world completed
        self.ended = False

    @property
    def world(self) -> tuple:
        return (self.world_size, self.num_nodes, self.backend, self.start_method, self.keep_cluster_env)

    @property
    def pids(self) -> list:
        return [p.pid for p in self.processes]

    def run(self, call: WarmCall) -> Optional[WorldResult]:
        """Run ``call`` on every rank as ``run_world`` would; the ``WorldResult``, or None (the world is then
        ended) when the scenario did not complete cleanly on every rank within the call's world timeout.
        ``call.world`` must be this world's (``ValueError``)."""
        if call.world != self.world:
            raise ValueError(f"a call for the world {call.world} given to the warm world {self.world}")
        ref, params, settings, extra_env = call.ref, call.params, call.settings, call.env
        if self.ended:
            return None
        world_dir = private_world_dir()
        store = None
        try:
            if not self.processes:
                self._start()
            store = loopback_store(settings.pg_timeout)
            spec = LaunchSpec(
                scenario_ref=ref,
                params=params,
                world_size=self.world_size,
                backend=self.backend,
                pg_timeout=settings.pg_timeout,
                world_dir=world_dir,
                master_port=store.port,
                num_nodes=self.num_nodes,
                extra_env=extra_env,
                keep_cluster_env=self.keep_cluster_env,
                parent_env=dict(os.environ),
            )
            for conn in self.conns:
                conn.send(spec)
            replies = self._wait(settings.timeout)
            if replies is None or not all(m.status == "ok" for m, _ in replies):
                self.close()
                return None
            if not all(clean for _, clean in replies):
                self.close()  # this scenario completed; the next one would not start clean
            self.scenarios += 1
            return self._result(spec, [m for m, _ in replies])
        except BaseException:
            self.close()
            raise
        finally:
            del store
            if not os.environ.get("DDPPROBE_KEEP_WORLD_DIR"):
                shutil.rmtree(world_dir, ignore_errors=True)

    def close(self) -> None:
        """End the world: tell every rank to leave, kill each with the process group it leads, reap it."""
        self.ended = True
        for conn in self.conns:
            try:
                conn.close()
            except OSError:
                pass
        for process in self.processes:
            for kill in (os.kill, os.killpg):
                try:
                    kill(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for process in self.processes:
            process.join(timeout=REAP_S)
        for life in self.lifelines:
            life.close()
        self.conns, self.lifelines = [], []

    def _start(self) -> None:
        ctx = context(self.start_method)
        with _main_not_rerun():
            for rank in range(self.world_size):
                parent_end, rank_end = ctx.Pipe(duplex=True)
                life_r, life_w = ctx.Pipe(duplex=False)
                process = ctx.Process(
                    target=warm_rank_main, args=(rank, rank_end, life_r), name=f"ddpprobe-warm-rank{rank}", daemon=False
                )
                process.start()
                rank_end.close()
                life_r.close()
                self.processes.append(process)
                self.conns.append(parent_end)
                self.lifelines.append(life_w)

    def _wait(self, timeout: float) -> Optional[list]:
        """Every rank's ``(RankMessage, clean)`` in rank order; None as soon as one fails, dies or the
        world timeout passes."""
        deadline = time.monotonic() + timeout
        replies = {}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while len(replies) < self.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            waiting = [c for r, c in enumerate(self.conns) if r not in replies]
            for ready in multiprocessing.connection.wait(waiting + list(sentinels), timeout=remaining):
                if ready in sentinels:
                    return None  # a rank ended: dead, whatever it sent
                rank = self.conns.index(ready)
                try:
                    replies[rank] = ready.recv()
                except (EOFError, OSError):
                    return None
                if replies[rank][0].status != "ok":
                    return None
        return [replies[r] for r in range(self.world_size)]

    def _result(self, spec: LaunchSpec, messages: list) -> WorldResult:
        """The scenario's ``WorldResult``, built as a fresh world's (ddpprobe/launch/_world.py ``_outcome``)."""
        completed = []
        for rank, message in enumerate(messages):
            files = paths(spec.world_dir, rank)
            completed.append(
                dataclasses.replace(
                    message,
                    pid=self.processes[rank].pid,
                    exitcode=0,  # a fresh rank that returned its record exits with 0
                    stdout=read_text(files["stdout"]),
                    stderr=read_text(files["stderr"]),
                    files=snapshot(files["dir"]),
                )
            )
        world = f"world of {spec.world_size} rank(s) running {spec.scenario_ref} (backend={spec.backend})"
        return build_result(completed, world)
