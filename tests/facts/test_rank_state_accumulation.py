"""Gradient accumulation and logged step values: with ``accumulate_grad_batches=2`` and ``log_every_n_steps=1``,
a value logged ``on_step=True, on_epoch=True, sync_dist=True`` reaches the logger once per *optimizer* step,
and what it carries is the **last** micro-batch's value (all-reduced over ranks at that micro-batch), not the
mean of the accumulated group. The epoch value is the mean over every micro-batch of every rank.
``outputs["loss"]`` in ``on_train_batch_end`` is the returned loss divided by ``accumulate_grad_batches``,
even for a last group that holds a single micro-batch.

Why: ``_LoggerConnector.update_train_step_metrics`` returns early while ``fit_loop._should_accumulate()``, so
the micro-batches that do not step write nothing; at the stepping micro-batch it writes the current step
value (each ``self.log`` overwrites the forked ``v_step``). The row's ``step`` is
``epoch_loop._batches_that_stepped``, the optimizer steps taken before this one; the epoch row reuses the
last step (pytorch_lightning/loops/fit_loop.py ``on_advance_end``). The loss is divided in
pytorch_lightning/loops/optimization/automatic.py ``ClosureResult.from_training_step_output``
(``closure_loss / normalize`` with ``normalize = trainer.accumulate_grad_batches``). The last batch of an
epoch always steps (pytorch_lightning/loops/training_epoch_loop.py ``_should_accumulate``).

The evidence is the ``CSVLogger`` file rank 0 writes (``lightning_logs/version_0/metrics.csv``); the values
are computed from the batches torch's ``DistributedSampler(shuffle=True, seed=0)`` deals each rank
(``oracle.distributed_sampler_ids``), on data where the last micro-batch, the group mean and the first
micro-batch differ at every step.
"""

import csv
import io
import math

import pytest

from ddpprobe.probes import accumulation
from tests.support import oracle

#: Per rank 9 samples in batches of 2: 5 micro-batches, so 3 optimizer steps with groups (0, 1), (2, 3), (4,). The
#: last micro-batch holds 1 sample, so the epoch mean over samples and the mean of the batch means differ.
N_PER_RANK, BATCH, ACCUMULATE = 9, 2, 2
METRICS_CSV = "lightning_logs/version_0/metrics.csv"


def _rank_batches(n, world_size):
    return [
        oracle.batches(oracle.distributed_sampler_ids(n, world_size, r, epoch=0, shuffle=True, seed=0), BATCH)
        for r in range(world_size)
    ]


def _groups(n_batches):
    """Micro-batch indices of each optimizer step: consecutive groups of ``ACCUMULATE``, the last one shorter."""
    return [list(range(i, min(i + ACCUMULATE, n_batches))) for i in range(0, n_batches, ACCUMULATE)]


def _rows(metrics_csv):
    return list(csv.DictReader(io.StringIO(metrics_csv)))


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_logger_gets_the_last_micro_batchs_synced_value_at_each_optimizer_step_and_the_mean_of_all_per_epoch(
    run_world, semantics, world_size
):
    """One row per optimizer step (``step`` = 0, 1, 2 for the groups (0, 1), (2, 3), (4,)), each holding
    ``v_step`` = the all-rank mean of the batch means at the group's *last* micro-batch; then one epoch row at
    the last step with ``v_epoch`` = the mean over every sample of every rank. Nothing is written for the
    micro-batches that only accumulate. Only rank 0 writes the file."""
    n = N_PER_RANK * world_size
    world = run_world(
        accumulation.accumulate_and_log, world_size, n=n, batch_size=BATCH, accumulate_grad_batches=ACCUMULATE
    )

    batches = _rank_batches(n, world_size)
    assert [rec["ids"] for rec in world.records] == batches
    batch_means = [[oracle.mean(oracle.values(b)) for b in rank] for rank in batches]
    synced = [oracle.mean(rank[i] for rank in batch_means) for i in range(len(batches[0]))]
    groups = _groups(len(batches[0]))
    last = [synced[g[-1]] for g in groups]
    for k, g in enumerate(groups):
        if len(g) > 1:
            oracle.assert_distinct(last=last[k], group_mean=oracle.mean(synced[i] for i in g), first=synced[g[0]])
    epoch_mean = oracle.mean(oracle.values(i for rank in batches for b in rank for i in b))
    mean_of_batch_means = oracle.mean(m for rank in batch_means for m in rank)
    oracle.assert_distinct(
        epoch=epoch_mean, mean_of_batch_means=mean_of_batch_means, mean_of_logged_steps=oracle.mean(last)
    )

    rows = _rows(world[0].files[METRICS_CSV])
    step_rows = [(int(r["step"]), float(r["v_step"])) for r in rows if r["v_step"]]
    epoch_rows = [(int(r["step"]), float(r["v_epoch"])) for r in rows if r["v_epoch"]]
    semantics.number("v_step at the first optimizer step", step_rows[0][1], vs=("group mean", oracle.mean(synced[:2])))
    assert [s for s, _ in step_rows] == list(range(len(groups))), step_rows
    assert [v for _, v in step_rows] == pytest.approx(last, rel=1e-6), f"{step_rows} expected {last}"
    assert epoch_rows == [(len(groups) - 1, pytest.approx(epoch_mean, rel=1e-6))], f"{epoch_rows} vs {epoch_mean}"
    assert [rank.files for rank in world][1:] == [{}] * (world_size - 1), "only rank 0 writes the CSV"
    steps = [rec["optimizer_steps"] for rec in world.records]
    assert steps == [math.ceil(len(batches[0]) / ACCUMULATE)] * world_size, oracle.side_by_side("global_step", steps)


@pytest.mark.parametrize("world_size", [2, 3])
def test_outputs_loss_in_on_train_batch_end_is_the_rank_local_loss_divided_by_accumulate_grad_batches(
    run_world, semantics, world_size
):
    """``outputs["loss"]`` at every micro-batch is this rank's own returned loss (no sync) divided by
    ``accumulate_grad_batches`` = 2, also at the last micro-batch, which forms a group of one and still
    steps the optimizer. ``trainer.global_step`` there counts the optimizer steps taken, the current one
    included once it stepped."""
    n = N_PER_RANK * world_size
    world = run_world(
        accumulation.accumulate_and_log, world_size, n=n, batch_size=BATCH, accumulate_grad_batches=ACCUMULATE
    )

    batches = _rank_batches(n, world_size)
    returned = [[oracle.mean(oracle.values(b)) for b in rank] for rank in batches]
    expected = [[loss / ACCUMULATE for loss in rank] for rank in returned]
    oracle.assert_distinct(divided=expected[0][-1], returned=returned[0][-1])
    for i in range(len(returned[0])):  # a synced loss would differ from every rank's own at every micro-batch
        synced = oracle.mean(rank[i] for rank in returned) / ACCUMULATE
        oracle.assert_distinct(synced=synced, **{f"rank{r}_own": expected[r][i] for r in range(world_size)})
    got = [rec["outputs_loss"] for rec in world.records]
    semantics.number("rank 0's outputs['loss'] at the last micro-batch", got[0][-1], vs=("returned", returned[0][-1]))
    for rank in range(world_size):
        assert got[rank] == pytest.approx(expected[rank], rel=1e-6), oracle.side_by_side("outputs['loss']", got)
    groups = _groups(len(batches[0]))
    steps_after = [k + 1 if i == g[-1] else k for k, g in enumerate(groups) for i in g]
    assert [rec["global_steps"] for rec in world.records] == [steps_after] * world_size
