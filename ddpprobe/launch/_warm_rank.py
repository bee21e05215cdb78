"""The body of one rank of a warm world: a process that stays up and runs scenario after scenario.

A warm rank is forked like any rank (ddpprobe/launch/_rank.py), then loops: it receives a ``LaunchSpec``
from the launcher's warm world (ddpprobe/launch/_warm.py), runs the scenario exactly as a fresh rank would
and sends back ``(RankMessage, clean)``. Before each scenario it makes itself look like a freshly forked
rank again (``Reset``); after it, it ends what the scenario left behind and says whether that worked
(``clean``: a world with an unclean rank is not given another scenario). It imports nothing of pytest and
nothing of ddpprobe but the rank's own side of the launcher.

Each scenario makes its own process group, as in a fresh world: the rank destroys every group after the
scenario and the next one joins a new group on a new rendezvous store. A group kept from one scenario to
the next would change what Lightning does and prints at set-up (``_init_dist_connection`` returns early,
without its "All distributed processes registered" banner, when a group exists:
lightning_fabric/utilities/distributed.py) and what the group's sequence numbers say.

What is reset before each scenario, and why (the state a fresh rank takes from the forkserver):

- working directory, ``os.environ``, stdout/stderr files and the stack file: the scenario's new world folder
  and the launcher's environment at the call (``_rank._set_environment``);
- random generators: Python's, NumPy's and torch's default generator, seeded as a fresh interpreter seeds
  them (from OS entropy, or torch's fixed default seed on releases that use one);
- ``warnings``: the filters as the rank started with them, and every "already shown" registry emptied;
  Lightning's once-per-process ``WarningCache`` objects (module globals, e.g.
  pytorch_lightning/trainer/connectors/logger_connector/result.py ``warning_cache``) emptied;
- ``logging``: every logger's level, handlers, filters and ``propagate`` as the rank started with them;
- torch's global flags a ``Trainer`` or a scenario sets: deterministic algorithms, default dtype, grad
  mode, threads, float32 matmul precision, cuDNN flags; signal handlers, ``sys.path`` and ``sys.argv``;
- the settings in the table ``STATE`` of ddpprobe/launch/_warm_state.py: ``torch.distributed``'s functions
  a scenario replaced, torch's default device, print options, warn-always, TF32 and autocast flags, sharing
  strategy and ``torch._dynamo.config``; NumPy's print options and error handling; the umask, recursion
  limit, decimal context, default socket timeout and whether ``gc`` is enabled; and file descriptors a
  scenario left open are closed;
- the project's own modules the scenario imported (not preloaded by the forkserver) are forgotten, so the
  next scenario imports them afresh, with fresh module state.

A scenario is not clean when, after it, a thread it started still runs, or a process group cannot be
destroyed; child processes it left are killed (as a fresh world's end kills them) and also make it unclean.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import sys
import sysconfig
import threading
import time

from ddpprobe.launch import _warm_state
from ddpprobe.launch._message import run_scenario
from ddpprobe.launch._rank import (
    FAILED_RANK_LINGER_S,
    STACK_SIGNAL,
    TORCH_FIXED_DEFAULT_SEED,
    _align_process_state,
    _capture_output,
    _set_environment,
    _watch_parent,
    paths,
)

#: Where installed packages and the standard library live: a module imported from elsewhere is the
#: project's or the user's own code, forgotten after each scenario.
_LIBRARY_ROOTS = tuple(
    {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"]) if p}
)

#: Signals whose handlers a scenario may change (Lightning's ``_SignalConnector`` sets SIGTERM/SIGUSR1 in fit).
#: The stack signal is left out: faulthandler holds it, registered anew for each scenario.
_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP, STACK_SIGNAL)]


def warm_rank_main(rank: int, conn, lifeline) -> None:
    """Entry point of a warm rank process: run each ``LaunchSpec`` received on ``conn`` until ``None`` or EOF.
    Never returns normally: ends with ``os._exit``."""
    os.setpgid(0, 0)  # lead a process group of our own, as a fresh rank does
    _watch_parent(lifeline)
    reset = None
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if spec is None:
            os._exit(0)
        files = paths(spec.world_dir, rank)
        os.makedirs(files["dir"], mode=0o700, exist_ok=True)
        _capture_output(files)
        faulthandler.enable(file=sys.stderr, all_threads=True)
        stack_file = os.fdopen(os.open(files["stack"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")
        faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
        _set_environment(spec, rank)
        os.chdir(files["dir"])
        if reset is None:
            reset = Reset()  # the state of a freshly forked rank, taken before its first scenario
            gc.freeze()
        else:
            reset.restore(keep_fds=frozenset({stack_file.fileno()}))
        _align_process_state(rank, rank % spec.devices)
        message = run_scenario(
            spec.scenario_ref, spec.rank_info(rank, files["dir"]), spec.params, os.getpid(), catch=BaseException
        )
        clean = message.status == "ok" and reset.end_scenario()
        sys.stdout.flush()
        sys.stderr.flush()
        _quiet_output()
        try:
            conn.send((message, clean))
        except (BrokenPipeError, OSError):
            os._exit(0)
        if not clean:
            # As a fresh rank: stay until the launcher ends the world, so peers blocked in a collective
            # with this rank are not released with secondary errors. The lifeline bounds the wait.
            time.sleep(FAILED_RANK_LINGER_S)
            os._exit(0)
        # The scenario's objects go now, their finalisers writing nowhere a later scenario reads; what
        # survives is moved out of the collector's sight, so the next collection looks at new objects only
        # (a full one, with torch and Lightning loaded, takes about 0.25 s).
        reset.ended_groups.clear()
        gc.collect()
        gc.freeze()
        stack_file.close()


def _quiet_output() -> None:
    """Point file descriptors 1 and 2 at ``/dev/null`` between scenarios (the scenario's files are read)."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


class Reset:
    """The process state a freshly forked rank starts with, taken once, and put back before each scenario."""

    def __init__(self):
        import torch

        self.torch = torch
        # A release seeding torch's default generator with a fixed value at start (older torch) is
        # recognised by that value, before any scenario drew from or reseeded it (_rank._align_process_state).
        self.fixed_torch_seed = torch.default_generator.initial_seed() == TORCH_FIXED_DEFAULT_SEED
        self.filters = list(warnings_module().filters)
        self.showwarning = warnings_module().showwarning
        self.loggers = {name: _logger_state(logger) for name, logger in _loggers()}
        self.logging_disable = logging.root.manager.disable
        self.torch_flags = _torch_flags(torch)
        self.handlers = {s: signal.getsignal(s) for s in _SIGNALS}
        self.path = list(sys.path)
        self.argv = list(sys.argv)
        self.threads = {t.ident for t in threading.enumerate()}
        self.modules = set(sys.modules)
        self.ended_groups = []  # process groups destroyed, released once the record is sent
        self.caches_seen = set()
        self.caches = []
        self._find_warning_caches()
        self.settings = _warm_state.snapshot()  # the table of ddpprobe/launch/_warm_state.py

    def restore(self, keep_fds: frozenset = frozenset()) -> None:
        """Put the rank back as it was before its first scenario (the list in the module docstring);
        ``keep_fds``: descriptors the rank opened for this scenario (its stack file), left open."""
        _warm_state.restore(self.settings, keep_fds)
        warnings = warnings_module()
        warnings.filters[:] = self.filters
        warnings.showwarning = self.showwarning
        warnings._filters_mutated()  # every module's __warningregistry__ is stale from here: shown again
        warnings.onceregistry.clear()
        self._find_warning_caches()
        for cache in self.caches:
            cache.clear()
        logging.root.manager.disable = self.logging_disable
        for name, logger in _loggers():
            _set_logger_state(logger, self.loggers.get(name))
        _set_torch_flags(self.torch, self.torch_flags)
        for sig, handler in self.handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                try:
                    signal.signal(sig, handler)
                except (OSError, ValueError, TypeError):
                    pass
        sys.path[:] = self.path
        sys.argv[:] = self.argv
        generator = self.torch.default_generator
        if self.fixed_torch_seed:
            generator.manual_seed(TORCH_FIXED_DEFAULT_SEED)
        else:
            generator.seed()

    def end_scenario(self) -> bool:
        """End what the scenario left: process groups, child processes, its own modules. True when the rank
        is as clean as a fresh one would start (no thread of the scenario still running, no child left)."""
        clean = _destroy_process_groups(self.ended_groups)
        clean = _kill_children() and clean
        for name in set(sys.modules) - self.modules:
            module = sys.modules.get(name)
            if _is_own_code(module):
                del sys.modules[name]
                parent, _, child = name.rpartition(".")
                if parent in sys.modules and getattr(sys.modules[parent], child, None) is module:
                    delattr(sys.modules[parent], child)
        extra = [t for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()]
        return clean and not extra

    def _find_warning_caches(self) -> None:
        """Lightning's once-per-process warning caches: module-level ``WarningCache`` sets, in every module
        loaded since the last look (quietly: ``isinstance`` on a deprecated global such as
        ``torch.distributed.reduce_op`` warns, into the scenario's stderr)."""
        with _warm_state.quiet():
            for name in list(sys.modules):
                if name in self.caches_seen:
                    continue
                self.caches_seen.add(name)
                module = sys.modules.get(name)
                for value in list(getattr(module, "__dict__", {}).values()):
                    if isinstance(value, set) and type(value).__name__ == "WarningCache":
                        self.caches.append(value)


def warnings_module():
    import warnings

    return warnings


def _loggers():
    yield "", logging.root
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            yield name, logger


def _logger_state(logger) -> tuple:
    return logger.level, list(logger.handlers), list(logger.filters), logger.propagate, logger.disabled


def _set_logger_state(logger, state) -> None:
    level, handlers, filters, propagate, disabled = state or (logging.NOTSET, [], [], True, False)
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logger.filters[:] = filters
    logger.propagate = propagate
    logger.disabled = disabled


def _torch_flags(torch) -> dict:
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(),
        "threads": torch.get_num_threads(),
        "matmul": torch.get_float32_matmul_precision(),
        "cudnn": (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark),
        "anomaly": torch.is_anomaly_enabled(),
    }


def _set_torch_flags(torch, flags: dict) -> None:
    if _torch_flags(torch) == flags:
        return
    torch.use_deterministic_algorithms(flags["deterministic"], warn_only=flags["warn_only"])
    torch.set_default_dtype(flags["dtype"])
    torch.set_grad_enabled(flags["grad"])
    torch.set_num_threads(flags["threads"])
    torch.set_float32_matmul_precision(flags["matmul"])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags["cudnn"]
    torch.autograd.set_detect_anomaly(flags["anomaly"])


def _destroy_process_groups(ended: list) -> bool:
    """Destroy the default process group and every subgroup made from it; True if that worked.

    The group objects are appended to ``ended``: a gloo group's last reference going waits about 10 ms
    (its threads end), which the rank spends after it sent its record, as a fresh rank does."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            ended.extend(dist.distributed_c10d._world.pg_map)
            dist.destroy_process_group()
        return True
    except Exception:  # noqa: BLE001 - the world is then not reused
        return False


def _kill_children() -> bool:
    """Kill and reap every child process this rank has (DataLoader workers, a scenario's own); True if none."""
    children = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as fh:
                children += [int(pid) for pid in fh.read().split()]
        except OSError:
            pass
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError, PermissionError):
            pass
    return not children


def _is_own_code(module) -> bool:
    path = getattr(module, "__file__", None)
    if not path:
        return False
    path = os.path.realpath(path)
    return not any(path.startswith(root + os.sep) for root in _LIBRARY_ROOTS)
