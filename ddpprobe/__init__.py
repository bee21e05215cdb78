"""ddpprobe: executable answers to "what does PyTorch Lightning DDP synchronize, and what does it log?".

Three rooms:

- :mod:`ddpprobe.launch` starts a world of rank processes and returns what each rank recorded;
- :mod:`ddpprobe.probes` holds the LightningModules and scenarios that record what a rank saw;
- ``tests/`` holds the facts: pytest cases that assert on those records.
"""

from ddpprobe.launch import (
    RankDied,
    RankFailed,
    RankInfo,
    RankResult,
    WorldError,
    WorldResult,
    WorldTimeout,
    run_world,
)

__all__ = [
    "RankDied",
    "RankFailed",
    "RankInfo",
    "RankResult",
    "WorldError",
    "WorldResult",
    "WorldTimeout",
    "run_world",
]
