"""What a rank needs to know, and the defaults a world is launched with.

Everything here is plain data: it crosses the process boundary by pickling, so it must not hold
torch objects, open files or anything tied to the parent process.
"""

from __future__ import annotations

import dataclasses

#: Largest world this launcher starts on one machine. Every rank is a full Python process holding
#: torch and Lightning (about 300 MB each); more than this is almost certainly a typo.
MAX_WORLD_SIZE = 64


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
        local_rank: rank on this node, ``rank % devices`` (equal to ``rank`` in a one-node world).
        node_rank: index of this rank's node, ``rank // devices`` (0 in a one-node world).
        num_nodes: number of nodes; ``world_size // num_nodes`` ranks run on each (a launched world
            with ``run_world(num_nodes=N)`` makes N "nodes" of forked ranks on this host). Pass
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
    num_nodes: int
    extra_env: dict
    keep_cluster_env: bool
    #: The launcher's ``os.environ`` when ``run_world`` was called. A forked rank inherits the
    #: forkserver's environment, frozen when the server started; the rank replaces it with this, so a
    #: variable set (or removed) in the launcher later reaches the ranks as it would with ``spawn``.
    parent_env: dict = dataclasses.field(default_factory=dict)

    @property
    def devices(self) -> int:
        """Ranks per node."""
        return self.world_size // self.num_nodes

    def rank_info(self, rank: int, rank_dir: str) -> RankInfo:
        """The ``RankInfo`` of global rank ``rank``: node ``rank // devices``, local rank ``rank % devices``."""
        return RankInfo(
            rank=rank,
            world_size=self.world_size,
            backend=self.backend,
            accelerator=accelerator(self.backend),
            pg_timeout=self.pg_timeout,
            world_dir=self.world_dir,
            rank_dir=rank_dir,
            local_rank=rank % self.devices,
            node_rank=rank // self.devices,
            num_nodes=self.num_nodes,
        )


def accelerator(backend: str) -> str:
    """The ``Trainer(accelerator=...)`` value for a backend: ``"gpu"`` for nccl, else ``"cpu"``."""
    return "gpu" if backend == "nccl" else "cpu"
