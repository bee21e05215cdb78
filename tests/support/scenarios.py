"""Scenarios for the launcher's own tests: well-behaved ones and deliberately broken ones.

They live in the test tree to show that a scenario can be any importable top-level function, not only
one from ``ddpprobe.probes``.
"""

import os
import signal
import time

import torch
import torch.distributed as dist


def _init(info):
    if info.backend == "nccl":  # NCCL reduces CUDA tensors only: make new tensors land on this rank's GPU
        torch.cuda.set_device(info.local_rank)
        torch.set_default_device(f"cuda:{info.local_rank}")
    dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)


def identity(info, tag="x"):
    """Return who this rank is and what its environment says, after one all_reduce of the ranks."""
    _init(info)
    total = torch.tensor([float(info.rank)])
    dist.all_reduce(total)
    return {
        "rank": info.rank,
        "world_size": info.world_size,
        "tag": tag,
        "rank_sum": total.item(),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "env": {k: os.environ.get(k) for k in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "SLURM_NTASKS")},
    }


def raise_on(info, rank=1):
    """Rank ``rank`` raises ValueError; the others block in an all_reduce waiting for it."""
    _init(info)
    if info.rank == rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    dist.all_reduce(torch.zeros(1))
    return {}


def hang_on(info, rank=1):
    """Rank ``rank`` sleeps forever (outside any collective); the others block in an all_reduce."""
    _init(info)
    if info.rank == rank:
        while True:
            time.sleep(0.05)
    dist.all_reduce(torch.zeros(1))
    return {}


def exit_on(info, rank=1, how="exit3"):
    """Rank ``rank`` ends without a Python exception: ``os._exit(3)``, SIGKILL or a segfault."""
    _init(info)
    if info.rank == rank:
        if how == "exit3":
            os._exit(3)
        elif how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "segfault":
            import ctypes

            ctypes.string_at(0)
    dist.all_reduce(torch.zeros(1))
    return {}


def unserialisable(info):
    """Return a record holding a tensor (JSON cannot)."""
    return {"ok": 1, "nested": {"value": torch.zeros(2)}}


def wrong_collective_on(info, rank=0):
    """Only rank ``rank`` enters an all_reduce: the collective mismatch users create with ``if rank == 0``."""
    _init(info)
    if info.rank == rank:
        dist.all_reduce(torch.zeros(1))
    else:
        time.sleep(3600)
    return {}


def odd_files(info):
    """Leave a FIFO, a link to /dev/zero, a dangling link and a regular file in the rank's folder."""
    os.mkfifo("fifo")
    os.symlink("/dev/zero", "zero")
    os.symlink("/nonexistent", "dangling")
    with open("plain.txt", "w") as fh:
        fh.write("text")
    return {}


def dataloader_workers(info, num_workers=2):
    """Iterate a DataLoader with worker processes (children of the rank)."""
    from torch.utils.data import DataLoader

    return {"batches": [b.tolist() for b in DataLoader(list(range(4)), batch_size=2, num_workers=num_workers)]}


def leave_a_child(info, pid_file="child.pid"):
    """Start a long-running child process and return without waiting for it."""
    import subprocess

    child = subprocess.Popen(["sleep", "300"])
    return {"child_pid": child.pid}
