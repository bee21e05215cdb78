"""pytest plugin: command-line options, the ``run_world`` fixture and the ``gpu`` marker.

Enable it from a ``conftest.py`` with ``pytest_plugins = ["ddpprobe.pytest_plugin"]``.

Options (each also readable from an environment variable, the option wins):

=====================  ==========================  =================================================
option                 environment variable        meaning
=====================  ==========================  =================================================
``--backend``          ``DDPPROBE_BACKEND``        ``gloo`` (default, CPU) or ``nccl`` (a GPU per rank)
``--world-size``       ``DDPPROBE_WORLD_SIZES``    comma list; run only facts parametrised by these W
``--world-timeout``    ``DDPPROBE_TIMEOUT``        seconds one world may run (default 120)
``--pg-timeout``       ``DDPPROBE_PG_TIMEOUT``     seconds a collective may block (default: half)
``--start-method``     ``DDPPROBE_START_METHOD``   ``forkserver`` (default for gloo) or ``spawn``
=====================  ==========================  =================================================
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import pytest

from ddpprobe.launch import BACKENDS, DEFAULT_TIMEOUT_S, START_METHODS, external_world, run_world as _run_world
from ddpprobe.launch._spec import PG_TIMEOUT_SHARE, env_float
from ddpprobe.launch._world import MAX_SECONDS, MIN_SECONDS, cuda_device_count


def pytest_addoption(parser) -> None:
    group = parser.getgroup("ddpprobe", "ddpprobe: launching DDP worlds")
    group.addoption(
        "--backend",
        choices=BACKENDS,
        default=os.environ.get("DDPPROBE_BACKEND", "gloo"),
        help="process-group backend of every world: gloo (CPU, default) or nccl (one CUDA device per rank)",
    )
    group.addoption(
        "--world-size",
        default=os.environ.get("DDPPROBE_WORLD_SIZES", ""),
        metavar="W[,W...]",
        help="run only the facts parametrised by these world sizes (default: all)",
    )
    group.addoption(
        "--world-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds one world may run before its ranks' stacks are taken and all are killed "
        "(default DDPPROBE_TIMEOUT or 120)",
    )
    group.addoption(
        "--pg-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds a collective may block before the process group raises (default DDPPROBE_PG_TIMEOUT "
        "or half the world timeout)",
    )
    group.addoption(
        "--start-method",
        choices=START_METHODS,
        default=None,
        help="how ranks start: forkserver (preloaded, fast; default for gloo) or spawn (fresh interpreters)",
    )


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "gpu(min_gpus=1): a GPU-only fact; runs with --backend nccl on a machine with at least min_gpus CUDA devices",
    )
    _check_options(config)


def _check_options(config) -> None:
    """Refuse bad settings once, before any test runs, naming the option and its variable."""
    backend = config.getoption("--backend")
    if backend not in BACKENDS:
        raise pytest.UsageError(f"--backend / DDPPROBE_BACKEND={backend!r}: use one of {', '.join(BACKENDS)}")
    start_method = config.getoption("--start-method") or os.environ.get("DDPPROBE_START_METHOD")
    if start_method and start_method not in START_METHODS:
        raise pytest.UsageError(
            f"--start-method / DDPPROBE_START_METHOD={start_method!r}: use one of {', '.join(START_METHODS)}")
    try:
        timeout = config.getoption("--world-timeout")
        if timeout is None:
            timeout = env_float("DDPPROBE_TIMEOUT", DEFAULT_TIMEOUT_S)
        pg_timeout = config.getoption("--pg-timeout")
        if pg_timeout is None:
            pg_timeout = env_float("DDPPROBE_PG_TIMEOUT", timeout * PG_TIMEOUT_SHARE)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    for name, value in (("--world-timeout / DDPPROBE_TIMEOUT", timeout), ("--pg-timeout / DDPPROBE_PG_TIMEOUT", pg_timeout)):
        if not MIN_SECONDS <= value <= MAX_SECONDS:
            raise pytest.UsageError(f"{name}={value!r}: give seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g}")
    if pg_timeout >= timeout:
        raise pytest.UsageError(
            f"--pg-timeout {pg_timeout:g} must be shorter than the world timeout {timeout:g}, so a stuck "
            "collective is reported by the process group before the world is killed")


def _parse_world_sizes(raw: str) -> set:
    if not raw:
        return set()
    try:
        sizes = {int(part) for part in raw.split(",") if part.strip()}
    except ValueError:
        raise pytest.UsageError(
            f"--world-size / DDPPROBE_WORLD_SIZES={raw!r}: give world sizes as integers, e.g. --world-size 2,3"
        ) from None
    if any(size < 1 for size in sizes):
        raise pytest.UsageError(f"--world-size / DDPPROBE_WORLD_SIZES={raw!r}: world sizes must be >= 1")
    return sizes


def backend_skip_reason(backend: str, world_size: int, device_count: int) -> Optional[str]:
    """Why a backend-agnostic fact at ``world_size`` cannot run here, or None if it can."""
    if backend == "nccl" and device_count < world_size:
        return f"backend nccl with world size {world_size} needs {world_size} CUDA devices, found {device_count}"
    return None


def gpu_skip_reason(backend: str, min_gpus: int, device_count: int) -> Optional[str]:
    """Why a ``@pytest.mark.gpu(min_gpus=N)`` fact cannot run here, or None if it can."""
    if backend != "nccl":
        return f"GPU-only fact: run with --backend nccl on a machine with >= {min_gpus} CUDA device(s)"
    if device_count < min_gpus:
        return f"GPU-only fact needs >= {min_gpus} CUDA device(s), found {device_count}"
    return None


def pytest_collection_modifyitems(config, items) -> None:
    sizes = _parse_world_sizes(config.getoption("--world-size"))
    if not sizes:
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        world_size = callspec.params.get("world_size") if callspec else None
        (drop if world_size is not None and world_size not in sizes else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session, exitstatus) -> None:
    """Inside a torchrun/srun world, leave it together so no rank aborts at exit."""
    if external_world() is not None:
        from ddpprobe.launch._external import shutdown

        shutdown()


def pytest_runtest_setup(item) -> None:
    marker = item.get_closest_marker("gpu")
    if marker is None:
        return
    min_gpus = marker.kwargs.get("min_gpus", marker.args[0] if marker.args else 1)
    backend = item.config.getoption("--backend")
    reason = gpu_skip_reason(backend, min_gpus, cuda_device_count() if backend == "nccl" else 0)
    if reason:
        pytest.skip(reason)


@pytest.fixture
def backend(request) -> str:
    """The backend chosen with ``--backend`` (``"gloo"`` or ``"nccl"``)."""
    return request.config.getoption("--backend")


@pytest.fixture
def run_world(request, backend):
    """``ddpprobe.run_world`` with this session's backend, timeouts and start method filled in.

    Under ``--backend nccl`` a world larger than the number of CUDA devices skips the test with the
    reason, instead of failing. Inside a torchrun/srun world (every rank running this pytest session in
    lockstep), scenarios run in-process and a fact needing another world size skips on every rank.
    """
    config = request.config
    defaults = {
        "backend": backend,
        "timeout": config.getoption("--world-timeout"),
        "pg_timeout": config.getoption("--pg-timeout"),
        "start_method": config.getoption("--start-method"),
    }

    @functools.wraps(_run_world)
    def run(scenario, world_size: int = 2, **kwargs):
        outside = external_world()
        if outside is not None:
            if world_size != outside.world_size:
                pytest.skip(f"fact runs at world size {world_size}; this {outside.launcher} world has "
                            f"{outside.world_size} ranks")
        elif isinstance(world_size, int) and not isinstance(world_size, bool):
            reason = backend_skip_reason(kwargs.get("backend", backend), world_size,
                                         cuda_device_count() if backend == "nccl" else 0)
            if reason:
                pytest.skip(reason)
        merged = {k: v for k, v in defaults.items() if v is not None}
        merged.update(kwargs)
        return _run_world(scenario, world_size, **merged)

    return run
