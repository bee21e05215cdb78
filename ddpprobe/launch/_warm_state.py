"""Process-wide settings a scenario may change, as one table of ``(name, snapshot, restore)``: a warm rank
(ddpprobe/launch/_warm_rank.py) takes every snapshot once, before its first scenario, and restores each one
before every later scenario, so the next scenario starts with the settings of a freshly forked rank.

``snapshot()`` returns the value; ``restore(value)`` puts it back (and does nothing when it is already so).
What no entry here can restore: a class or module attribute of a library that a scenario replaced (other
than the functions of ``torch.distributed`` and ``torch.distributed.distributed_c10d``), e.g. a method
added to ``LightningModule``; a fact must not change one (docs/worlds.md, "Warm worlds").
"""

from __future__ import annotations

import contextlib
import decimal
import gc
import os
import socket
import sys
import types
import warnings

#: Autocast is a flag per device type; these are the ones a CPU or CUDA scenario turns on.
_AUTOCAST_DEVICES = ("cpu", "cuda")


def _dist_modules() -> list:
    import torch.distributed
    import torch.distributed.distributed_c10d

    return [torch.distributed, torch.distributed.distributed_c10d]


def _dist_functions() -> list:
    """Every public function attribute of ``torch.distributed`` and its ``distributed_c10d``, as
    ``(module, name, function)``: a scenario that wraps ``all_reduce`` (fault injection) and does not undo it
    would change every later scenario's collectives."""
    kinds = (types.FunctionType, types.BuiltinFunctionType)
    return [
        (module, name, value)
        for module in _dist_modules()
        for name, value in list(vars(module).items())
        if not name.startswith("_") and isinstance(value, kinds)
    ]


def _restore_dist_functions(saved: list) -> None:
    for module, name, function in saved:
        if getattr(module, name, None) is not function:
            setattr(module, name, function)


def _open_fds() -> set:
    """The descriptors open now (the listing's own descriptor, closed once listed, left out)."""
    return {fd for fd in map(int, os.listdir("/proc/self/fd")) if _is_open(fd)}


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _close_new_fds(saved: set, keep: frozenset = frozenset()) -> None:
    """Close every file descriptor opened since ``saved`` was taken, except ``keep`` (the rank's stack file
    of this scenario). The rank's own pipes and sockets to the launcher were open at the snapshot."""
    for fd in sorted(_open_fds() - saved - keep):
        try:
            os.close(fd)
        except OSError:
            pass


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _default_device():
    import torch

    return torch.get_default_device()


def _set_default_device(device) -> None:
    import torch

    if torch.get_default_device() != device:
        # None drops torch's default-device mode, as a fresh interpreter runs without one.
        torch.set_default_device(None if device.type == "cpu" else device)


def _torch_print_options() -> dict:
    import torch

    return dict(vars(torch._tensor_str.PRINT_OPTS))


def _set_torch_print_options(options: dict) -> None:
    import torch

    vars(torch._tensor_str.PRINT_OPTS).update(options)


def _numpy():
    import numpy

    return numpy


def _tf32() -> tuple:
    import torch

    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def _set_tf32(flags: tuple) -> None:
    import torch

    if _tf32() != flags:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def _autocast() -> dict:
    import torch

    return {device: torch.is_autocast_enabled(device) for device in _AUTOCAST_DEVICES}


def _set_autocast(flags: dict) -> None:
    import torch

    for device, enabled in flags.items():
        if torch.is_autocast_enabled(device) != enabled:
            torch.set_autocast_enabled(device, enabled)


def _sharing_strategy() -> str:
    import torch.multiprocessing

    return torch.multiprocessing.get_sharing_strategy()


def _set_sharing_strategy(strategy: str) -> None:
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy(strategy)


def _dynamo_config() -> dict:
    import torch._dynamo.config

    return torch._dynamo.config.get_config_copy()


def _set_dynamo_config(saved: dict) -> None:
    import torch._dynamo.config

    config = torch._dynamo.config
    for name, value in saved.items():
        if getattr(config, name, value) != value:
            setattr(config, name, value)


def _set_warn_always(enabled: bool) -> None:
    import torch

    torch.set_warn_always(enabled)


def _warn_always() -> bool:
    import torch

    return torch.is_warn_always_enabled()


def _set_gc(enabled: bool) -> None:
    gc.enable() if enabled else gc.disable()


#: (name, snapshot, restore): each a setting of the process a scenario may change, put back before the next.
#: The file-descriptor entry comes last: restores above may not open one, it closes what scenarios left.
STATE = [
    ("torch.distributed functions", _dist_functions, _restore_dist_functions),
    ("torch.set_default_device", _default_device, _set_default_device),
    ("torch.set_printoptions", _torch_print_options, _set_torch_print_options),
    ("numpy.set_printoptions", lambda: _numpy().get_printoptions(), lambda o: _numpy().set_printoptions(**o)),
    ("numpy.seterr", lambda: _numpy().geterr(), lambda e: _numpy().seterr(**e)),
    ("torch.set_warn_always", _warn_always, _set_warn_always),
    ("torch.backends allow_tf32 (cudnn, cuda.matmul)", _tf32, _set_tf32),
    ("torch.set_autocast_enabled", _autocast, _set_autocast),
    ("torch.multiprocessing sharing strategy", _sharing_strategy, _set_sharing_strategy),
    ("torch._dynamo.config", _dynamo_config, _set_dynamo_config),
    ("os.umask", _umask, os.umask),
    ("sys.setrecursionlimit", sys.getrecursionlimit, sys.setrecursionlimit),
    ("decimal context", lambda: decimal.getcontext().copy(), lambda c: decimal.setcontext(c.copy())),
    ("socket.setdefaulttimeout", socket.getdefaulttimeout, socket.setdefaulttimeout),
    ("gc.enable/gc.disable", gc.isenabled, _set_gc),
    ("open file descriptors", _open_fds, _close_new_fds),
]


def snapshot() -> dict:
    """Every entry of ``STATE`` taken now: ``{name: value}``."""
    with quiet():
        return {name: take() for name, take, _ in STATE}


def restore(saved: dict, keep_fds: frozenset = frozenset()) -> None:
    """Put back every entry of ``saved`` (from :func:`snapshot`); ``keep_fds``: descriptors opened since the
    snapshot that belong to the rank (its stack file), left open."""
    with quiet():
        for name, _, put in STATE:
            if name == "open file descriptors":
                put(saved[name], keep_fds)
            else:
                put(saved[name])


@contextlib.contextmanager
def quiet():
    """No warning from reading or setting these (deprecated ``torch._dynamo.config`` names, the deprecated
    ``torch.distributed.reduce_op``): it would land in the next scenario's stderr, where a fresh rank has none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
