"""The settings a world is launched with, resolved in one place: argument > environment > default.

``run_world``, the pytest plugin and ``python -m ddpprobe.launch`` all call :func:`resolve_settings`,
so a setting means the same everywhere and a bad one is refused with the same message.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping, Optional

#: Backends a world can be launched with. ``gloo`` runs on CPUs; ``nccl`` needs one CUDA device per rank.
BACKENDS = ("gloo", "nccl")

#: How rank processes are started. ``forkserver`` forks each rank from a server process that has
#: already imported torch and pytorch_lightning (fast); ``spawn`` starts a fresh interpreter per rank
#: (slow, the fidelity reference).
START_METHODS = ("forkserver", "spawn")

#: Seconds a whole world may run before every rank is killed (``DDPPROBE_TIMEOUT``).
DEFAULT_TIMEOUT_S = 120.0

#: Share of the world timeout given to the process group (``DDPPROBE_PG_TIMEOUT`` sets it in seconds).
#: A collective that never completes then fails inside the rank with gloo's/NCCL's own error, which
#: the launcher reports, before the world timeout has to kill anything.
PG_TIMEOUT_SHARE = 0.5

#: Accepted range of ``timeout`` and ``pg_timeout``, in seconds.
MIN_SECONDS = 0.01
MAX_SECONDS = 7 * 24 * 3600.0

#: The environment variable each setting is read from when no argument gives it.
ENVIRONMENT = {
    "backend": "DDPPROBE_BACKEND",
    "timeout": "DDPPROBE_TIMEOUT",
    "pg_timeout": "DDPPROBE_PG_TIMEOUT",
    "start_method": "DDPPROBE_START_METHOD",
}


class SettingsError(ValueError):
    """A setting is unusable. The message names the value, where it came from (an argument or an
    environment variable) and what to give instead."""


class SettingsTypeError(SettingsError, TypeError):
    """A setting given as an argument has the wrong type (e.g. a string of seconds)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Resolved launch settings.

    Attributes:
        backend: ``"gloo"`` or ``"nccl"``.
        timeout: seconds a whole world may run.
        pg_timeout: seconds a collective may block before the process group raises; below ``timeout``.
        start_method: ``"forkserver"`` or ``"spawn"``.
    """

    backend: str
    timeout: float
    pg_timeout: float
    start_method: str


def resolve_settings(
    backend: Optional[str] = None,
    timeout: Optional[float] = None,
    pg_timeout: Optional[float] = None,
    start_method: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    names: Optional[Mapping[str, str]] = None,
) -> Settings:
    """Resolve each setting from its argument, else its environment variable, else the default.

    ========================  ===========================  ==============================================
    setting                   environment variable         default
    ========================  ===========================  ==============================================
    ``backend``               ``DDPPROBE_BACKEND``         ``"gloo"``
    ``timeout`` (s)           ``DDPPROBE_TIMEOUT``         120
    ``pg_timeout`` (s)        ``DDPPROBE_PG_TIMEOUT``      half of ``timeout``
    ``start_method``          ``DDPPROBE_START_METHOD``    ``"spawn"`` for nccl (no process that touched
                                                           CUDA is forked), else ``"forkserver"``
    ========================  ===========================  ==============================================

    An empty environment variable counts as unset.

    Args:
        environ: the environment to read (default ``os.environ``).
        names: how to call each argument in an error message, e.g. ``{"timeout": "--world-timeout"}``
            for a command-line option (default: ``"timeout="`` style argument names).

    Returns:
        :class:`Settings`.

    Raises:
        SettingsError: a value is unknown, not a number of seconds from 0.01 to 604800, or ``pg_timeout``
            is not below ``timeout``; the message names the value, its source and the fix.
            ``SettingsTypeError`` (also a ``TypeError``) when an argument has the wrong type.
    """
    env = os.environ if environ is None else environ
    names = dict(names or {})

    def source(name: str, given) -> tuple:
        """(value, where it came from) for one setting, or (None, None) when neither gives it."""
        if given is not None:
            return given, names.get(name, f"argument {name}")
        raw = env.get(ENVIRONMENT[name])
        if raw:
            return raw, f"environment variable {ENVIRONMENT[name]}"
        return None, None

    backend_value, where = source("backend", backend)
    backend_value = _choice("backend", backend_value or "gloo", BACKENDS, where)

    timeout_value, where = source("timeout", timeout)
    timeout_value = DEFAULT_TIMEOUT_S if timeout_value is None else _seconds("timeout", timeout_value, where)
    timeout_where = where or "the default"

    pg_value, where = source("pg_timeout", pg_timeout)
    pg_value = timeout_value * PG_TIMEOUT_SHARE if pg_value is None else _seconds("pg_timeout", pg_value, where)
    if pg_value >= timeout_value:
        raise SettingsError(
            f"pg_timeout={pg_value:g}s ({where or 'half the world timeout'}) must be shorter than "
            f"timeout={timeout_value:g}s ({timeout_where}), so a stuck collective is reported by the process "
            "group before the world is killed; lower pg_timeout or raise timeout"
        )

    method, where = source("start_method", start_method)
    method = _choice(
        "start_method", method or ("spawn" if backend_value == "nccl" else "forkserver"), START_METHODS, where
    )
    return Settings(backend=backend_value, timeout=timeout_value, pg_timeout=pg_value, start_method=method)


def _choice(name: str, value, allowed: tuple, where: Optional[str]) -> str:
    if value not in allowed:
        raise SettingsError(f"{name}={value!r} ({where}) is not supported; use one of {', '.join(allowed)}")
    return value


def _seconds(name: str, value, where: str) -> float:
    """A number of seconds from an argument (a number) or an environment variable (text)."""
    if isinstance(value, str) and where.startswith("environment"):
        try:
            number = float(value)
        except ValueError:
            raise SettingsError(f"{name}={value!r} ({where}) is not a number of seconds; set it to e.g. 60") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsTypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r} ({where})")
    else:
        number = value
    if not (math.isfinite(number) and MIN_SECONDS <= number <= MAX_SECONDS):  # also rejects nan
        raise SettingsError(
            f"{name}={value!r} ({where}) must be a number of seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g}"
        )
    return float(number)
