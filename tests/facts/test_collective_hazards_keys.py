"""Collective hazards in ``self.log(..., sync_dist=True)``: ranks that log different keys, or the same keys
in a different order.

A value logged with ``sync_dist=True`` is synced when the logger connector computes the epoch values:
``_ResultCollection.metrics`` walks this rank's keys in the order they were first logged
(``validation_step`` keys before ``on_validation_epoch_end`` keys) and ``_ResultMetric.compute`` syncs
each one; a mean (the default ``reduce_fx``) is two syncs, the weighted sum and then the batch-size
count, each a barrier plus an all_reduce (``_sync_ddp``). Nothing checks the key's *name*: the i-th
all_reduce on each rank is reduced with the i-th all_reduce on every other rank. So

- keys named after the rank (``f"loss_rank{rank}"``) finish without an error, and every rank's key holds
  the all-rank mean, not the rank's own value;
- the same keys in a different order finish without an error, with values swapped between keys;
- a key only some ranks log leaves those ranks alone in an all_reduce: they crash when the peers that
  finished close their connections (gloo), while the peers keep a *wrong* value (another key's values
  mixed into theirs) and report no error at all.

Here rank ``r`` logs constants chosen as powers of two (``2 ** (r * K + k)`` for its ``k``-th of ``K``
keys), so every possible pairing of the ranks' values gives a different mean
(``oracle.pairing_means`` + ``oracle.assert_distinct``), and the fact can say which value landed where.
The expected values come from ``oracle.paired_sync_dist_means`` (the rule above), the intended ones from
``oracle.sync_reduce``. The probe is ddpprobe/probes/hazards.py (``log_keys``).
Sources: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultCollection.metrics``,
``_ResultMetric.compute``, ``_Sync``; lightning_fabric/utilities/distributed.py ``_sync_ddp``.
"""

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hazards
from tests.support import gloo, oracle

HOOKS = ("validation_step", "on_validation_epoch_end")

#: Short limits for worlds that break: a process-group timeout and a world timeout, in seconds.
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 2, 20


def _value(rank: int, slot: int, slots: int = 2) -> float:
    """What rank ``rank`` logs under its ``slot``-th key: a power of two no other (rank, slot) shares."""
    return float(2 ** (rank * slots + slot))


def _sizes(world_size: int):
    """``n`` and ``batch_size``: 3 samples per rank in batches of 2 and 1 (no padding)."""
    return 3 * world_size, 2


def _run(run_world, world_size: int, hook: str, plan: list, **limits):
    n, batch_size = _sizes(world_size)
    where = "step_plan" if hook == "validation_step" else "epoch_end_plan"
    return run_world(hazards.log_keys, world_size, n=n, batch_size=batch_size, **{where: plan}, **limits)


def _counts(world_size: int, hook: str) -> list:
    """The batch-size count each rank accumulates per key: the samples in its ``DistributedSampler``
    shard for a ``validation_step`` key, 1 for a key logged once in ``on_validation_epoch_end``."""
    n, _ = _sizes(world_size)
    return [len(oracle.shard(n, world_size, r)) if hook == "validation_step" else 1 for r in range(world_size)]


def _synced(world_size: int, hook: str, plan: list) -> list:
    """``plan`` as ``oracle.paired_sync_dist_means`` wants it: ``(key, sum(value * batch_size), count)``."""
    counts = _counts(world_size, hook)
    return [[(key, value * counts[rank], counts[rank]) for key, value in keys] for rank, keys in enumerate(plan)]


def _same(got: list, expected: list) -> bool:
    """Per rank, the same keys and the same values up to float32 rounding (Lightning keeps float32)."""
    return len(got) == len(expected) and all(g == pytest.approx(e, rel=1e-6) for g, e in zip(got, expected))


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_key_named_after_the_rank_holds_the_all_rank_mean_not_the_ranks_own_value(
    run_world, semantics, world_size, hook
):
    """Rank ``r`` logs ``f"loss_rank{r}"`` with ``sync_dist=True`` (in ``validation_step`` or in
    ``on_validation_epoch_end``). Every rank makes the same two syncs under a different name, so the run
    finishes without an error or a warning about it, and every rank's key holds the mean over *all*
    ranks' values: rank ``r``'s ``loss_rank{r}`` is not rank ``r``'s value. Only rank ``r`` has the key
    ``loss_rank{r}``, and no warning names it."""
    plan = [[[f"loss_rank{r}", _value(r, 0, 1)]] for r in range(world_size)]
    world = _run(run_world, world_size, hook, plan)

    expected, left_alone = oracle.paired_sync_dist_means(_synced(world_size, hook, plan))
    all_rank_mean = oracle.sync_reduce("mean", [[(keys[0][1], 1)] for keys in plan])
    own = {f"own_value_rank{r}": plan[r][0][1] for r in range(world_size)}
    oracle.assert_distinct(all_rank_mean=all_rank_mean, **own)
    assert left_alone == [] and _same(expected, [{f"loss_rank{r}": all_rank_mean} for r in range(world_size)])
    got = [rec["callback_metrics"] for rec in world.records]
    semantics.number("loss_rank1 on rank 1", got[1]["loss_rank1"], vs=("rank 1's own value", plan[1][0][1]))
    assert _same(got, expected), (
        oracle.side_by_side("callback_metrics", got)
        + "   "
        + oracle.side_by_side("own value", [keys[0][1] for keys in plan])
        + f"   all-rank mean {all_rank_mean}"
    )
    warned = [w["message"] for rec in world.records for w in rec["warnings"] if "loss_rank" in w["message"]]
    assert warned == [], warned


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_same_keys_logged_in_a_different_order_finish_without_error_with_values_swapped_between_keys(
    run_world, semantics, world_size, hook
):
    """Even ranks log ``a`` then ``b``, odd ranks ``b`` then ``a``, all with ``sync_dist=True``. Both keys
    exist on every rank and the run finishes without an error, but each key's all_reduce pairs rank 0's
    ``a`` with rank 1's ``b``: on even ranks ``a`` holds the mean of (even ranks' ``a``, odd ranks'
    ``b``), on odd ranks ``b`` holds that same number, and the other key the rest. No rank holds the
    all-rank mean of ``a`` under ``a``."""
    plan = [[["a", _value(r, 0)], ["b", _value(r, 1)]][:: 1 if r % 2 == 0 else -1] for r in range(world_size)]
    world = _run(run_world, world_size, hook, plan)

    pairings = oracle.pairing_means([[(key, value) for key, value in keys] for keys in plan])
    oracle.assert_distinct(**pairings)
    intended = {key: oracle.sync_reduce("mean", [[(dict(keys)[key], 1)] for keys in plan]) for key in ("a", "b")}
    expected, left_alone = oracle.paired_sync_dist_means(_synced(world_size, hook, plan))
    assert left_alone == [] and all(row != intended for row in expected)
    got = [rec["callback_metrics"] for rec in world.records]
    semantics.number("a on rank 0", got[0]["a"], vs=("all-rank mean of a", intended["a"]))
    assert _same(got, expected), (
        oracle.side_by_side("callback_metrics", got)
        + "   "
        + oracle.side_by_side("logged in order", plan)
        + f"   intended {intended}"
    )


@run_if(backend="gloo")  # gloo fails the lonely all_reduce when peers close; NCCL waits (see ..._nccl.py)
@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_key_only_some_ranks_log_crashes_those_ranks_and_leaves_a_wrong_value_on_the_others(
    run_world, semantics, world_size, hook
):
    """Every rank but the last logs ``extra`` and then ``shared``; the last rank logs only ``shared``
    (all ``sync_dist=True``). The last rank's two syncs pair with the others' syncs of ``extra``, so it
    finishes ``trainer.validate`` without an error holding, under ``shared``, the mean of the other
    ranks' ``extra`` values and its own ``shared`` value. The other ranks then sync ``shared`` alone:
    once the last rank has finished and closed its connections, gloo fails their barrier with
    "Connection closed by peer" (or "reset by peer": tests/support/gloo.py). ddpprobe reports
    ``RankFailed`` naming exactly those ranks, each with gloo's own message, well within the
    process-group timeout."""
    last = world_size - 1
    plan = [([["extra", _value(r, 0)]] if r != last else []) + [["shared", _value(r, 1)]] for r in range(world_size)]
    with pytest.raises(RankFailed) as failure:
        _run(run_world, world_size, hook, plan, timeout=WORLD_TIMEOUT_S, pg_timeout=PG_TIMEOUT_S)

    err = failure.value
    expected, left_alone = oracle.paired_sync_dist_means(_synced(world_size, hook, plan))
    assert left_alone == list(range(last))
    assert sorted(err.ranks) == left_alone, f"{err.ranks}\n{err}"
    for rank in left_alone:
        assert err.exc_types[rank] == "RuntimeError", err.exc_types
        assert gloo.error_kind(err.rank_errors[rank]) == gloo.PEER_GONE, err.rank_errors[rank]
        assert "_sync_ddp" in err.tracebacks[rank] and "logger_connector" in err.tracebacks[rank]

    pairings = oracle.pairing_means([[(key, value) for key, value in keys] for keys in plan])
    oracle.assert_distinct(**pairings)
    intended_shared = oracle.sync_reduce("mean", [[(dict(keys)["shared"], 1)] for keys in plan])
    survivor = err.records[last]
    assert survivor is not None, f"rank {last} did not finish:\n{err}"
    semantics.number(
        f"shared on rank {last}",
        survivor["callback_metrics"]["shared"],
        vs=("all-rank mean of shared", intended_shared),
    )
    assert expected[last] != {"shared": intended_shared}
    assert _same([survivor["callback_metrics"]], [expected[last]]), (
        f"rank {last} holds {survivor['callback_metrics']}, expected {expected[last]}; "
        f"intended shared = {intended_shared}"
    )


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_logging_the_same_keys_in_the_same_order_gives_each_key_its_all_rank_mean(
    run_world, semantics, world_size, hook
):
    """The fix for all three hazards above: every rank logs the same keys, in the same order, on every
    call (a per-rank number goes under one shared key, and a value only one rank has is logged with
    ``rank_zero_only=True`` or not synced). Then every key holds the all-rank mean of its values on
    every rank, here the same numbers ``oracle.sync_reduce`` gives."""
    plan = [[["a", _value(r, 0)], ["b", _value(r, 1)]] for r in range(world_size)]
    world = _run(run_world, world_size, hook, plan)

    pairings = oracle.pairing_means([[(key, value) for key, value in keys] for keys in plan])
    oracle.assert_distinct(**pairings)
    counts = _counts(world_size, hook)
    intended = {
        key: oracle.sync_reduce("mean", [[(plan[r][slot][1], counts[r])] for r in range(world_size)])
        for slot, key in enumerate(("a", "b"))
    }
    got = [rec["callback_metrics"] for rec in world.records]
    semantics.number("a on every rank", got[0]["a"], vs=("all-rank mean of a", intended["a"]))
    assert _same(got, [intended] * world_size), oracle.side_by_side("callback_metrics", got) + f"   intended {intended}"
