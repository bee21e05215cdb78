"""The forkserver ranks are forked from: started once per process with torch, Lightning and the probes
imported, and ended (not just abandoned) when that process exits.

Several processes on one host can share one forkserver (the pytest plugin does so for the xdist workers
of a run): :func:`start_shared_forkserver` starts one in the process that outlives them (the xdist
controller, which then imports neither torch nor Lightning itself) and returns its address;
:func:`attach_forkserver` makes every later forkserver world of another process fork its ranks there
instead of starting a server of its own. A forked rank is the same either way: the server imported the
same modules, and the rank takes its environment, working directory and ``sys.path`` from the process
that launched its world, which also keeps its lifeline and its pipes (they travel to the server over the
server's Unix socket, readable by this user only). Each server costs one interpreter importing torch and
Lightning (about 5 s of CPU), so sharing one saves that much per xdist worker but one.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import multiprocessing.resource_tracker
import os
import signal
import time
from multiprocessing import reduction, spawn, util
from multiprocessing.context import set_spawning_popen
from typing import Optional

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
    """The ``multiprocessing`` context ranks are started from (the forkserver preloaded, see above; the
    shared one after :func:`attach_forkserver`)."""
    if start_method == "forkserver" and _attached is not None:
        return _SharedForkServerContext()
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        _stop_forkserver_at_exit()
    return ctx


def start_shared_forkserver() -> dict:
    """Start a preloaded forkserver that other processes of this host attach to; it is ended (and reaped)
    when this process exits. This process itself imports nothing heavy: the server does.

    Returns:
        ``{"address": path of its Unix socket, "authkey": hex or None}``, what :func:`attach_forkserver`
        takes (the key exists from Python 3.14 on, where a forkserver authenticates its clients).
    """
    server = multiprocessing.forkserver.ForkServer()
    server.set_forkserver_preload(FORKSERVER_PRELOAD)
    server.ensure_running()
    atexit.register(_stop_server, server, os.getpid())
    authkey = getattr(server, "_forkserver_authkey", None)
    return {"address": server._forkserver_address, "authkey": authkey.hex() if authkey else None}


def attach_forkserver(address: str, authkey: Optional[str] = None) -> None:
    """Fork the ranks of this process's later forkserver worlds from the shared server at ``address``
    (started by :func:`start_shared_forkserver` in another process)."""
    global _attached
    _attached = _SharedForkServer(address, bytes.fromhex(authkey) if authkey else None)


class _SharedForkServer(multiprocessing.forkserver.ForkServer):
    """A client of a forkserver another process started: it connects, never starts or stops one."""

    def __init__(self, address: str, authkey: Optional[bytes]):
        super().__init__()
        self._forkserver_address = address
        if authkey is not None:
            self._forkserver_authkey = authkey
        # Handed to each forked child as the "alive" pipe it would give a server of its own (it starts none:
        # _rank.py resets its start method); the server's own liveness pipe belongs to its starter.
        self._forkserver_alive_fd = os.open(os.devnull, os.O_RDONLY)

    def ensure_running(self) -> None:
        multiprocessing.resource_tracker.ensure_running()


_attached: Optional[_SharedForkServer] = None


class _ServerPopen(multiprocessing.popen_forkserver.Popen):
    """``popen_forkserver.Popen`` connecting to the server :meth:`_server` names instead of this process's own."""

    def _server(self, process_obj):
        raise NotImplementedError

    def _connect(self, process_obj):
        return self._server(process_obj).connect_to_new_process(self._fds)

    def _launch(self, process_obj):
        # As multiprocessing/popen_forkserver.py Popen._launch, with the chosen server's connection.
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = self._connect(process_obj)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = multiprocessing.forkserver.read_signed(self.sentinel)


class _SharedForkServerPopen(_ServerPopen):
    """Connects to the attached server instead of this process's own."""

    def _server(self, process_obj):
        return _attached

    def _connect(self, process_obj):
        try:
            return super()._connect(process_obj)
        except OSError as exc:
            raise RuntimeError(
                f"the shared forkserver at {_attached._forkserver_address} cannot be reached ({exc}): the process "
                "that started it (the pytest-xdist controller) ended it or it died; rerun, or start ranks with "
                "--start-method spawn"
            ) from exc


class _SharedForkServerProcess(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _SharedForkServerPopen(process_obj)


class _SharedForkServerContext(multiprocessing.context.ForkServerContext):
    Process = _SharedForkServerProcess


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
    if _stop_registered_in_pid == os.getpid():
        _stop_server(multiprocessing.forkserver._forkserver, os.getpid())


def _stop_server(server, owner_pid: int) -> None:
    """End ``server`` (started by process ``owner_pid``, this one) at once and reap it."""
    pid = getattr(server, "_forkserver_pid", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if pid is None or alive_fd is None or owner_pid != os.getpid():
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


#: ``{(hash seed, pid): server}``: the preloaded forkservers started with a given ``PYTHONHASHSEED``, one per seed per
#: process (:func:`hash_seeded_context`).
_seeded: dict = {}


class _SeededForkServer(multiprocessing.forkserver.ForkServer):
    """A preloaded forkserver of this process whose interpreter starts with ``PYTHONHASHSEED=seed``: every process
    forked from it shares that string-hash secret (which an interpreter fixes at its start: a forked process
    cannot change it)."""

    def __init__(self, seed: str):
        super().__init__()
        self.seed = seed
        self.set_forkserver_preload(FORKSERVER_PRELOAD)

    def ensure_running(self) -> None:
        with hash_seed_env(self.seed):
            super().ensure_running()


@contextlib.contextmanager
def hash_seed_env(seed: Optional[str]):
    """``PYTHONHASHSEED=seed`` in this process's environment while an interpreter starts (it inherits it), then as
    before; nothing where ``seed`` is None."""
    if seed is None:
        yield
        return
    saved = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = seed
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved


def hash_seeded_context(seed: str):
    """A ``multiprocessing`` context whose processes fork from a preloaded server started with
    ``PYTHONHASHSEED=seed`` (started at the first use, ended at this process's exit as the default one is). Each
    costs one interpreter importing torch and Lightning (about 5 s of CPU), once per seed per process."""
    key = (seed, os.getpid())
    if key not in _seeded:
        _seeded[key] = _SeededForkServer(seed)
        atexit.register(_stop_server, _seeded[key], os.getpid())
    return _SeededContext(seed)


class _SeededPopen(_ServerPopen):
    """Connects to the server of the process's hash seed."""

    def _server(self, process_obj):
        return _seeded[(process_obj._hash_seed, os.getpid())]


class _SeededProcess(multiprocessing.context.ForkServerProcess):
    _hash_seed = ""

    @staticmethod
    def _Popen(process_obj):
        return _SeededPopen(process_obj)


class _SeededContext(multiprocessing.context.ForkServerContext):
    def __init__(self, seed: str):
        self.seed = seed

    def Process(self, *args, **kwargs):  # noqa: N802 - multiprocessing's name
        process = _SeededProcess(*args, **kwargs)
        process._hash_seed = self.seed
        return process
