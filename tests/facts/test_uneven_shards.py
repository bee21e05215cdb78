"""Uneven shards: ranks that run different numbers of batches.

Lightning pads a map-style dataset with ``DistributedSampler`` so every rank runs the same number of
batches. Nothing evens out a dataset the user shards, such as an ``IterableDataset`` that yields
sample ``i`` on rank ``i % W`` (``ddpprobe.probes.iterable.IdIterable(shard="rank")``): with N = 5 and
``batch_size=1``, rank 0 runs 3 batches and rank 1 runs 2 at W = 2; ranks 0 and 1 run 2 and rank 2
runs 1 at W = 3. Every collective is then entered a different number of times on different ranks:

- an epoch-level ``self.log(..., sync_dist=True)`` syncs once per epoch on every rank, so it completes,
  but its mean divides by a floored count (upstream issue #21859): with ``i % W`` sharding the ranks'
  counts add up to N, which never divides by W when the shards are uneven;
- a step-level one (``on_step=True``) all-reduces in every ``validation_step``: the extra steps of the
  ranks with more batches have no partner, and under gloo they fail or crash;
- in ``trainer.fit`` DistributedDataParallel all-reduces gradients in every backward (and syncs in
  forward), so the ranks with more batches wait for partners that are gone, or, when the others wait
  in a collective of their own, every rank hangs until the process-group timeout.

Each failing world here runs with a short process-group timeout (``pg_timeout``) and world timeout, so
ddpprobe reports the failure naming the ranks, with gloo's own message. What works instead: a
``torchmetrics.MeanMetric`` logged at epoch level (its state is synced by all_reduce of sums, once per
epoch), or shards with equal numbers of batches. Sources: pytorch_lightning/trainer/connectors/
logger_connector/result.py (``_ResultMetric.update``/``compute``), lightning_fabric/utilities/distributed.py
``_sync_ddp`` (a barrier, then the all_reduce), torch/nn/parallel/distributed.py.
"""

import time

import pytest

from ddpprobe import RankDied, RankFailed, WorldError
from ddpprobe.probes import iterable, log_spec
from tests.support import gloo, oracle, upstream

#: Samples and batch size: every sample its own batch, so each rank runs as many batches as it has samples.
N, BATCH = 5, 1
#: Short limits for worlds that fail: the process-group timeout (seconds) and the world's timeout above it.
PG_TIMEOUT, WORLD_TIMEOUT = 2, 20


def _shards(world_size):
    return [oracle.modulo_shard(N, world_size, r) for r in range(world_size)]


def _long_and_short(world_size):
    """Ranks with the most batches, and the others."""
    sizes = [len(s) for s in _shards(world_size)]
    long = [r for r, size in enumerate(sizes) if size == max(sizes)]
    return long, [r for r in range(world_size) if r not in long]


def _logged(world_size):
    """``[rank] -> [(value, batch_size), ...]`` each rank passes to ``self.log`` (one sample per batch)."""
    return [[(v, BATCH) for v in oracle.values(shard)] for shard in _shards(world_size)]


def _uneven_validate(run_world, world_size, plan, **limits):
    return run_world(iterable.validate_iterable, world_size, n=N, batch_size=BATCH, shard="rank", plan=plan, **limits)


def _errors(err) -> str:
    return oracle.side_by_side("error", [err.rank_errors.get(r, "finished") for r in range(len(err.pids))])


# ---------------------------------------------------------------------------------------------
# Validation with an epoch-level synced mean: completes, with a floored count
# ---------------------------------------------------------------------------------------------


@upstream.FLOORED_COUNT_BUG
@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_shards_give_the_true_mean_with_an_epoch_level_synced_log(run_world, world_size):
    """With uneven shards, ``self.log("v", batch_mean, sync_dist=True)`` (epoch level) should give every
    rank the mean over all N samples: each sample is in exactly one shard. It does not: the synced count
    is floored (see ``test_uneven_shards_floor_the_synced_count_so_the_epoch_level_synced_mean_is_inflated``),
    a real-world way to hit the bug of ``test_log_reductions.py::
    test_the_synced_epoch_mean_is_the_batch_size_weighted_mean_even_when_the_count_does_not_divide_by_world_size``."""
    world = _uneven_validate(run_world, world_size, [log_spec("v", sync_dist=True)])

    assert [sum(rec["seen_ids"], []) for rec in world.records] == _shards(world_size)
    correct = oracle.mean(oracle.values(range(N)))
    floored = oracle.floored_sync_mean(_logged(world_size))
    oracle.assert_distinct(correct=correct, floored_count=floored)
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    assert got == pytest.approx([correct] * world_size, rel=1e-6), (
        oracle.side_by_side("v", got) + f"  true mean {correct}, with floored count {floored}"
    )


@upstream.FLOORED_COUNT_TODAY
@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_shards_floor_the_synced_count_so_the_epoch_level_synced_mean_is_inflated(
    run_world, semantics, world_size
):
    """What Lightning gives today for the same log: every rank gets ``(sum(v*b) / W) / floor(sum(b) / W)``,
    the weighted sums' mean over the int64 batch-size counts' mean, truncated (result.py
    ``_ResultMetric.compute``; ``_sync_ddp`` copies ``sum / W`` back into the integer tensor on gloo).
    With ``i % W`` sharding the counts add up to N, so whenever the shards are uneven (N not divisible
    by W) the count is floored: 7.5 instead of 6 at W = 2, 10 instead of 6 at W = 3. Upstream issue
    https://github.com/Lightning-AI/pytorch-lightning/issues/21859."""
    world = _uneven_validate(run_world, world_size, [log_spec("v", sync_dist=True)])

    seen = [sum(rec["seen_ids"], []) for rec in world.records]
    assert seen == _shards(world_size), oracle.side_by_side("saw", seen) + f"  expected {_shards(world_size)}"
    assert N % world_size != 0, "uneven i % W shards always have a total that W does not divide"
    logged = _logged(world_size)
    floored = oracle.floored_sync_mean(logged)
    correct = oracle.sync_reduce("mean", logged)
    mean_of_rank_means = oracle.mean(oracle.log_reduce("mean", rank) for rank in logged)
    oracle.assert_distinct(floored_count=floored, true_mean=correct, mean_of_rank_means=mean_of_rank_means)
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced mean", got[0], vs=("true mean", correct))
    assert got == pytest.approx([floored] * world_size, rel=1e-6), (
        oracle.side_by_side("v", got) + f"  expected (floored count) {floored}; true mean {correct}; "
        f"mean of rank means {mean_of_rank_means}"
    )


# ---------------------------------------------------------------------------------------------
# Validation with a step-level synced log: extra steps have no partner
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_shards_with_a_step_and_epoch_synced_log_pair_an_extra_step_with_the_epoch_sync_and_gloo_aborts_a_rank(
    run_world, semantics, world_size
):
    """``self.log("v", batch_mean, on_step=True, sync_dist=True)`` in ``validation_step`` (``on_epoch``
    stays True there) with uneven shards. Each sync is ``_sync_ddp``: a barrier, then an all_reduce.
    A rank with fewer batches reaches the epoch end while the others still log their extra step, so its
    epoch-level sync of the float32 value silently pairs with their step sync; its next all_reduce, of the
    int64 batch-size count (8 bytes), then meets their epoch-level float32 one (4 bytes). gloo's TCP
    transport checks every received message against the buffer and throws ``gloo::EnforceNotMet``
    ("8 vs 4. Received data size doesn't match expected size") in a background thread, which aborts a
    rank with more batches (SIGABRT). ddpprobe reports ``RankDied`` naming it, with gloo's message; no
    rank waits for the process-group timeout. Sources: result.py ``_ResultMetric.update`` (``on_step``: sync
    the value now) and ``compute``; gloo/transport/tcp/pair.cc."""
    long, _ = _long_and_short(world_size)
    with pytest.raises(WorldError) as failure:
        _uneven_validate(
            run_world,
            world_size,
            [log_spec("v", on_step=True, sync_dist=True)],
            timeout=WORLD_TIMEOUT,
            pg_timeout=PG_TIMEOUT,
        )

    err = failure.value
    semantics.number("rank that died", str(err.ranks), vs=("ranks with more batches", str(long)))
    assert isinstance(err, RankDied), f"expected a rank to die, got {type(err).__name__}:\n{err}"
    assert err.ranks and set(err.ranks) <= set(long), f"died: {err.ranks}, ranks with more batches: {long}\n{err}"
    for r in err.ranks:
        assert err.exitcodes[r] == -6, f"rank {r} exit code {err.exitcodes[r]}, expected SIGABRT (-6)"
        text = err.rank_errors[r]
        assert gloo.error_kind(text) == gloo.SIZE_MISMATCH and "8 vs 4" in text, _errors(err)
    assert all(gloo.error_kind(text) != gloo.TIMED_OUT for text in err.rank_errors.values()), (
        f"a rank waited for the process-group timeout instead of failing at once:\n{_errors(err)}"
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_shards_with_a_step_only_synced_log_fail_the_ranks_with_more_batches_and_the_others_finish(
    run_world, semantics, world_size
):
    """``self.log("v", batch_mean, on_step=True, on_epoch=False, sync_dist=True)``: no epoch-level sync, so
    a rank with fewer batches finishes ``trainer.validate`` and leaves, while the ranks with more batches
    enter the step sync of their extra ``validation_step`` (``_sync_ddp``'s barrier) alone and fail with
    gloo's ``RuntimeError: ... Connection closed by peer`` (or reset). ddpprobe reports ``RankFailed`` naming the
    ranks with more batches (any still blocked when the world is ended are reported as not finished),
    each with gloo's message and a traceback through ``self.log`` and ``_sync_ddp``; the other ranks
    returned their records."""
    long, short = _long_and_short(world_size)
    with pytest.raises(WorldError) as failure:
        _uneven_validate(
            run_world,
            world_size,
            [log_spec("v", on_step=True, on_epoch=False, sync_dist=True)],
            timeout=WORLD_TIMEOUT,
            pg_timeout=PG_TIMEOUT,
        )

    err = failure.value
    semantics.number(
        "ranks that did not finish", str(sorted(err.rank_errors)), vs=("ranks with more batches", str(long))
    )
    assert isinstance(err, RankFailed), f"expected RankFailed, got {type(err).__name__}:\n{err}"
    assert err.ranks and set(err.ranks) <= set(long), f"failed: {err.ranks}, more batches: {long}\n{_errors(err)}"
    finished = [r for r in range(world_size) if r not in err.rank_errors]
    assert finished == short, _errors(err)
    for r in err.ranks:
        assert err.exc_types[r] == "RuntimeError" and gloo.error_kind(err.rank_errors[r]) == gloo.PEER_GONE, _errors(
            err
        )
        assert "validation_step" in err.tracebacks[r] and "_sync_ddp" in err.tracebacks[r], err.tracebacks[r]


# ---------------------------------------------------------------------------------------------
# Fit: DistributedDataParallel's collectives in every step
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_fit_without_logging_finishes_the_ranks_with_fewer_batches_and_fails_the_others_in_a_ddp_collective(
    run_world, semantics, world_size
):
    """``trainer.fit`` for one epoch over uneven shards, nothing logged. DistributedDataParallel
    all-reduces gradients in every backward (and, from the second step, syncs in forward when it rebuilds
    its buckets), so the ranks with more batches run a step whose collectives the others never enter. The
    ranks with fewer batches finish ``fit`` and leave; the others fail in that step's DDP collective with
    gloo's ``Connection closed by peer`` (or are still in it when the world is ended). No hang: ddpprobe
    reports ``RankFailed`` and no rank waited for the process-group timeout. Source: torch/nn/parallel/distributed.py
    (``DistributedDataParallel._pre_forward``, the reducer's gradient all_reduce)."""
    long, short = _long_and_short(world_size)
    with pytest.raises(WorldError) as failure:
        run_world(
            iterable.fit_iterable,
            world_size,
            n=N,
            batch_size=BATCH,
            shard="rank",
            timeout=WORLD_TIMEOUT,
            pg_timeout=PG_TIMEOUT,
        )

    err = failure.value
    semantics.number(
        "ranks that did not finish", str(sorted(err.rank_errors)), vs=("ranks with more batches", str(long))
    )
    assert isinstance(err, RankFailed), f"expected RankFailed, got {type(err).__name__}:\n{err}"
    finished = [r for r in range(world_size) if r not in err.rank_errors]
    assert finished == short, _errors(err)
    assert err.ranks and set(err.ranks) <= set(long), _errors(err)
    for r in err.ranks:
        assert gloo.error_kind(err.rank_errors[r]) == gloo.PEER_GONE, _errors(err)
        traceback = err.tracebacks[r]
        assert "backward" in traceback or "parallel/distributed.py" in traceback, traceback
    assert all(gloo.error_kind(text) != gloo.TIMED_OUT for text in err.rank_errors.values()), (
        f"a rank waited for the process-group timeout instead of failing at once:\n{_errors(err)}"
    )


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.waits_for_timeout
def test_uneven_fit_with_a_synced_epoch_log_hangs_every_rank_until_the_process_group_timeout(
    run_world, semantics, world_size
):
    """The same fit with ``self.log("v", batch_mean, on_epoch=True, on_step=False, sync_dist=True)`` in
    ``training_step``. A rank with fewer batches now reaches the epoch end and waits in the epoch-level sync
    (``_sync_ddp``'s barrier) while the others wait in their extra step's DDP collective: every rank blocks
    until the process-group timeout, then gloo raises ("Timed out waiting ... for recv", "Application
    timeout caused pair closure", or "Connection closed by peer" once a timed-out peer leaves). No rank
    finishes. ddpprobe reports ``RankFailed`` after the process-group timeout and before the world's (the
    ranks' own errors, not ``WorldTimeout``) with every rank's traceback, or, for a rank still waiting
    when the world was ended, its stack (``WorldError.stacks``): the ranks with fewer batches wait in
    ``_sync_ddp``, the others in DDP's backward or forward sync."""
    long, short = _long_and_short(world_size)
    started = time.monotonic()
    with pytest.raises(WorldError) as failure:
        run_world(
            iterable.fit_iterable,
            world_size,
            n=N,
            batch_size=BATCH,
            shard="rank",
            plan=[log_spec("v", on_step=False, on_epoch=True, sync_dist=True)],
            timeout=WORLD_TIMEOUT,
            pg_timeout=PG_TIMEOUT,
        )
    elapsed = time.monotonic() - started

    err = failure.value
    semantics.number("ranks that finished", world_size - len(err.rank_errors), vs=("world size", world_size))
    assert isinstance(err, RankFailed), f"expected RankFailed, got {type(err).__name__}:\n{err}"
    assert sorted(err.rank_errors) == list(range(world_size)), f"some rank finished:\n{_errors(err)}"
    assert PG_TIMEOUT <= elapsed < WORLD_TIMEOUT, (
        f"reported after {elapsed:.1f}s; expected at the {PG_TIMEOUT}s process-group timeout, before the "
        f"{WORLD_TIMEOUT}s world timeout"
    )
    texts = list(err.rank_errors.values())
    assert any(gloo.error_kind(text) == gloo.TIMED_OUT for text in texts), _errors(err)
    for r in range(world_size):
        text = err.rank_errors[r]
        assert text == "did not finish" or gloo.error_kind(text) in (gloo.PEER_GONE, gloo.TIMED_OUT), _errors(err)
    # Where each rank waited: its traceback if it raised, else the stack it was in when the world was ended.
    where = {r: err.tracebacks.get(r) or err.stacks.get(r) for r in range(world_size)}
    assert all(where.values()), f"a rank without a traceback or a stack:\n{err}"
    for r in short:
        assert "_sync_ddp" in where[r], f"rank {r} (fewer batches) waited here:\n{where[r]}"
    for r in long:
        assert "backward" in where[r] or "parallel/distributed.py" in where[r], (
            f"rank {r} (more batches) waited here:\n{where[r]}"
        )


# ---------------------------------------------------------------------------------------------
# What works instead
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_shards_logged_through_a_torchmetrics_mean_metric_give_the_true_mean(run_world, semantics, world_size):
    """``self.log("m", mean_metric)`` with a ``torchmetrics.MeanMetric`` updated with each batch's values,
    over the same uneven shards: at the epoch end the metric syncs its float states (weighted sum and
    weight, ``dist_reduce_fx="sum"``) once on every rank, so every rank gets the mean over all N samples,
    not the floored-count value ``self.log(sync_dist=True)`` gives in the same run. Sources:
    torchmetrics/aggregation.py ``MeanMetric``; torchmetrics/metric.py ``Metric._sync_dist``."""
    world = _uneven_validate(run_world, world_size, [log_spec("m", "mean_metric"), log_spec("v", sync_dist=True)])

    correct = oracle.mean(oracle.values(range(N)))
    floored = oracle.floored_sync_mean(_logged(world_size))
    oracle.assert_distinct(true_mean=correct, floored_count=floored)
    got = [rec["callback_metrics"]["m"] for rec in world.records]
    semantics.number("MeanMetric", got[0], vs=("true mean", correct))
    assert got == pytest.approx([correct] * world_size, rel=1e-6), (
        oracle.side_by_side("m", got) + f"  true mean {correct}"
    )
    beside = [rec["callback_metrics"]["v"] for rec in world.records]
    assert beside == pytest.approx([floored] * world_size, rel=1e-6), oracle.side_by_side("v", beside)


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_shards_cut_to_equal_batch_counts_let_fit_with_a_synced_epoch_log_finish(
    run_world, semantics, world_size
):
    """Giving every rank the same number of batches removes the mismatch: the same fit with a synced
    epoch-level log, over shards cut to ``N // W`` samples each (``IdIterable(shard="rank_equal")``, the
    ``drop_last`` of a user's sharding), completes on every rank with ``N // W`` optimizer steps, and the
    synced mean is exact for the samples kept (their count divides by W). The ``N % W`` dropped samples are
    missing from that mean, which therefore differs from the mean over all N."""
    world = run_world(
        iterable.fit_iterable,
        world_size,
        n=N,
        batch_size=BATCH,
        shard="rank_equal",
        plan=[log_spec("v", on_step=False, on_epoch=True, sync_dist=True)],
        timeout=WORLD_TIMEOUT,
        pg_timeout=PG_TIMEOUT,
    )

    per_rank = N // world_size
    kept = [oracle.modulo_shard(N, world_size, r)[:per_rank] for r in range(world_size)]
    seen = [sum(rec["seen_ids"], []) for rec in world.records]
    assert seen == kept, oracle.side_by_side("saw", seen) + f"  expected {kept}"
    steps = [rec["global_step"] for rec in world.records]
    assert steps == [per_rank] * world_size, oracle.side_by_side("optimizer steps", steps)
    kept_mean = oracle.mean(oracle.values(sum(kept, [])))
    all_mean = oracle.mean(oracle.values(range(N)))
    oracle.assert_distinct(mean_of_kept_samples=kept_mean, mean_of_all_samples=all_mean)
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced mean", got[0], vs=("mean of all N", all_mean))
    assert got == pytest.approx([kept_mean] * world_size, rel=1e-6), (
        oracle.side_by_side("v", got) + f"  expected the mean of the kept samples {kept_mean}; of all {all_mean}"
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_shards_cut_to_equal_batch_counts_let_a_step_level_synced_log_finish(run_world, semantics, world_size):
    """The step-level log that aborted a rank above (``on_step=True, sync_dist=True``) completes once every
    rank has ``N // W`` batches (``IdIterable(shard="rank_equal")``): every step's sync has a partner on
    every rank. ``v_step`` (in ``logged_metrics``) is the mean over ranks of the last step's values, and
    ``v_epoch`` the mean of the kept samples, not of all N."""
    world = run_world(
        iterable.validate_iterable,
        world_size,
        n=N,
        batch_size=BATCH,
        shard="rank_equal",
        plan=[log_spec("v", on_step=True, sync_dist=True)],
        timeout=WORLD_TIMEOUT,
        pg_timeout=PG_TIMEOUT,
    )

    per_rank = N // world_size
    kept = [oracle.modulo_shard(N, world_size, r)[:per_rank] for r in range(world_size)]
    seen = [sum(rec["seen_ids"], []) for rec in world.records]
    assert seen == kept, oracle.side_by_side("saw", seen) + f"  expected {kept}"
    last_step = oracle.mean(oracle.values(shard[-1] for shard in kept))
    kept_mean = oracle.mean(oracle.values(sum(kept, [])))
    all_mean = oracle.mean(oracle.values(range(N)))
    oracle.assert_distinct(mean_of_kept_samples=kept_mean, mean_of_all_samples=all_mean)
    got = [{k: rec["logged_metrics"][k] for k in ("v_step", "v_epoch")} for rec in world.records]
    semantics.number("synced epoch mean", got[0]["v_epoch"], vs=("mean of all N", all_mean))
    expected = {"v_step": last_step, "v_epoch": kept_mean}
    assert got == [pytest.approx(expected, rel=1e-6)] * world_size, (
        oracle.side_by_side("logged", got) + f"  expected {expected}; mean of all N {all_mean}"
    )
