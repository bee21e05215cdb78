"""Running scenarios inside a world someone else launched (torchrun, srun), instead of launching one.

When the environment already describes a world, every rank runs the same program in lockstep — for
example the same pytest session::

    torchrun --nproc-per-node 2 -m pytest -m gpu --backend nccl

and each ``run_world(...)`` call runs the scenario *in the current process*, then the ranks exchange
their records with ``all_gather_object`` on a dedicated gloo group, so every rank's test sees every
rank's record, exactly as with a launched world.

What cannot deadlock: a scenario that raises on one rank while the others wait in a collective ends
with the process group's timeout (``pg_timeout``) on the others; every rank then reaches the record
exchange, which has its own timeout. A fact skipped on one rank is skipped on all, since the skip
decision (world size, device count) is the same on every rank and needs no communication.

Limits: scenarios share the process (Lightning's once-per-process warning caches, the initialised
process group, imported modules), unlike launched worlds where every scenario gets fresh processes.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import tempfile
from typing import Optional

from ddpprobe.launch._files import read_text as _read, snapshot as _snapshot
from ddpprobe.launch._message import run_scenario
from ddpprobe.launch._rank import paths
from ddpprobe.launch._results import WorldResult, build_result
from ddpprobe.launch._settings import Settings, resolve_settings
from ddpprobe.launch._spec import RankInfo, accelerator

#: Variables that tell a process it is one rank of an externally launched world.
#: torchrun sets TORCHELASTIC_RUN_ID (torch.distributed.is_torchelastic_launched); srun sets SLURM_PROCID.
_LAUNCHER_MARKERS = ("TORCHELASTIC_RUN_ID", "SLURM_PROCID")


@dataclasses.dataclass(frozen=True)
class ExternalWorld:
    """The world this process was launched into.

    Attributes:
        rank: global rank. world_size: number of ranks. local_rank: rank on this node.
        node_rank: index of this node. local_world_size: ranks per node.
        launcher: ``"torchrun"`` or ``"srun"``.
    """

    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    local_world_size: int
    launcher: str

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size


def external_world(environ: Optional[dict] = None) -> Optional[ExternalWorld]:
    """The externally launched world described by ``environ`` (default ``os.environ``), or None.

    torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``, ``LOCAL_WORLD_SIZE`` with
    ``TORCHELASTIC_RUN_ID``. srun: a job step of several tasks (``SLURM_STEP_NUM_TASKS`` > 1) with
    ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE``; a batch
    script's own step (one task, even under ``sbatch --ntasks=N``) is not a world. MASTER_ADDR and
    MASTER_PORT must be exported by the batch script. A ddpprobe rank itself is never an external
    world (its launcher clears these variables), and ``DDPPROBE_NO_EXTERNAL_WORLD=1`` (``true``, ``yes``) turns
    detection off; ``0``, ``false``, ``no`` or empty leave it on.

    Raises:
        ValueError: a launcher variable holds something other than an integer, or
            ``DDPPROBE_NO_EXTERNAL_WORLD`` is none of the values above; the message names it.
    """
    env = os.environ if environ is None else environ
    switch = env.get("DDPPROBE_NO_EXTERNAL_WORLD", "").strip().lower()
    if switch in ("1", "true", "yes"):
        return None
    if switch not in ("", "0", "false", "no"):
        raise ValueError(
            f"DDPPROBE_NO_EXTERNAL_WORLD={env['DDPPROBE_NO_EXTERNAL_WORLD']!r} is neither on nor off; set it to 1 "
            "(true, yes) to launch ddpprobe's own worlds even under torchrun/srun, or to 0 (false, no, empty) to "
            "run in the external world"
        )

    def number(name: str, default=None) -> int:
        raw = env.get(name, default)
        try:
            return int(str(raw).split("(")[0])
        except ValueError:
            raise ValueError(
                f"{name}={raw!r} is not an integer, so the external world cannot be read; fix the launcher's "
                "environment or set DDPPROBE_NO_EXTERNAL_WORLD=1 to let ddpprobe launch its own worlds"
            ) from None

    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env:
        world_size = number("WORLD_SIZE")
        return ExternalWorld(
            rank=number("RANK"),
            world_size=world_size,
            local_rank=number("LOCAL_RANK", 0),
            node_rank=number("GROUP_RANK", env.get("NODE_RANK", 0)),
            local_world_size=number("LOCAL_WORLD_SIZE", world_size),
            launcher="torchrun",
        )
    if "SLURM_PROCID" in env and number("SLURM_STEP_NUM_TASKS", 1) > 1:
        world_size = number("SLURM_STEP_NUM_TASKS")
        return ExternalWorld(
            rank=number("SLURM_PROCID"),
            world_size=world_size,
            local_rank=number("SLURM_LOCALID", 0),
            node_rank=number("SLURM_NODEID", 0),
            local_world_size=number("SLURM_STEP_TASKS_PER_NODE", world_size),
            launcher="srun",
        )
    return None


_exchange_group = None


def _exchange(message, timeout: float) -> list:
    """``all_gather_object`` of this rank's message on a gloo group with its own timeout."""
    import torch.distributed as dist

    global _exchange_group
    if _exchange_group is None:
        _exchange_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, message, group=_exchange_group)
    return gathered


def _ensure_process_group(world: ExternalWorld, backend: str, pg_timeout: float) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        if backend == "nccl":
            import torch

            torch.cuda.set_device(world.local_rank)
        try:
            dist.init_process_group(
                backend, rank=world.rank, world_size=world.world_size, timeout=datetime.timedelta(seconds=pg_timeout)
            )
        except Exception as exc:
            raise RuntimeError(
                f"this process looks like rank {world.rank} of a {world.world_size}-rank {world.launcher} world, "
                f"so ddpprobe joined it instead of launching one, and joining failed: {exc}. If no such world "
                "is running, set DDPPROBE_NO_EXTERNAL_WORLD=1"
            ) from exc


class _Captured:
    """Redirect file descriptors 1 and 2 to files for the duration of a ``with`` block."""

    def __init__(self, stdout_path: str, stderr_path: str):
        self.paths = {1: stdout_path, 2: stderr_path}
        self.saved = {}

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, path in self.paths.items():
            self.saved[fd] = os.dup(fd)
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self.saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        return False


def run_in_external_world(world: ExternalWorld, scenario_ref: str, params: dict, settings: Settings) -> WorldResult:
    """Run the scenario in this process as rank ``world.rank``; exchange every rank's ``RankMessage``
    and build the world's result from them, on every rank alike (ddpprobe/launch/_results.py).

    Raises what ``run_world`` raises (``RankFailed``, a ``TypeError`` for a record JSON cannot hold),
    on every rank, since every rank has every rank's message.
    """
    messages = exchange_messages(world, scenario_ref, params, settings)
    head = f"external world of {len(messages)} rank(s) running {scenario_ref} (backend={settings.backend})"
    return build_result(messages, head)


def exchange_messages(world: ExternalWorld, scenario_ref: str, params: dict, settings: Settings) -> list:
    """Run the scenario here as rank ``world.rank``; return every rank's ``RankMessage``, ordered by rank."""
    _ensure_process_group(world, settings.backend, settings.pg_timeout)
    with tempfile.TemporaryDirectory(prefix="ddpprobe-external-") as world_dir:
        files = paths(world_dir, world.rank)
        os.makedirs(files["dir"], mode=0o700)
        info = RankInfo(
            rank=world.rank,
            world_size=world.world_size,
            backend=settings.backend,
            accelerator=accelerator(settings.backend),
            pg_timeout=settings.pg_timeout,
            world_dir=world_dir,
            rank_dir=files["dir"],
            local_rank=world.local_rank,
            node_rank=world.node_rank,
            num_nodes=world.num_nodes,
        )
        cwd = os.getcwd()
        os.chdir(files["dir"])
        try:
            with _Captured(files["stdout"], files["stderr"]):
                message = run_scenario(scenario_ref, info, params, os.getpid())
        finally:
            os.chdir(cwd)
        message = dataclasses.replace(
            message, stdout=_read(files["stdout"]), stderr=_read(files["stderr"]), files=_snapshot(files["dir"])
        )
    return sorted(_exchange(message, settings.timeout), key=lambda m: m.rank)


def shutdown() -> None:
    """Leave the external world cleanly: wait for every rank, then destroy the process groups.

    Without this, gloo's connections are torn down by interpreter exit while peers still hold them,
    and a rank can abort ("terminate called without an active exception"), which torchrun reports as
    a failed worker and which keeps the other agents waiting at their exit barrier.
    """
    import torch.distributed as dist

    global _exchange_group
    if dist.is_initialized():
        if _exchange_group is not None:
            dist.barrier(group=_exchange_group)
        dist.destroy_process_group()
    _exchange_group = None


def main(argv: Optional[list] = None) -> int:
    """``python -m ddpprobe.launch SCENARIO [--params JSON] [--out FILE]`` under torchrun/srun.

    Runs ``SCENARIO`` (``"module:function"``) on every rank of the external world; rank 0 writes the
    ranks' messages as JSON to ``--out`` (default: stdout): a list ordered by rank of ``{"rank", "pid",
    "status", "record" (or "exc_type", "error", "traceback"), "stdout", "stderr", "files"}``
    (``RankMessage.to_json_dict``). ``--backend``, ``--timeout`` and ``--pg-timeout`` default to
    ``DDPPROBE_BACKEND``, ``DDPPROBE_TIMEOUT`` and ``DDPPROBE_PG_TIMEOUT`` like every world
    (ddpprobe/launch/_settings.py). Exit code 0 if every rank produced a record, 2 for bad settings.
    """
    import argparse

    from ddpprobe.launch._settings import BACKENDS, SettingsError

    parser = argparse.ArgumentParser(prog="python -m ddpprobe.launch")
    parser.add_argument("scenario", help='importable "module:function"')
    parser.add_argument("--params", default="{}", help="JSON object of scenario parameters")
    parser.add_argument("--backend", default=None, choices=BACKENDS, help="default DDPPROBE_BACKEND or gloo")
    parser.add_argument("--timeout", type=float, default=None, help="seconds; default DDPPROBE_TIMEOUT or 120")
    parser.add_argument(
        "--pg-timeout", type=float, default=None, help="seconds; default DDPPROBE_PG_TIMEOUT or half the timeout"
    )
    parser.add_argument("--out", default="-")
    args = parser.parse_args(argv)
    try:
        settings = resolve_settings(
            backend=args.backend,
            timeout=args.timeout,
            pg_timeout=args.pg_timeout,
            names={"backend": "--backend", "timeout": "--timeout", "pg_timeout": "--pg-timeout"},
        )
    except SettingsError as exc:
        parser.error(str(exc))
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        parser.error(f"--params {args.params!r} is not JSON ({exc}); give a JSON object, e.g. --params '{{\"n\": 8}}'")
    if not isinstance(params, dict):
        parser.error(
            f"--params {args.params!r} is a JSON {type(params).__name__}, not an object; give the scenario's "
            "keyword arguments as a JSON object, e.g. --params '{\"n\": 8}'"
        )
    world = external_world()
    if world is None:
        parser.error("no external world found: run under torchrun (TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE) or srun")
    messages = exchange_messages(world, args.scenario, params, settings)
    ok = all(m.status == "ok" for m in messages)
    if world.rank == 0:
        text = json.dumps([m.to_json_dict() for m in messages], indent=1)
        if args.out == "-":
            print(text)
        else:
            with open(args.out, "w") as fh:
                fh.write(text)
    shutdown()
    return 0 if ok else 1
