"""The default progress bar reads the metrics on global rank 0 only, before the module's
``on_train_epoch_end``, and that read can be the epoch's sync.

``ProgressBar.setup`` disables the bar on every rank but global rank 0; ``TQDMProgressBar
.on_train_epoch_end`` then calls ``get_metrics`` -> ``trainer.progress_bar_metrics`` on rank 0 only, and
the fit loop runs the callbacks' ``on_train_epoch_end`` before the module's (``_FitLoop.on_advance_end``).
Reading the metrics there computes every epoch value not computed yet (see
test_hidden_collectives_metrics_properties.py), so a key logged with ``on_epoch=True, sync_dist=True`` in
``training_step`` is synced on rank 0 by the bar, while the other ranks sync it later, in the
connector's ``on_epoch_end``. A collective in the module's ``on_train_epoch_end`` (a torchmetrics
``compute()``, ``strategy.reduce``, ``self.all_gather``) is then the *second* collective of the hook on
rank 0 and the *first* on the others: with a metric's ``compute()`` every rank is stuck until the
process-group timeout; with ``strategy.reduce`` the run finishes with numbers swapped between the two
collectives. Without the bar (``enable_progress_bar=False``) both are right. The fix, keeping the bar:
read ``trainer.callback_metrics`` on every rank first thing in the hook (on rank 0 the values are
cached, on the others it runs the same sync), then run the collective.

Public reports: Lightning-AI/pytorch-lightning#19604 (``metric.compute()`` in ``on_train_epoch_end``
with the loss logged ``on_epoch``: a deadlock, then NCCL timeouts) and #21264 (the bar's read is a sync
on rank 0 only). The probe is ddpprobe/probes/hidden_collectives.py (``metrics_read`` with
``progress_bar=True``, ``reader="nobody"``).
Sources: pytorch_lightning/callbacks/progress/progress_bar.py ``ProgressBar.setup``, ``get_metrics``;
pytorch_lightning/callbacks/progress/tqdm_progress.py ``TQDMProgressBar.on_train_epoch_end``;
pytorch_lightning/loops/fit_loop.py ``_FitLoop.on_advance_end``;
pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py ``progress_bar_metrics``;
torchmetrics/utilities/distributed.py ``gather_all_tensors``.
"""

import time

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hidden_collectives as hidden
from tests.support import gloo, oracle, upstream

N, BATCH_SIZE = 7, 2
#: The all_gather case fails only after two process-group timeouts (about 4 s; with 4 s timeouts it took
#: 12.5 s at W = 3 under ``pytest -n 2``), so the world timeout leaves it many times that on a loaded machine.
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 2, 40


def _expected(world_size: int) -> dict:
    """The right numbers: ``value`` (every rank's shard's ``id ** 2`` summed), the ``strategy.reduce``
    result (the extras summed), the ``SumMetric`` of sample ids (every rank's ids summed)."""
    shards = [oracle.distributed_sampler_ids(N, world_size, r, shuffle=True) for r in range(world_size)]
    return {
        "own": [sum(oracle.values(s)) for s in shards],
        "extras": [hidden.local_extra(r) for r in range(world_size)],
        "ids": float(sum(sum(s) for s in shards)),
        "own_ids": [float(sum(s)) for s in shards],
    }


def _run(run_world, world_size: int, then: str, progress_bar: bool, read_first: bool = False, **limits):
    return run_world(
        hidden.metrics_read,
        world_size,
        where="on_train_epoch_end",
        reader="nobody",
        then=then,
        progress_bar=progress_bar,
        read_first=read_first,
        n=N,
        batch_size=BATCH_SIZE,
        **limits,
    )


#: Where a rank other than 0 is stuck, by the collective in the module's hook (a file in its traceback).
STUCK_IN = {"metric_compute": "gather_all_tensors", "all_gather": "core/module.py"}

#: The ``torch.distributed`` call rank 0's bar is stuck in: the metric's barrier pairs with the bar's
#: barrier, so rank 0 waits in the all_reduce; a lone all_gather pairs with nothing, so in the barrier.
RANK0_STUCK_IN = {"metric_compute": "all_reduce", "all_gather": "barrier"}


@run_if(backend="gloo")  # the text of gloo's timeout; NCCL reports its own
@pytest.mark.parametrize("then", sorted(STUCK_IN))
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.waits_for_timeout
def test_with_the_progress_bar_a_metric_compute_or_all_gather_in_on_train_epoch_end_sticks_until_the_timeout(
    run_world, semantics, world_size, then
):
    """``self.log("value", v, on_epoch=True, sync_dist=True, reduce_fx="sum")`` in ``training_step`` and
    ``self.ids.compute()`` (a ``SumMetric``) or ``self.all_gather(x)`` in the module's
    ``on_train_epoch_end``, with the default progress bar. Rank 0's bar syncs ``value`` (a barrier, an
    all_reduce); the other ranks' first collective there is the metric's (a barrier, an all_gather) or
    the all_gather. gloo pairs the barriers of the first case, then nothing more: no rank moves. Rank 0
    raises a ``RuntimeError`` at the process-group timeout (here 2 s) from the bar (traceback through
    ``tqdm_progress.py`` and ``_sync_ddp``, ending in the all_reduce, or in the barrier when the others
    run a lone all_gather), with gloo's timeout text (or "connection closed" if a
    peer's own timeout ended it a moment before). Every other rank was waiting in the all_gather of
    torchmetrics' ``gather_all_tensors`` or of ``LightningModule.all_gather``: a rank that raised there the
    same way shows it in its traceback, a rank the launcher ended first in the stack it captured."""
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        _run(
            run_world,
            world_size,
            then,
            progress_bar=True,
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )
    elapsed = time.monotonic() - start

    err = failure.value
    semantics.number("failed after (s)", round(elapsed, 1), vs=("process-group timeout (s)", PG_TIMEOUT_S))
    gloo.assert_stuck_until_the_timeout(err, elapsed, PG_TIMEOUT_S, world_size)
    rank0 = err.tracebacks[0]
    assert "tqdm_progress.py" in rank0 and "progress_bar_metrics" in rank0 and "_sync_ddp" in rank0, rank0
    assert gloo.collective_in(rank0) == RANK0_STUCK_IN[then], rank0
    for rank in range(1, world_size):
        where = gloo.where_waiting(err, rank)
        assert STUCK_IN[then] in where and gloo.collective_in(where) == "all_gather", f"rank {rank}:\n{where}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_with_the_progress_bar_strategy_reduce_in_on_train_epoch_end_swaps_the_two_sums_without_an_error(
    run_world, semantics, world_size
):
    """The same with ``trainer.strategy.reduce(local_extra(rank), "sum")`` (a barrier and an all_reduce,
    like the sync) in the module's hook: the i-th all_reduces pair, so the run finishes, with no error,
    and rank 0's ``value`` = its own shard's sum + the other ranks' extras, the other ranks' ``value`` =
    rank 0's extra + their shards' sums; each rank's reduce returns the other number."""
    world = _run(run_world, world_size, "reduce", progress_bar=True)

    e = _expected(world_size)
    rank0_first = e["own"][0] + sum(e["extras"][1:])
    others_first = e["extras"][0] + sum(e["own"][1:])
    oracle.assert_distinct(
        whole_set=sum(e["own"]), extras=sum(e["extras"]), rank0_value=rank0_first, other_value=others_first
    )
    values = [rec["callback_metrics"][hidden.KEY] for rec in world.records]
    reduced = [rec["then_value"] for rec in world.records]
    semantics.number("value on rank 0", values[0], vs=("whole set", sum(e["own"])))
    assert values == [rank0_first] + [others_first] * (world_size - 1), oracle.side_by_side("value", values)
    assert reduced == [others_first] + [rank0_first] * (world_size - 1), oracle.side_by_side("reduced", reduced)


@upstream.PROGRESS_BAR_SYNC_BUG
@pytest.mark.parametrize("world_size", [2, 3])
def test_with_the_progress_bar_a_collective_in_on_train_epoch_end_gets_the_same_numbers_as_without(
    run_world, semantics, world_size
):
    """What the bar should leave unchanged: with ``strategy.reduce`` in the module's
    ``on_train_epoch_end``, every rank's ``value`` is the sum over every rank's shard and every rank's
    reduce is the sum of the extras, as without the bar (next fact). Fails today: the numbers are swapped
    (previous fact)."""
    world = _run(run_world, world_size, "reduce", progress_bar=True)

    e = _expected(world_size)
    values = [rec["callback_metrics"][hidden.KEY] for rec in world.records]
    reduced = [rec["then_value"] for rec in world.records]
    assert values == [sum(e["own"])] * world_size, oracle.side_by_side("value", values)
    assert reduced == [sum(e["extras"])] * world_size, oracle.side_by_side("reduced", reduced)


@pytest.mark.parametrize(
    "progress_bar, read_first", [(False, False), (True, True)], ids=["without_the_bar", "bar_and_read_first"]
)
@pytest.mark.parametrize("then", ["metric_compute", "reduce"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_without_the_bar_or_reading_the_metrics_first_on_every_rank_every_collective_pairs(
    run_world, semantics, world_size, then, progress_bar, read_first
):
    """With ``enable_progress_bar=False``, or with the bar and ``dict(self.trainer.callback_metrics)``
    first thing in the module's ``on_train_epoch_end`` on every rank (the fix: on rank 0 the bar already
    computed the values, on the others the read runs the same sync), every rank ends with ``value`` =
    the sum over every rank's shard, and the collective returns the right number on every rank: the
    sum of every rank's sample ids (``SumMetric.compute()``) or of the extras (``strategy.reduce``)."""
    world = _run(run_world, world_size, then, progress_bar=progress_bar, read_first=read_first)

    e = _expected(world_size)
    expected_then, rank0_own = (
        (e["ids"], e["own_ids"][0]) if then == "metric_compute" else (sum(e["extras"]), e["extras"][0])
    )
    oracle.assert_distinct(whole_set=sum(e["own"]), rank0_shard=e["own"][0])
    oracle.assert_distinct(every_rank=expected_then, rank0_alone=rank0_own)
    values = [rec["callback_metrics"][hidden.KEY] for rec in world.records]
    got = [rec["then_value"] for rec in world.records]
    semantics.number("value on rank 0", values[0], vs=("rank 0's shard", e["own"][0]))
    # the read first thing in the hook: cached on rank 0 (the bar synced there), the sync itself elsewhere
    first = [rec["first_read_collectives"] for rec in world.records]
    expected_first = [[]] + [["barrier", "all_reduce"]] * (world_size - 1) if read_first else [[]] * world_size
    assert first == expected_first, oracle.side_by_side("collectives the first read ran", first)
    assert values == [sum(e["own"])] * world_size, oracle.side_by_side("value", values)
    assert got == [expected_then] * world_size, oracle.side_by_side(then, got) + f"   expected {expected_then}"
