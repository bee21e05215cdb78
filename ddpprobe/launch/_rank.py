"""The body of one rank process (runs in the child, never in the pytest process).

A rank sets up the environment Lightning reads, captures its own stdout/stderr into files, arms
``faulthandler`` so the parent can ask for its Python stack, runs the scenario, and sends back one
``RankMessage`` (ddpprobe/launch/_message.py). It imports nothing of ddpprobe but the plain data it
exchanges (``_spec``, ``_message``), so a rank's side of the launcher can be read on its own.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import random
import signal
import sys
import threading
import time

from ddpprobe.launch._message import run_scenario
from ddpprobe.launch._spec import LaunchSpec

#: Exit code of a rank whose parent (the launcher) went away: the rank ends itself.
ORPHAN_EXIT_CODE = 70

#: Seconds a rank that failed waits to be ended by the launcher before it exits on its own.
FAILED_RANK_LINGER_S = 30.0

#: Signal the launcher sends to ask a rank for its Python stack (written by faulthandler).
STACK_SIGNAL = signal.SIGUSR1

#: The seed torch's default CPU generator starts with in a fresh interpreter, in torch versions that
#: do not seed it from OS entropy (``default_rng_seed_val``, c10/core/GeneratorImpl.h).
TORCH_FIXED_DEFAULT_SEED = 67280421310721

#: Environment variables that make Lightning (or torch) believe another launcher or cluster manages
#: the processes. They are removed in every rank unless ``keep_cluster_env=True``.
#: Source: lightning_fabric/plugins/environments/{slurm,torchelastic,lsf,mpi,kubeflow}.py ``detect()``.
CLUSTER_ENV_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LSB_", "JSM_", "OMPI_", "PMI_", "KUBERNETES_")
CLUSTER_ENV_NAMES = ("RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "PL_TRAINER_GPUS")


def paths(world_dir: str, rank: int) -> dict:
    """Files a rank writes in the world folder, by purpose."""
    return {
        "dir": os.path.join(world_dir, f"rank{rank}"),
        "stdout": os.path.join(world_dir, f"rank{rank}.stdout"),
        "stderr": os.path.join(world_dir, f"rank{rank}.stderr"),
        "stack": os.path.join(world_dir, f"rank{rank}.stack"),
    }


def _set_environment(spec: LaunchSpec, rank: int) -> None:
    """Make this process look like a rank started by an external launcher (torchrun-style).

    Global rank ``rank`` is local rank ``rank % devices`` on node ``rank // devices`` (``NODE_RANK``,
    also as torchrun's ``GROUP_RANK``; ``LOCAL_WORLD_SIZE`` ranks per node): with ``num_nodes > 1`` the
    world looks to Lightning like several nodes, though every rank runs on this host.

    ``LOCAL_RANK`` in the environment tells Lightning's ``LightningEnvironment`` that the processes
    already exist (``creates_processes_externally``), so it joins the world instead of launching more.
    Source: lightning_fabric/plugins/environments/lightning.py.

    The rendezvous store is hosted by the launcher (port 0, so no two worlds can collide), and every
    rank connects to it as a client: ``TORCHELASTIC_USE_AGENT_STORE=True`` is how torchrun tells
    ``torch.distributed`` to do exactly that. Source: torch/distributed/rendezvous.py
    ``_create_c10d_store``.

    The rank starts from the launcher's environment as it was when ``run_world`` was called
    (``spec.parent_env``), not the one a forked rank inherits from the forkserver (a snapshot taken
    when the server started), so both start methods see the same variables.
    """
    if spec.parent_env:
        os.environ.clear()
        os.environ.update(spec.parent_env)
    if not spec.keep_cluster_env:
        for name in list(os.environ):
            if name.startswith(CLUSTER_ENV_PREFIXES) or name in CLUSTER_ENV_NAMES:
                del os.environ[name]
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(spec.master_port),
            "WORLD_SIZE": str(spec.world_size),
            "NODE_RANK": str(rank // spec.devices),
            "GROUP_RANK": str(rank // spec.devices),
            "LOCAL_RANK": str(rank % spec.devices),
            "LOCAL_WORLD_SIZE": str(spec.devices),
            "RANK": str(rank),  # what torchrun sets too; env:// init_process_group reads it
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
    )
    if spec.backend == "nccl":
        # Make a stuck NCCL collective raise at the process-group timeout instead of hanging.
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    os.environ.update(spec.extra_env)


def _capture_output(files: dict) -> None:
    """Point file descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr``) at the rank's own files."""
    for fd, path in ((1, files["stdout"]), (2, files["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")


def _watch_parent(lifeline) -> None:
    """End this rank as soon as the launcher goes away (its end of ``lifeline`` closes)."""

    def watch() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        os._exit(ORPHAN_EXIT_CODE)

    threading.Thread(target=watch, name="ddpprobe-lifeline", daemon=True).start()


def _align_process_state(rank: int, local_rank: int) -> None:
    """Undo what a forked rank inherited from the forkserver, so it matches a fresh interpreter.

    - ``rank_zero_only.rank`` is read from ``RANK``/``LOCAL_RANK`` when Lightning is *imported*
      (lightning_fabric/utilities/rank_zero.py); the forkserver imported it with no rank set, so it
      would say 0 in every rank. Set it to this rank, as a fresh import here would (torchmetrics'
      own copy, torchmetrics/utilities/prints.py, reads ``LOCAL_RANK``: the local rank).
    - Python's and NumPy's global random generators are seeded from OS entropy in a fresh
      interpreter; forked ranks would share the server's state. Reseed them.
    - torch's default CPU generator: older torch seeds it with a fixed default
      (``TORCH_FIXED_DEFAULT_SEED``), newer torch (2.13 here) from OS entropy, so fresh interpreters
      differ. If the inherited generator does not carry the fixed default, this torch seeds from
      entropy and the rank reseeds it the same way; otherwise it is left as a fresh interpreter has it.
    """
    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):
        if torch.default_generator.initial_seed() != TORCH_FIXED_DEFAULT_SEED:
            torch.default_generator.seed()
    for module_name in (
        "lightning_utilities.core.rank_zero",
        "lightning_fabric.utilities.rank_zero",
        "pytorch_lightning.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.utilities.rank_zero",
    ):
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, "rank_zero_only"):
            module.rank_zero_only.rank = rank
    # torchmetrics keeps its own copy (read from LOCAL_RANK at import), used by its rank_zero_warn;
    # older releases' deprecation warnings (e.g. ``Metric._update_called`` under Lightning 1.9)
    # would otherwise be emitted on every forked rank but on rank 0 only under spawn.
    module = sys.modules.get("torchmetrics.utilities.prints")
    if module is not None and hasattr(module, "rank_zero_only"):
        module.rank_zero_only.rank = local_rank
    # A process multiprocessing started takes the start method that started it as its default
    # (multiprocessing/process.py BaseProcess._bootstrap); a fresh interpreter has none chosen. Reset it,
    # so a DataLoader's workers (num_workers > 0) start as under torchrun (forked from the rank on
    # Linux), not through a new forkserver of the rank's own that imports torch again (seconds each).
    multiprocessing.set_start_method(None, force=True)


def rank_main(spec: LaunchSpec, rank: int, result_conn, lifeline) -> None:
    """Entry point of a rank process. Never returns normally: ends with ``os._exit``."""
    # Lead a process group of our own, so the launcher can end children this rank leaves behind.
    os.setpgid(0, 0)
    files = paths(spec.world_dir, rank)
    os.makedirs(files["dir"], mode=0o700, exist_ok=True)
    _capture_output(files)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    stack_file = os.fdopen(os.open(files["stack"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    _watch_parent(lifeline)
    _set_environment(spec, rank)
    os.chdir(files["dir"])
    _align_process_state(rank, rank % spec.devices)
    message = run_scenario(
        spec.scenario_ref, spec.rank_info(rank, files["dir"]), spec.params, os.getpid(), catch=BaseException
    )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        result_conn.send(message)
        result_conn.close()
        if message.status != "ok":
            # Stay in the world until the launcher ends it: leaving now would break the other ranks'
            # collectives with secondary "connection reset" errors and hide where they were waiting.
            # The lifeline thread ends the rank as soon as the launcher goes; this is only the bound.
            time.sleep(FAILED_RANK_LINGER_S)
    finally:
        if message.status == "ok":
            _destroy_process_group()
        os._exit(0)


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the rank is ending either way
        pass
