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

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import nccl
from tests.support import gloo, oracle

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


def test_a_collective_only_rank_0_enters_raises_nccl_s_timeout_on_rank_0_before_the_world_timeout(run_world, semantics):
    """Rank 0 all-reduces while rank 1 stays in the world outside any collective
    (``nccl.all_reduce_on_rank_0_only``). NCCL has no connection to lose, so rank 0 waits until the
    process-group timeout; with ``TORCH_NCCL_BLOCKING_WAIT=1`` it then raises NCCL's own error, a
    ``DistBackendError`` "Watchdog caught collective operation timeout: WorkNCCL(...) ran for N
    milliseconds before timing out" (ProcessGroupNCCL.cpp ``WorkNCCL::checkTimeout``). ddpprobe reports
    ``RankFailed`` naming rank 0 alone, with that timeout, after the process-group timeout and before
    the world's timeout: the rank's own error, not the launcher ending a hung world."""
    timeout, pg_timeout = 30, 10
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        run_world(nccl.all_reduce_on_rank_0_only, 2, timeout=timeout, pg_timeout=pg_timeout)
    elapsed = time.monotonic() - start
    semantics.number("seconds until reported", round(elapsed, 1), vs=("world timeout", timeout))

    err = failure.value
    assert err.ranks == [0], f"{err.ranks}\n{err}"
    assert gloo.error_kind(err.rank_errors[0]) == gloo.TIMED_OUT, err.rank_errors[0]
    assert pg_timeout <= elapsed < timeout, (
        f"reported after {elapsed:.1f}s; rank 0 should raise at the {pg_timeout}s process-group timeout, "
        f"before the {timeout}s world timeout"
    )
