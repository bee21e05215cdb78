"""NCCL, the GPU backend: what differs from gloo. These facts run only with ``--backend nccl`` on a
machine with at least two CUDA devices (``run_if(min_gpus=2, backend="nccl")``); elsewhere they skip with
that reason. Ranks are spawned, never forked, so no process that touched CUDA is forked.

NCCL reduces CUDA tensors only: the default process group has no backend for CPU tensors
(torch/distributed/distributed_c10d.py, ``ProcessGroup`` device-type dispatch). ``ReduceOp.AVG`` is
NCCL's ``ncclAvg`` (NCCL >= 2.10), which on integer types divides the sum by the world size in integer
arithmetic (NCCL's ``FuncSumPostDiv``); gloo has no AVG at all. A collective that only some ranks enter
never completes; with ``TORCH_NCCL_BLOCKING_WAIT=1`` (set by the launcher for nccl worlds) it raises at
the process-group timeout instead of hanging.
"""

import time

import pytest

from ddpprobe import RankFailed, WorldTimeout
from ddpprobe.probes import nccl
from ddpprobe.runif import run_if
from tests.support import oracle

pytestmark = run_if(min_gpus=2, backend="nccl")


def test_a_cpu_tensor_all_reduced_over_nccl_fails_with_an_error_naming_the_device_type(run_world):
    """``dist.all_reduce`` of a CPU tensor in an NCCL process group raises on every rank, and the
    message names the CPU device type; the tensor is not silently reduced."""
    world = run_world(nccl.all_reduce_a_cpu_tensor, 2)

    for rec in world.records:
        assert rec["raised"] is not None and rec["value"] is None, rec
        assert "cpu" in rec["message"].lower(), rec["message"]


def test_nccl_average_of_an_integer_tensor_is_the_integer_division_of_the_sum(run_world, semantics):
    """``ReduceOp.AVG`` over int64 ``[1]`` and ``[2]`` gives ``[1]`` (3 // 2) on both ranks, still int64:
    not 1.5, and not an error."""
    world = run_world(nccl.average_an_integer_tensor, 2)

    total = sum(r + 1 for r in range(2))
    oracle.assert_distinct(integer_division=total // 2, true_mean=total / 2)
    semantics.number("AVG of int64 [1] and [2]", (world.records[0]["value"] or [None])[0], vs=("true mean", total / 2))
    assert [rec["value"] for rec in world.records] == [[total // 2]] * 2, world.records
    assert {rec["dtype"] for rec in world.records} == {"torch.int64"}


def test_a_collective_only_rank_0_enters_is_reported_not_hung(run_world, semantics):
    """Rank 0 all-reduces while rank 1 waits in barriers: the world ends within its timeout with an
    error naming rank 0 (the process group's timeout, or the launcher's), not a hang."""
    timeout, pg_timeout = 30, 10
    start = time.monotonic()
    with pytest.raises((RankFailed, WorldTimeout)) as failure:
        run_world(nccl.all_reduce_on_rank_0_only, 2, timeout=timeout, pg_timeout=pg_timeout)
    semantics.number("seconds until reported", round(time.monotonic() - start, 1), vs=("world timeout", timeout))

    assert time.monotonic() - start < timeout + 15
    assert 0 in failure.value.ranks, str(failure.value)
