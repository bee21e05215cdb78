"""The forkserver ranks are forked from: started once per process with torch, Lightning and the probes
imported, and ended (not just abandoned) when that process exits."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import time

#: Modules the forkserver imports once, so that forked ranks start with them loaded.
#: ``ddpprobe.probes`` imports the Lightning package chosen by ``DDPPROBE_LIGHTNING`` (ddpprobe/_lightning.py).
FORKSERVER_PRELOAD = [
    "torch",
    "torch.distributed",
    "torchmetrics",
    "ddpprobe.launch._rank",
    "ddpprobe.probes",
    # pytorch-lightning <= 2.2 imports torch._dynamo inside every Trainer.fit/validate/
    # test/predict (pytorch_lightning/utilities/compile.py ``_maybe_unwrap_optimized``),
    # about 800 modules (sympy among them): ~1 s in every rank of every world unless
    # imported here once. Later releases import it with Lightning, so it costs nothing there.
    "torch._dynamo",
]

#: Seconds the launcher waits at interpreter exit for the forkserver it started to end.
FORKSERVER_STOP_S = 5.0


def context(start_method: str):
    """The ``multiprocessing`` context ranks are started from (the forkserver preloaded, see above)."""
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
    # (multiprocessing/forkserver.py ForkServer._stop_unlocked). Its own exit is an interpreter
    # finalisation with torch and Lightning loaded (seconds, more on a busy machine) that does nothing
    # ranks need (they are reaped already), so end it at once: otherwise every pytest process (each
    # xdist worker) spends those seconds at exit, or leaves the server behind if it is killed meanwhile.
    try:
        os.close(alive_fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    end = time.monotonic() + FORKSERVER_STOP_S
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            break
        if done or time.monotonic() > end:
            if not done:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            break
        time.sleep(0.01)
    server._forkserver_pid = None
