"""What a rank needs to know, and the defaults a world is launched with.

Everything here is plain data: it crosses the process boundary by pickling, so it must not hold
torch objects, open files or anything tied to the parent process.
"""

from __future__ import annotations

import dataclasses
import math
import os

#: Backends a world can be launched with. ``gloo`` runs on CPUs; ``nccl`` needs one CUDA device per rank.
BACKENDS = ("gloo", "nccl")

#: How rank processes are started. ``forkserver`` forks each rank from a server process that has
#: already imported torch and pytorch_lightning (fast); ``spawn`` starts a fresh interpreter per rank
#: (slow, the fidelity reference).
START_METHODS = ("forkserver", "spawn")

#: Largest world this launcher starts on one machine. Every rank is a full Python process holding
#: torch and Lightning (about 300 MB each); more than this is almost certainly a typo.
MAX_WORLD_SIZE = 64

#: Seconds a whole world may run before every rank is killed (``DDPPROBE_TIMEOUT``).
DEFAULT_TIMEOUT_S = 120.0

#: Share of the world timeout given to the process group (``DDPPROBE_PG_TIMEOUT`` sets it in seconds).
#: A collective that never completes then fails inside the rank with gloo's/NCCL's own error, which
#: the launcher reports, before the world timeout has to kill anything.
PG_TIMEOUT_SHARE = 0.5


def env_float(name: str, default: float) -> float:
    """Read a positive number of seconds from environment variable ``name``.

    Raises:
        ValueError: the variable is set but is not a positive number; the message names the variable.
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds; set it to e.g. {name}=60") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={raw!r} must be a positive, finite number of seconds")
    return value


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Who this process is in the world; the first argument every scenario receives.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of ranks in the process group.
        backend: ``"gloo"`` or ``"nccl"``.
        accelerator: the ``Trainer(accelerator=...)`` value matching the backend (``"cpu"`` or ``"gpu"``).
        pg_timeout: seconds a collective may block before the process group raises; pass it to
            ``DDPStrategy(timeout=...)`` (``ddpprobe.probes.ddp_trainer`` does).
        world_dir: absolute path of the world's scratch folder, shared by all ranks.
        rank_dir: absolute path of this rank's working directory (``world_dir/rank<r>``); the rank
            starts with it as its current directory, so Lightning's default log folders land there.
        local_rank: rank on this node (equal to ``rank`` in a world ddpprobe launched, which is one node).
        node_rank: index of this rank's node (0 in a launched world).
        num_nodes: number of nodes; ``world_size // num_nodes`` ranks run on each. Pass
            ``Trainer(devices=info.devices, num_nodes=info.num_nodes)`` (``ddp_trainer`` does).
    """

    rank: int
    world_size: int
    backend: str
    accelerator: str
    pg_timeout: float
    world_dir: str
    rank_dir: str
    local_rank: int
    node_rank: int
    num_nodes: int

    @property
    def devices(self) -> int:
        """Ranks (devices) per node: the ``Trainer(devices=...)`` value."""
        return self.world_size // self.num_nodes


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything a rank process needs to run one scenario (private)."""

    scenario_ref: str  # "module:qualname"
    params: dict
    world_size: int
    backend: str
    pg_timeout: float
    world_dir: str
    master_port: int
    extra_env: dict
    keep_cluster_env: bool
    #: The launcher's ``os.environ`` when ``run_world`` was called. A forked rank inherits the
    #: forkserver's environment, frozen when the server started; the rank replaces it with this, so a
    #: variable set (or removed) in the launcher later reaches the ranks as it would with ``spawn``.
    parent_env: dict = dataclasses.field(default_factory=dict)
