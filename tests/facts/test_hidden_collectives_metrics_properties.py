"""Reading ``trainer.callback_metrics`` (or ``logged_metrics``, ``progress_bar_metrics``) can run a collective.

Each of the three properties calls ``_LoggerConnector.metrics``, which asks ``_ResultCollection.metrics``
for *every* logged key (whatever property was read, and whether the key is on the progress bar or not).
Between ``epoch_end_reached()`` and the connector's own epoch-end update, that means the epoch values:
a key logged with ``sync_dist=True`` whose epoch value is not computed yet is computed then
(``_get_cache`` -> ``_ResultMetric.compute``), and computing it is a sync: a barrier and an all_reduce
(``_sync_ddp``). The value is cached (``_ResultMetric._computed``), so the connector's own update later
runs no second sync on the rank that read. So:

- in ``on_train_epoch_end`` a read is a collective: the fit loop's ``on_epoch_end()`` (which syncs the
  epoch values on every rank) runs after the hooks (``_FitLoop.on_advance_end``);
- in ``on_validation_epoch_end`` the ``validation_step`` keys were already synced by the evaluation loop
  (``_store_dataloader_outputs`` -> ``update_eval_epoch_metrics``, before the hook), so only a key logged
  in the hook itself, before the read, is synced by the read;
- mid-epoch (in ``training_step``) a read returns the step values and runs no collective.

A read under ``if trainer.is_global_zero:`` is then a collective on rank 0 only. It pairs with whatever
collective the other ranks run next: their own epoch-end sync of the same key (the right value, by
luck), or a collective of the user's code (another key's numbers swapped in, or both ranks stuck until
the process-group timeout). The fix: read on every rank, then branch.

The probe is ddpprobe/probes/hidden_collectives.py (``metrics_read``): each rank logs ``value`` = the
batch's summed ``id ** 2`` with ``on_epoch=True, sync_dist=True, reduce_fx="sum"``; its shard comes from
torch's ``DistributedSampler`` (shuffled in fit, ``oracle.distributed_sampler_ids``), and the numbers the
user's collective contributes are ``local_extra(rank)`` (1000, 2000, ...), so every pairing gives a
different number. Collectives are counted by ``trace.CollectiveTrace`` (``torch.distributed`` calls).
Sources: pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py
``_LoggerConnector.metrics``, ``callback_metrics``, ``epoch_end_reached``, ``on_epoch_end``;
.../logger_connector/result.py ``_ResultCollection.metrics``, ``_get_cache``, ``_ResultMetric.compute``;
pytorch_lightning/loops/fit_loop.py ``_FitLoop.on_advance_end``; pytorch_lightning/loops/evaluation_loop.py
``_EvaluationLoop.run``, ``_store_dataloader_outputs``, ``_on_evaluation_epoch_end``;
lightning_fabric/utilities/distributed.py ``_sync_ddp``. Upstream report of the same trap in the
progress bar: Lightning-AI/pytorch-lightning#21264.
"""

import time

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hidden_collectives as hidden
from tests.support import gloo, oracle

N, BATCH_SIZE = 7, 2
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 2, 20

#: One sync of a ``reduce_fx="sum"`` key, as ``torch.distributed`` sees it (``_sync_ddp``).
ONE_SYNC = ["barrier", "all_reduce"]


def _own_sums(world_size: int, shuffle: bool) -> list:
    """Each rank's sum of ``id ** 2`` over its ``DistributedSampler`` shard."""
    return [
        sum(oracle.values(oracle.distributed_sampler_ids(N, world_size, r, shuffle=shuffle))) for r in range(world_size)
    ]


def _assert_shards(world, shuffle: bool) -> None:
    """Each rank saw its ``DistributedSampler`` shard (torch's sampler as the oracle)."""
    for rank, rec in enumerate(world.records):
        seen = [i for batch in rec["seen_ids"] for i in batch]
        assert seen == oracle.distributed_sampler_ids(N, len(world), rank, shuffle=shuffle), (rank, seen)


@pytest.mark.parametrize("prop", hidden.PROPERTIES)
@pytest.mark.parametrize("world_size", [2, 3])
def test_reading_a_metrics_property_in_on_train_epoch_end_runs_the_epoch_sync_and_reads_the_whole_set_value(
    run_world, semantics, world_size, prop
):
    """``trainer.callback_metrics``, ``logged_metrics`` or ``progress_bar_metrics`` read in
    ``on_train_epoch_end`` on every rank: the read itself runs the sync of ``value`` (one barrier and
    one all_reduce, counted on every rank), and every rank reads the sum over every rank's shard, not
    its own. ``progress_bar_metrics`` reads ``{}`` (``value`` is not on the bar) yet runs the same sync:
    every property computes every key."""
    world = run_world(
        hidden.metrics_read,
        world_size,
        where="on_train_epoch_end",
        reader="every_rank",
        then="nothing",
        prop=prop,
        n=N,
        batch_size=BATCH_SIZE,
    )

    own = _own_sums(world_size, shuffle=True)
    total = sum(own)
    oracle.assert_distinct(whole_set=total, **{f"rank{r}_shard": v for r, v in enumerate(own)})
    _assert_shards(world, shuffle=True)
    expected_read = {} if prop == "progress_bar_metrics" else {hidden.KEY: total}
    reads = [rec["read"] for rec in world.records]
    semantics.number(f"{prop}[value] read on rank 0", reads[0].get(hidden.KEY), vs=("rank 0's shard", own[0]))
    assert [rec["read_collectives"] for rec in world.records] == [ONE_SYNC] * world_size, oracle.side_by_side(
        "collectives the read ran", [rec["read_collectives"] for rec in world.records]
    )
    assert reads == [expected_read] * world_size, oracle.side_by_side("read", reads) + f"   expected {expected_read}"
    assert [rec["callback_metrics"] for rec in world.records] == [{hidden.KEY: total}] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_reading_callback_metrics_mid_epoch_runs_no_collective_and_holds_no_epoch_value_yet(
    run_world, semantics, world_size
):
    """The same read in ``training_step`` (batch 0), on every rank: the connector is between
    ``on_batch_start`` and ``on_batch_end`` (``_first_loop_iter`` set), so ``metrics`` returns step
    values only; ``value`` is logged with ``on_step=False``, so the read returns ``{}`` and runs no
    collective. The epoch value (the sum over every rank's shard) appears after the epoch."""
    world = run_world(
        hidden.metrics_read,
        world_size,
        where="training_step",
        reader="every_rank",
        then="nothing",
        n=N,
        batch_size=BATCH_SIZE,
    )

    total = sum(_own_sums(world_size, shuffle=True))
    semantics.number(
        "collectives the mid-epoch read ran", len(world.records[0]["read_collectives"]), vs=("at epoch end", 2)
    )
    assert [rec["read_collectives"] for rec in world.records] == [[]] * world_size
    assert [rec["read"] for rec in world.records] == [{}] * world_size, oracle.side_by_side(
        "read", [rec["read"] for rec in world.records]
    )
    assert [rec["callback_metrics"] for rec in world.records] == [{hidden.KEY: total}] * world_size


@pytest.mark.parametrize("log_in_hook", [False, True], ids=["step_key_only", "key_logged_in_the_hook"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_in_on_validation_epoch_end_a_read_syncs_only_the_keys_logged_in_that_hook(
    run_world, semantics, world_size, log_in_hook
):
    """``trainer.validate``, read on every rank in ``on_validation_epoch_end``. The ``validation_step``
    key was synced by the evaluation loop before the hook (``_store_dataloader_outputs``), so reading it
    runs no collective; a key logged in ``on_validation_epoch_end`` itself, before the read
    (``hook_value``), is synced by the read: one barrier and one all_reduce. Both read the sums over
    every rank (padding included: ``DistributedSampler(shuffle=False)`` repeats sample 0 at W = 2, samples
    0 and 1 at W = 3; only at W = 3 does the padded sum differ from the unpadded one, since sample 0's
    ``id ** 2`` is 0)."""
    world = run_world(
        hidden.metrics_read,
        world_size,
        where="on_validation_epoch_end",
        reader="every_rank",
        then="nothing",
        log_in_hook=log_in_hook,
        n=N,
        batch_size=BATCH_SIZE,
    )

    own = _own_sums(world_size, shuffle=False)
    hook_total = sum(hidden.hook_value(r) for r in range(world_size))
    oracle.assert_distinct(whole_set=sum(own), **{f"rank{r}_shard": v for r, v in enumerate(own)})
    if world_size == 3:  # W = 2 repeats only sample 0, whose value 0 leaves the sum unchanged
        oracle.assert_distinct(padded_sum=sum(own), unpadded_sum=sum(oracle.values(range(N))))
    oracle.assert_distinct(hook_total=hook_total, **{f"rank{r}_hook": hidden.hook_value(r) for r in range(world_size)})
    _assert_shards(world, shuffle=False)
    expected = {hidden.KEY: sum(own), **({hidden.HOOK_KEY: hook_total} if log_in_hook else {})}
    ran = [rec["read_collectives"] for rec in world.records]
    semantics.number("collectives the read ran", len(ran[0]), vs=("keys read", len(expected)))
    assert ran == [ONE_SYNC if log_in_hook else []] * world_size, oracle.side_by_side("collectives the read ran", ran)
    assert [rec["read"] for rec in world.records] == [expected] * world_size, oracle.side_by_side(
        "read", [rec["read"] for rec in world.records]
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_read_on_global_rank_0_only_pairs_with_the_other_ranks_own_epoch_end_sync_and_gives_the_right_value(
    run_world, semantics, world_size
):
    """``if trainer.is_global_zero: metrics = trainer.callback_metrics`` in ``on_train_epoch_end``, and
    nothing else: rank 0's read runs the sync of ``value``; the other ranks run theirs a moment later,
    in the connector's ``on_epoch_end``. The two are the i-th collective on each rank, so they pair and
    every rank ends with the sum over every rank's shard: correct, but only because the other ranks' next
    collective happens to be the same sync."""
    world = run_world(
        hidden.metrics_read,
        world_size,
        where="on_train_epoch_end",
        reader="rank0",
        then="nothing",
        n=N,
        batch_size=BATCH_SIZE,
    )

    total = sum(_own_sums(world_size, shuffle=True))
    ran = [rec["read_collectives"] for rec in world.records]
    semantics.number("value on rank 1", world.records[1]["callback_metrics"][hidden.KEY], vs=("whole set", total))
    assert ran == [ONE_SYNC] + [[]] * (world_size - 1), oracle.side_by_side("collectives the read ran", ran)
    assert [rec["read"] for rec in world.records] == [{hidden.KEY: total}] + [None] * (world_size - 1)
    assert [rec["callback_metrics"] for rec in world.records] == [{hidden.KEY: total}] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_read_on_global_rank_0_only_then_strategy_reduce_swaps_the_two_sums_without_an_error(
    run_world, semantics, world_size
):
    """The same rank-0 read, then ``trainer.strategy.reduce(local_extra(rank), "sum")`` on every rank (a
    barrier and an all_reduce, like the sync). Rank 0's order is [sync of ``value``, reduce]; the other
    ranks' is [reduce, sync of ``value``] (their sync comes after the hook). The i-th all_reduces pair:
    the run finishes with no error, rank 0's ``value`` = its own shard's sum +
    the other ranks' extras, the other ranks' ``value`` = rank 0's extra + their shards' sums, and the
    reduce returns the other of the two on each rank. Neither the sum over the shards nor the sum of the
    extras reaches any rank."""
    world = run_world(
        hidden.metrics_read,
        world_size,
        where="on_train_epoch_end",
        reader="rank0",
        then="reduce",
        n=N,
        batch_size=BATCH_SIZE,
    )

    own = _own_sums(world_size, shuffle=True)
    extra = [hidden.local_extra(r) for r in range(world_size)]
    rank0_first = own[0] + sum(extra[1:])  # rank 0's sync paired with the others' reduce
    others_first = extra[0] + sum(own[1:])  # rank 0's reduce paired with the others' sync
    oracle.assert_distinct(
        whole_set=sum(own), extras=sum(extra), rank0_sync_with_peer_reduce=rank0_first, rank0_reduce=others_first
    )
    values = [rec["callback_metrics"][hidden.KEY] for rec in world.records]
    reduced = [rec["then_value"] for rec in world.records]
    semantics.number("value on rank 0", values[0], vs=("whole set", sum(own)))
    assert values == [rank0_first] + [others_first] * (world_size - 1), (
        oracle.side_by_side("value", values) + f"   whole set {sum(own)}"
    )
    assert reduced == [others_first] + [rank0_first] * (world_size - 1), (
        oracle.side_by_side("reduce returned", reduced) + f"   extras {sum(extra)}"
    )


@run_if(backend="gloo")  # the text of gloo's timeout; NCCL reports its own
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.waits_for_timeout
def test_a_read_on_global_rank_0_only_then_a_metric_compute_leaves_every_rank_stuck_until_the_timeout(
    run_world, semantics, world_size
):
    """The same rank-0 read, then ``SumMetric.compute()`` on every rank (torchmetrics: a barrier, then an
    all_gather). Rank 0's barrier (the read's sync) pairs with the other ranks' barrier (the metric's),
    then rank 0 enters an all_reduce and the others an all_gather: gloo matches them by neither, so no
    rank moves until the process-group timeout (here 2 s). Rank 0 raises a ``RuntimeError`` from the
    read (traceback through ``callback_metrics`` and ``_sync_ddp``) with gloo's timeout text (or, if a
    peer's timeout ended it a moment before its own, "connection closed"). Every other rank was waiting
    in the all_gather of torchmetrics' ``gather_all_tensors``: a rank that raised there the same way shows
    it in its traceback, a rank the launcher ended first in the stack it captured."""
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        run_world(
            hidden.metrics_read,
            world_size,
            where="on_train_epoch_end",
            reader="rank0",
            then="metric_compute",
            n=N,
            batch_size=BATCH_SIZE,
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )
    elapsed = time.monotonic() - start

    err = failure.value
    semantics.number("failed after (s)", round(elapsed, 1), vs=("process-group timeout (s)", PG_TIMEOUT_S))
    gloo.assert_stuck_until_the_timeout(err, elapsed, PG_TIMEOUT_S, world_size)
    assert "callback_metrics" in err.tracebacks[0] and "_sync_ddp" in err.tracebacks[0], err.tracebacks[0]
    assert gloo.collective_in(err.tracebacks[0]) == "all_reduce", err.tracebacks[0]
    for rank in range(1, world_size):
        where = gloo.where_waiting(err, rank)
        assert "gather_all_tensors" in where and gloo.collective_in(where) == "all_gather", f"rank {rank}:\n{where}"


@pytest.mark.parametrize("then", ["reduce", "metric_compute"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_reading_on_every_rank_then_branching_keeps_every_collective_paired(run_world, semantics, world_size, then):
    """The fix: ``metrics = dict(trainer.callback_metrics)`` on every rank, then ``if
    trainer.is_global_zero: ...`` for what only rank 0 does with it. Every rank runs the sync in the read,
    then the same collective (``strategy.reduce`` or ``SumMetric.compute()``): every rank ends with the sum
    over every rank's shard as ``value`` and the right result of its own collective (the sum of the
    extras; the sum of every rank's sample ids)."""
    world = run_world(
        hidden.metrics_read,
        world_size,
        where="on_train_epoch_end",
        reader="every_rank",
        then=then,
        n=N,
        batch_size=BATCH_SIZE,
    )

    own = _own_sums(world_size, shuffle=True)
    extras = sum(hidden.local_extra(r) for r in range(world_size))
    ids = sum(sum(oracle.distributed_sampler_ids(N, world_size, r, shuffle=True)) for r in range(world_size))
    expected_then = extras if then == "reduce" else float(ids)
    values = [rec["callback_metrics"][hidden.KEY] for rec in world.records]
    semantics.number("value on rank 0", values[0], vs=("rank 0's shard", own[0]))
    ran = [rec["read_collectives"] for rec in world.records]
    assert ran == [ONE_SYNC] * world_size, oracle.side_by_side("collectives the read ran", ran)
    assert values == [sum(own)] * world_size, oracle.side_by_side("value", values)
    assert [rec["then_value"] for rec in world.records] == [expected_then] * world_size, oracle.side_by_side(
        "then", [rec["then_value"] for rec in world.records]
    )
    assert [rec["read"] for rec in world.records] == [{hidden.KEY: sum(own)}] * world_size
