"""Collective hazards under NCCL, the GPU backend: a rank left alone in a collective waits instead of
crashing. Not yet run on a GPU: these facts state what NCCL is expected to do and run only with
``--backend nccl`` on a machine with at least two CUDA devices (``run_if(min_gpus=2, backend="nccl")``);
elsewhere they skip with that reason.

Under gloo, a rank left alone in an all_reduce or barrier fails at once with "Connection closed by
peer" when its peers finish and close their TCP connections (tests/facts/test_collective_hazards_keys.py,
..._torchmetrics.py). NCCL has no such connection to lose: the lonely collective is queued on the GPU
and never completes, so the rank waits until the process-group timeout; with
``TORCH_NCCL_BLOCKING_WAIT=1`` (set by the launcher for NCCL worlds) it then raises NCCL's own error, a
``DistBackendError`` "Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds
before timing out" (without blocking wait, NCCL's watchdog would abort the process instead). ddpprobe
reports ``RankFailed`` naming the ranks left alone, each with that timeout, after the process-group
timeout and before the world's timeout: the ranks' own errors, not the launcher ending a hung world.
The wrong-value hazards (keys named after the rank, keys in a different order) and their fixes do not
depend on the backend: those facts run under ``--backend nccl`` as they are.
Sources: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (``WorkNCCL::checkTimeout``, ``WorkNCCL::wait``);
lightning_fabric/utilities/distributed.py ``_sync_ddp``.
"""

import time

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hazards
from tests.facts import test_collective_hazards_keys as keys
from tests.support import gloo, oracle

pytestmark = run_if(min_gpus=2, backend="nccl")

PG_TIMEOUT_S, WORLD_TIMEOUT_S = 10, 40


@pytest.mark.parametrize("hook", keys.HOOKS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_nccl_a_key_only_some_ranks_log_leaves_those_ranks_waiting_until_the_process_group_timeout(
    run_world, world_size, hook
):
    """As under gloo, every rank but the last logs ``extra`` then ``shared`` with ``sync_dist=True`` and
    the last rank only ``shared``: the last rank finishes with ``shared`` holding the mean of the others'
    ``extra`` and its own ``shared``. The other ranks sync ``shared`` alone; under NCCL they wait until
    the process-group timeout (not a crash at once) and raise NCCL's timeout error, and ddpprobe reports
    exactly those ranks, before the world's timeout."""
    last = world_size - 1
    plan = [
        ([["extra", keys._value(r, 0)]] if r != last else []) + [["shared", keys._value(r, 1)]]
        for r in range(world_size)
    ]
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        keys._run(run_world, world_size, hook, plan, timeout=WORLD_TIMEOUT_S, pg_timeout=PG_TIMEOUT_S)
    elapsed = time.monotonic() - start

    err = failure.value
    expected, left_alone = oracle.paired_sync_dist_means(keys._synced(world_size, hook, plan))
    assert sorted(err.ranks) == left_alone, f"{err.ranks}\n{err}"
    for rank in left_alone:
        assert gloo.error_kind(err.rank_errors[rank]) == gloo.TIMED_OUT, err.rank_errors[rank]
    assert PG_TIMEOUT_S <= elapsed < WORLD_TIMEOUT_S, (
        f"reported after {elapsed:.1f}s; expected at the {PG_TIMEOUT_S}s process-group timeout (a wait, "
        f"not a crash at once), before the {WORLD_TIMEOUT_S}s world timeout (not the launcher ending a hang)"
    )
    survivor = err.records[last]
    assert survivor is not None and keys._same([survivor["callback_metrics"]], [expected[last]]), survivor


@pytest.mark.parametrize("world_size", [2, 3])
def test_nccl_metric_compute_under_if_global_rank_0_leaves_rank_0_waiting_until_the_process_group_timeout(
    run_world, world_size
):
    """``if self.global_rank == 0: self.mean.compute()``: rank 0's state all_gather has no peers; under
    NCCL it waits until the process-group timeout and raises NCCL's timeout error, and ddpprobe reports
    rank 0 alone, before the world's timeout."""
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        run_world(
            hazards.metric_compute,
            world_size,
            where="rank0",
            n=7,
            batch_size=2,
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )
    elapsed = time.monotonic() - start

    err = failure.value
    assert err.ranks == [0], f"{err.ranks}\n{err}"
    assert gloo.error_kind(err.rank_errors[0]) == gloo.TIMED_OUT, err.rank_errors[0]
    assert PG_TIMEOUT_S <= elapsed < WORLD_TIMEOUT_S, (
        f"reported after {elapsed:.1f}s; expected at the {PG_TIMEOUT_S}s process-group timeout (a wait, "
        f"not a crash at once), before the {WORLD_TIMEOUT_S}s world timeout (not the launcher ending a hang)"
    )
