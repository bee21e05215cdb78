"""A correct module runs unchanged under ``CollectiveGuard``: the fixed twin of every hazard in
test_guard_hazards.py gives the same record with the guard as without it.

"The same" is every value the run produced on every rank (``callback_metrics``, what ``compute()``
returned, the checkpoint files, the weights after ``fit`` ...) and how far the default process group's
sequence number moved in the run (``pg_seq``: how many collectives the backend ran), so the guard added
no collective of its own and removed none. ``checks`` (the guard's count of passed checks) is the one field that
differs: a number above 0 with the guard, None without. Scenarios: tests/support/guarded.py.

Each is a live claim (a real world, unchanged by the guard), two worlds a test: one pair runs in the default run
(the same keys in the same order at W = 2, logged in ``validation_step``), the others in the integration run
(``pytest -m integration``).
"""

import pytest

from ddpprobe.probes import log_spec
from tests.support import guarded, oracle

#: Uneven-shard twins cut to equal shards (``IdIterable(shard="rank_equal")``, tests/facts/test_uneven_shards.py).
N_UNEVEN = 5


def _twins(run_world, scenario, world_size: int, **params) -> tuple:
    """Records of ``scenario`` without and with the guard, after checking they agree but for ``checks``."""
    plain = run_world(scenario, world_size, guard=False, **params).records
    guarded_ = run_world(scenario, world_size, guard=True, **params).records
    assert [r["checks"] for r in plain] == [None] * world_size
    assert all(r["checks"] > 0 for r in guarded_), oracle.side_by_side("checks", [r["checks"] for r in guarded_])
    assert all(isinstance(r["pg_seq"], int) and r["pg_seq"] > 0 for r in plain), [r["pg_seq"] for r in plain]
    without = [{k: v for k, v in r.items() if k != "checks"} for r in plain]
    with_guard = [{k: v for k, v in r.items() if k != "checks"} for r in guarded_]
    assert with_guard == without, (
        oracle.side_by_side("with the guard", with_guard) + "\n" + oracle.side_by_side("without", without)
    )
    return without, with_guard


@pytest.mark.parametrize(
    "world_size, hook",
    [
        (2, "validation_step"),
        pytest.param(3, "validation_step", marks=pytest.mark.integration),
        pytest.param(2, "on_validation_epoch_end", marks=pytest.mark.integration),
        pytest.param(3, "on_validation_epoch_end", marks=pytest.mark.integration),
    ],
)
def test_the_same_keys_in_the_same_order_give_the_same_values_and_collectives_with_the_guard(
    run_world, world_size, hook
):
    """Every rank logs ``a`` then ``b`` with ``sync_dist=True`` (the fix for keys per rank, their order
    and a key only some ranks log): the guard passes every check and each key holds the same all-rank
    mean as without it."""
    plan = [[["a", float(2 ** (2 * r))], ["b", float(2 ** (2 * r + 1))]] for r in range(world_size)]
    where = "step_plan" if hook == "validation_step" else "epoch_end_plan"
    without, _ = _twins(run_world, guarded.log_keys, world_size, n=3 * world_size, batch_size=2, **{where: plan})
    assert all(set(r["callback_metrics"]) == {"a", "b"} for r in without), without


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_metric_compute_on_every_rank_gives_the_same_value_and_collectives_with_the_guard(run_world, world_size):
    """``compute()`` on every rank, printed on rank 0 only (the fix for ``compute()`` on rank 0): the
    same whole-set mean on every rank with the guard as without it."""
    without, _ = _twins(run_world, guarded.metric_compute, world_size, where="every_rank", n=7, batch_size=2)
    assert all(r["computed"] is not None for r in without), without


@pytest.mark.integration
@pytest.mark.parametrize("callback", ["checkpoint", "early_stopping"])
def test_every_rank_logging_the_monitored_key_gives_the_same_checkpoints_and_stop_with_the_guard(run_world, callback):
    """The monitored key logged on every rank (the fix for a callback monitoring a rank-0-only key):
    the same best checkpoint, ``best_model_score``, stopped epoch and epochs run with the guard as
    without it, ``reduce_boolean_decision`` included in the checks."""
    values = [5.0, 3.0, 4.0] if callback == "checkpoint" else [5.0, 6.0, 4.0, 3.0]
    without, _ = _twins(run_world, guarded.monitor_rank0_key, 2, callback=callback, values=values, every_rank=True)
    if callback == "checkpoint":  # the callbacks did their work in both runs (the facts prove how)
        assert [r["best_model_score"] for r in without] == [min(values)] * 2, without
    else:
        stop = oracle.first_epoch_where(
            [oracle.early_stopping_local_decisions(values, mode="min", patience=1)] * 2, any
        )
        assert [r["stopped_epoch"] for r in without] == [stop] * 2, without


@pytest.mark.integration
@pytest.mark.parametrize("collectives", [True, False], ids=["every_collective", "hook_boundaries_only"])
def test_equal_batch_counts_give_the_same_fit_with_the_guard(run_world, collectives):
    """Shards cut to equal batch counts (the fix for uneven batches) with a synced epoch log: the same
    optimizer steps, weights and synced mean with the guard, in either mode, as without it."""
    plan = [log_spec("v", on_step=False, on_epoch=True, sync_dist=True)]
    without, _ = _twins(
        run_world, guarded.fit_iterable, 2, n=N_UNEVEN, shard="rank_equal", plan=plan, collectives=collectives
    )
    assert [r["global_step"] for r in without] == [N_UNEVEN // 2] * 2, without


@pytest.mark.integration
def test_equal_batch_counts_give_the_same_step_level_synced_log_in_validate_with_the_guard(run_world):
    """A step-level synced log over equal shards (the fix for uneven batches in validate): the same
    ``v_step`` and ``v_epoch`` with the guard as without it."""
    plan = [log_spec("v", on_step=True, sync_dist=True)]
    without, _ = _twins(run_world, guarded.validate_iterable, 2, n=N_UNEVEN, shard="rank_equal", plan=plan)
    assert all({"v_step", "v_epoch"} <= set(r["logged_metrics"]) for r in without), without


@pytest.mark.integration
def test_pad_gather_trim_gives_the_same_rows_with_the_guard(run_world):
    """Rows of different first dimensions padded to one shape, gathered and trimmed (the fix for an
    all_gather of different shapes, ``collectives.all_gather_uneven``): the same rows on every rank with
    the guard as without it."""
    without, _ = _twins(run_world, guarded.gather_rows, 2, action="pad_trim")
    assert all(len(r["result"]["gathered"]) == 2 for r in without), without
