"""Collective hazards in torchmetrics: ``Metric.compute()`` is a hidden collective, and which values are
synced depends on the metric's own arguments, not on ``self.log(..., sync_dist=...)``.

``Metric.compute()`` syncs the metric's states across ranks first (``Metric.sync`` ->
``Metric._sync_dist`` -> ``gather_all_tensors``, all_gathers) when ``sync_on_compute=True`` (the default)
and a process group exists. So ``compute()`` under ``if self.global_rank == 0`` leaves rank 0 alone in
an all_gather, while ``compute()`` on every rank and printing on rank 0 only is correct.
``Metric.forward`` (``self.metric(preds, target)``) returns the *batch's* value, synced across ranks only
with ``dist_sync_on_step=True``; Lightning logs that as the step value of a metric object whatever
``sync_dist`` says (``_ResultMetric.update`` keeps ``value._forward_cache``; the sync function only
applies to tensors). With ``sync_on_compute=False`` nothing is synced at all, for a metric logged alone
and for a ``MetricCollection`` logged with ``log_dict`` alike.

Each rank updates the metrics with the ``value`` (``id ** 2``) of its shard's samples; the expected
numbers come from the ``DistributedSampler`` shards (``oracle.shard``, ``oracle.rank_batches``), padding
included. The probe is ddpprobe/probes/hazards.py.
Sources: torchmetrics/metric.py ``Metric.forward``, ``Metric._forward_reduce_state_update``,
``Metric.sync``, ``Metric._sync_dist``, ``Metric.compute``; torchmetrics/utilities/distributed.py
``gather_all_tensors``; pytorch_lightning/trainer/connectors/logger_connector/result.py
``_ResultMetric.update``, ``_ResultMetric.compute``; pytorch_lightning/core/module.py
``LightningModule.log_dict`` (a ``MetricCollection`` is logged metric by metric).
"""

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hazards
from tests.support import gloo, oracle

N, BATCH_SIZE = 7, 2
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 2, 20


def _padded(world_size: int) -> list:
    return oracle.padded_indices(N, world_size)


@run_if(backend="gloo")  # gloo fails the lonely all_gather when peers close; NCCL waits (see ..._nccl.py)
@pytest.mark.parametrize("world_size", [2, 3])
def test_metric_compute_under_if_global_rank_0_leaves_rank_0_alone_in_the_metric_state_sync(
    run_world, semantics, world_size
):
    """``if self.global_rank == 0: value = self.mean.compute()`` in ``on_validation_epoch_end``: the
    other ranks skip the call, finish ``trainer.validate`` and close their connections, while rank 0's
    ``compute()`` all_gathers the metric's states (``Metric._sync_dist``) with peers that never come.
    gloo fails rank 0 with "Connection closed by peer" (or "reset by peer"); ddpprobe reports
    ``RankFailed`` naming rank 0 only, with gloo's message and a traceback through torchmetrics' sync,
    well within the timeouts. Every other rank finished, without a value."""
    with pytest.raises(RankFailed) as failure:
        run_world(
            hazards.metric_compute,
            world_size,
            where="rank0",
            n=N,
            batch_size=BATCH_SIZE,
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )

    err = failure.value
    semantics.number("failed ranks", str(err.ranks), vs=("world size", world_size))
    assert err.ranks == [0] and err.exc_types == {0: "RuntimeError"}, f"{err.ranks} {err.exc_types}\n{err}"
    assert gloo.error_kind(err.rank_errors[0]) == gloo.PEER_GONE, err.rank_errors[0]
    traceback = err.tracebacks[0]
    assert "torchmetrics" in traceback and "_sync_dist" in traceback and "compute" in traceback, traceback
    others = err.records[1:]
    assert others == [
        {"computed": None, "seen_ids": oracle.batches(oracle.shard(N, world_size, r), BATCH_SIZE)}
        for r in range(1, world_size)
    ], oracle.side_by_side("ranks 1.. recorded", others)


@pytest.mark.parametrize("world_size", [2, 3])
def test_metric_compute_on_every_rank_gives_every_rank_the_whole_set_value_and_self_print_prints_once(
    run_world, semantics, world_size
):
    """The fix: call ``compute()`` on every rank (it is a collective) and print with ``self.print``
    (rank 0 only). Every rank gets the mean over every rank's samples, the sampler's padding
    duplicates included, not its own shard's mean; exactly one line is printed, by rank 0."""
    world = run_world(hazards.metric_compute, world_size, where="every_rank", n=N, batch_size=BATCH_SIZE)

    whole_set = oracle.mean(oracle.values(_padded(world_size)))
    own = [oracle.mean(oracle.values(oracle.shard(N, world_size, r))) for r in range(world_size)]
    oracle.assert_distinct(
        whole_set_padded=whole_set,
        unique_samples=oracle.mean(oracle.values(range(N))),
        **{f"rank{r}_shard": v for r, v in enumerate(own)},
    )
    got = [rec["computed"] for rec in world.records]
    semantics.number("computed mean", got[0], vs=("rank 0's shard mean", own[0]))
    assert got == pytest.approx([whole_set] * world_size), (
        oracle.side_by_side("computed", got) + f"   whole set {whole_set}   " + oracle.side_by_side("own shard", own)
    )
    printed = [sum(line.startswith("mean value:") for line in rank.stdout.splitlines()) for rank in world]
    assert printed == [1] + [0] * (world_size - 1), oracle.side_by_side("lines printed", printed)


def _step_run(run_world, world_size: int, dist_sync_on_step: bool):
    world = run_world(
        hazards.metric_on_step, world_size, dist_sync_on_step=dist_sync_on_step, n=N, batch_size=BATCH_SIZE
    )
    batches = oracle.rank_batches(N, world_size, BATCH_SIZE)
    own = [[sum(oracle.values(batch)) for batch in rows] for rows in batches]
    across = [sum(own[r][i] for r in range(world_size)) for i in range(len(own[0]))]
    epoch = sum(oracle.values(_padded(world_size)))
    oracle.assert_distinct(
        own_first_step_rank0=own[0][0],
        own_first_step_rank1=own[1][0],
        first_step_summed_over_ranks=across[0],
        epoch_sum=epoch,
    )
    steps = [
        [call["metrics"]["total_step"] for call in rec["logged"] if "total_step" in call["metrics"]]
        for rec in world.records
    ]
    epochs = [
        [call["metrics"]["total_epoch"] for call in rec["logged"] if "total_epoch" in call["metrics"]]
        for rec in world.records
    ]
    return world, own, across, epoch, steps, epochs


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_metric_logged_on_step_with_sync_dist_logs_the_ranks_own_batch_value_at_step_level(
    run_world, semantics, world_size
):
    """A ``SumMetric`` called on each batch (``self.total(batch_value)``) and logged with
    ``self.log("total", self.total, on_step=True, on_epoch=True, sync_dist=True)``: each rank's logger
    receives, as ``total_step``, the sum over *its own* batch (``sync_dist=True`` does not sync a metric
    object; the step value is ``Metric.forward``'s batch value), and, as ``total_epoch``, the sum over
    every rank's samples (``compute()`` syncs the states). ``callback_metrics["total"]`` is that
    epoch value on every rank."""
    world, own, _, epoch, steps, epochs = _step_run(run_world, world_size, dist_sync_on_step=False)

    semantics.number("total_step, rank 0, first batch", steps[0][0], vs=("summed over ranks", sum(o[0] for o in own)))
    assert steps == own, oracle.side_by_side("total_step", steps) + "   " + oracle.side_by_side("own batch sums", own)
    assert epochs == [[epoch]] * world_size, oracle.side_by_side("total_epoch", epochs) + f"   expected {epoch}"
    assert [rec["callback_metrics"]["total"] for rec in world.records] == [epoch] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_dist_sync_on_step_makes_the_step_value_the_sum_over_every_ranks_batch_at_that_step(
    run_world, semantics, world_size
):
    """The same with ``SumMetric(dist_sync_on_step=True)``: ``Metric.forward`` syncs the batch state, so
    every rank's ``total_step`` at step ``i`` is the sum over the ``i``-th batch of *every* rank (the same
    on all ranks), and ``total_epoch`` is unchanged: the sum over every rank's samples. ``forward``
    then costs one collective per step: every rank must call the metric at every step."""
    world, own, across, epoch, steps, epochs = _step_run(run_world, world_size, dist_sync_on_step=True)

    semantics.number("total_step, first batch", steps[0][0], vs=("rank 0's own batch", own[0][0]))
    assert steps == [across] * world_size, oracle.side_by_side("total_step", steps) + f"   expected {across}"
    assert epochs == [[epoch]] * world_size, oracle.side_by_side("total_epoch", epochs) + f"   expected {epoch}"


@pytest.mark.parametrize("sync_on_compute", [True, False], ids=["sync_on_compute", "no_sync_on_compute"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_sync_on_compute_false_leaves_a_metric_and_a_metric_collection_logged_with_log_dict_rank_local(
    run_world, semantics, world_size, sync_on_compute
):
    """A ``SumMetric`` logged with ``self.log`` and a ``MetricCollection`` (``SumMetric``, ``MeanMetric``)
    logged with ``self.log_dict``. With the default ``sync_on_compute=True`` every rank's
    ``callback_metrics`` hold the sum and the mean over every rank's samples (padding included); with
    ``sync_on_compute=False`` each rank holds its own shard's sum and mean, with no error and no
    warning: the metric never enters a collective, and ``log_dict`` logs a collection metric by
    metric, so it behaves like each metric logged alone."""
    world = run_world(
        hazards.metric_collection, world_size, sync_on_compute=sync_on_compute, n=N, batch_size=BATCH_SIZE
    )

    shards = [oracle.shard(N, world_size, r) for r in range(world_size)]
    whole = {"sum": sum(oracle.values(_padded(world_size))), "mean": oracle.mean(oracle.values(_padded(world_size)))}
    own = [{"sum": sum(oracle.values(s)), "mean": oracle.mean(oracle.values(s))} for s in shards]
    oracle.assert_distinct(whole_sum=whole["sum"], **{f"rank{r}_sum": o["sum"] for r, o in enumerate(own)})
    # Padding repeats sample 0 first, whose value is 0: at W=2 the padded sum equals the dataset's sum, so
    # only the mean shows that the synced states include the padding.
    oracle.assert_distinct(
        whole_mean=whole["mean"],
        single_process_mean=oracle.mean(oracle.values(range(N))),
        **{f"rank{r}_mean": o["mean"] for r, o in enumerate(own)},
    )
    per_rank = [whole] * world_size if sync_on_compute else own
    expected = [{"alone_sum": v["sum"], "coll_sum": v["sum"], "coll_mean": v["mean"]} for v in per_rank]
    got = [rec["callback_metrics"] for rec in world.records]
    semantics.number("coll_sum on rank 0", got[0]["coll_sum"], vs=("whole-set sum", whole["sum"]))
    assert len(got) == world_size and all(g == pytest.approx(e) for g, e in zip(got, expected)), (
        oracle.side_by_side("callback_metrics", got) + "   " + oracle.side_by_side("expected", expected)
    )
