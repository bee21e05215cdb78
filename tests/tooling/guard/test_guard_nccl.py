"""``CollectiveGuard`` under NCCL, the GPU backend. The guard speaks only to the world's store, never
through the process group, so its checks are the same under NCCL as under gloo; what changes is what
it spares: under NCCL a rank left alone in a collective does not fail when its peers leave, it waits
until the process-group timeout (tests/facts/test_collective_hazards_nccl.py). These run only with
``--backend nccl`` on a machine with at least two CUDA devices (``run_if(min_gpus=2, backend="nccl")``)
and skip elsewhere with that reason. Scenarios: tests/support/guarded.py.
"""

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import log_spec
from tests.support import guarded, oracle
from tests.tooling.guard import test_guard_twins as twins

pytestmark = run_if(min_gpus=2, backend="nccl")

#: The process-group timeout and the world's (seconds): with the guard no rank waits for either.
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 20, 60
LIMITS = {"pg_timeout": PG_TIMEOUT_S, "timeout": WORLD_TIMEOUT_S}


def _types(err) -> list:
    return [err.exc_types.get(r) for r in range(len(err.pids))]


def test_nccl_a_key_only_some_ranks_log_raises_collective_mismatch_instead_of_waiting_for_the_timeout(run_world):
    """Rank 0 logs ``extra`` then ``shared``, rank 1 only ``shared``: under NCCL, without the guard, rank 0
    waits in the lonely sync until the process-group timeout. With it both ranks raise
    ``CollectiveMismatch`` at the first sync, before any NCCL timeout could be reached."""
    plan = [[["extra", 1.0], ["shared", 2.0]], [["shared", 3.0]]]
    with pytest.raises(RankFailed) as failure:
        run_world(guarded.log_keys, 2, n=6, batch_size=2, step_plan=plan, **LIMITS)

    err = failure.value
    assert _types(err) == ["CollectiveMismatch"] * 2, oracle.side_by_side("error type", _types(err))
    assert (
        "(self.log epoch sync of 'extra'" in err.rank_errors[0]
        and "(self.log epoch sync of 'shared'" in err.rank_errors[0]
    )


def test_nccl_uneven_batches_in_fit_raise_collective_mismatch_before_the_gradient_all_reduce(run_world):
    """Uneven shards in ``trainer.fit`` with a synced epoch log: under NCCL, without the guard, every rank
    waits until the process-group timeout. With it both ranks raise ``CollectiveMismatch`` at the start of
    the short rank's last batch, as under gloo."""
    plan = [log_spec("v", on_step=False, on_epoch=True, sync_dist=True)]
    with pytest.raises(RankFailed) as failure:
        run_world(guarded.fit_iterable, 2, n=5, shard="rank", plan=plan, **LIMITS)

    err = failure.value
    assert _types(err) == ["CollectiveMismatch"] * 2, oracle.side_by_side("error type", _types(err))
    assert "this rank's last batch" in err.rank_errors[0], err.rank_errors[0]


def test_nccl_the_same_keys_in_the_same_order_give_the_same_values_and_collectives_with_the_guard(run_world):
    """The fixed twin under NCCL: the same values and the same process-group sequence number with the
    guard as without it."""
    plan = [[["a", 1.0], ["b", 2.0]], [["a", 4.0], ["b", 8.0]]]
    twins._twins(run_world, guarded.log_keys, 2, n=6, batch_size=2, step_plan=plan)
