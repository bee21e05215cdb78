"""Room 1 — launch a world: W fresh rank processes joined in one process group, and their records.

Public names are re-exported from :mod:`ddpprobe`; everything prefixed with ``_`` is private.
"""

from ddpprobe.launch._external import ExternalWorld, external_world
from ddpprobe.launch._spec import BACKENDS, DEFAULT_TIMEOUT_S, MAX_WORLD_SIZE, START_METHODS, RankInfo
from ddpprobe.launch._world import (
    RankDied,
    RankFailed,
    RankResult,
    WorldError,
    WorldResult,
    WorldTimeout,
    run_world,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "ExternalWorld",
    "MAX_WORLD_SIZE",
    "START_METHODS",
    "RankDied",
    "RankFailed",
    "RankInfo",
    "RankResult",
    "WorldError",
    "WorldResult",
    "WorldTimeout",
    "external_world",
    "run_world",
]
