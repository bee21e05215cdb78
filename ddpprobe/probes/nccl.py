"""NCCL-only probes: what the GPU backend does differently from gloo. Every scenario here needs
``backend="nccl"`` and one CUDA device per rank (``cuda:LOCAL_RANK``)."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from ddpprobe.launch import RankInfo


def _init_nccl(info: RankInfo) -> torch.device:
    device = torch.device("cuda", info.local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=info.pg_timeout),
        device_id=device,
    )
    return device


def all_reduce_a_cpu_tensor(info: RankInfo) -> dict:
    """Scenario: all_reduce a CPU tensor in an NCCL process group.

    Record keys: ``raised`` (exception class name or None), ``message``, ``value`` (the result, if any).
    """
    _init_nccl(info)
    tensor = torch.ones(1)
    try:
        dist.all_reduce(tensor)
    except Exception as exc:  # noqa: BLE001 - the error is the record
        return {"raised": type(exc).__name__, "message": str(exc), "value": None}
    return {"raised": None, "message": None, "value": tensor.tolist()}


def average_an_integer_tensor(info: RankInfo) -> dict:
    """Scenario: ``all_reduce(op=ReduceOp.AVG)`` of the int64 tensor ``[rank + 1]`` on the rank's GPU.

    Record keys: ``raised``, ``message``, ``value`` (the averaged tensor as a list), ``dtype``.
    """
    device = _init_nccl(info)
    tensor = torch.tensor([info.rank + 1], dtype=torch.int64, device=device)
    try:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the error is the record
        return {"raised": type(exc).__name__, "message": str(exc), "value": None, "dtype": None}
    return {"raised": None, "message": None, "value": tensor.tolist(), "dtype": str(tensor.dtype)}


def all_reduce_on_rank_0_only(info: RankInfo) -> dict:
    """Scenario: only rank 0 enters an all_reduce (the ``if rank == 0`` mismatch); the others stay in
    the world without entering any collective (they sleep ``3 * pg_timeout`` seconds), so nothing pairs
    with it. A ``dist.barrier()`` on the others would: NCCL's barrier is an all_reduce of one float32
    (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp ``ProcessGroupNCCL::barrier``), the same shape as
    rank 0's, and NCCL pairs collectives by order alone."""
    device = _init_nccl(info)
    if info.rank == 0:
        dist.all_reduce(torch.ones(1, device=device))
        torch.cuda.synchronize()
    else:
        time.sleep(3 * info.pg_timeout)
    return {}
