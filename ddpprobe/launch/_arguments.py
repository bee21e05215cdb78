"""Checking what a caller of ``run_world`` asked for, before any process starts.

Each check raises ``TypeError`` or ``ValueError`` (``RuntimeError`` when the machine lacks what was
asked for) with a message naming the bad value and the fix. The settings (backend, timeouts, start
method) are checked by ddpprobe/launch/_settings.py ``resolve_settings``.
"""

from __future__ import annotations

import inspect
import json
from typing import Callable

from ddpprobe.launch._message import find_unserialisable, resolve
from ddpprobe.launch._spec import MAX_WORLD_SIZE


def scenario_ref(scenario: Callable) -> str:
    if not inspect.isfunction(scenario):
        kind = (
            "a class"
            if inspect.isclass(scenario)
            else "a bound method"
            if inspect.ismethod(scenario)
            else "a builtin"
            if inspect.isbuiltin(scenario)
            else f"a {type(scenario).__name__}"
        )
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
        found = resolve(ref)
    except (ImportError, AttributeError) as exc:
        raise TypeError(f"scenario {ref} cannot be imported by name ({exc}); define it at module top level") from None
    if found is not scenario and getattr(found, "__wrapped__", None) is not scenario:
        raise TypeError(f"scenario {ref} resolves to a different object; define it once at module top level")
    return ref


def check_params(scenario: Callable, ref: str, params: dict) -> None:
    try:
        inspect.signature(scenario).bind(None, **params)
    except TypeError as exc:
        raise TypeError(f"scenario {ref} does not accept these parameters {sorted(params)}: {exc}") from None
    try:
        json.dumps(params)
    except (TypeError, ValueError):
        where, type_name = find_unserialisable(params, "params") or ("params", "?")
        raise TypeError(f"{where} is a {type_name}; scenario parameters must be JSON-like") from None


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__} {world_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size={world_size} is out of range; use 1 <= world_size <= {MAX_WORLD_SIZE}")
    return world_size


def cuda_device_count() -> int:
    """Number of CUDA devices torch sees (0 without CUDA). Does not initialise a CUDA context."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_devices(backend: str, ranks_here: int) -> None:
    """nccl needs one CUDA device per rank on this machine (``ranks_here`` ranks)."""
    if backend == "nccl":
        available = cuda_device_count()
        if available < ranks_here:
            raise RuntimeError(
                f"backend='nccl' needs one CUDA device per rank: world_size={ranks_here} but this "
                f"machine has {available} CUDA device(s); use backend='gloo' or a smaller world_size"
            )


#: Variables the launcher sets in every rank to describe the world (ddpprobe/launch/_rank.py): ``env`` may
#: not replace them, since a replaced one gives a rank another identity (two ranks 0 wait for each other
#: until the process-group timeout) or makes gloo listen on another interface than loopback.
LAUNCHER_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "TORCHELASTIC_USE_AGENT_STORE",
    "GLOO_SOCKET_IFNAME",
)


def check_env(env: dict) -> dict:
    clash = sorted(set(env) & set(LAUNCHER_ENV))
    if clash:
        raise ValueError(
            f"env sets {', '.join(f'{k}={env[k]!r}' for k in clash)}, which the launcher sets in every rank to "
            "describe the world (ranks, nodes, the loopback rendezvous); remove it from env and use run_world's "
            "world_size and num_nodes instead"
        )
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {key!r}: {value!r}")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(
                f"env entry {key!r}: {value!r} is not a valid environment variable "
                "(a name must be non-empty without '=' or NUL, a value without NUL)"
            )
    return env


def check_num_nodes(num_nodes, world_size: int, backend: str) -> int:
    """``num_nodes`` must divide ``world_size``; forked "nodes" share this host, so only with gloo."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int):
        raise TypeError(f"num_nodes must be an int, got {type(num_nodes).__name__} {num_nodes!r}")
    if num_nodes < 1 or world_size % num_nodes:
        divisors = ", ".join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)
        raise ValueError(
            f"num_nodes={num_nodes} does not divide world_size={world_size} into equal nodes; give a "
            f"num_nodes that divides it (e.g. {divisors})"
        )
    if num_nodes > 1 and backend == "nccl":
        raise ValueError(
            f"num_nodes={num_nodes} with backend='nccl': the nodes of a launched world are forked on this host, "
            "so ranks of different nodes would share cuda:LOCAL_RANK; use backend='gloo', or torchrun/srun "
            "across real nodes"
        )
    return num_nodes
