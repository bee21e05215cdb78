"""``self.log`` at epoch level with and without ``sync_dist``: what each rank, and the logger, ends with.

Every rank reduces its own logged values over its batches (a batch-size-weighted mean by default).
Without ``sync_dist`` that rank-local number is what the rank keeps; the built-in loggers (CSVLogger
here) write on global rank 0 only, so their files hold rank 0's local number. (The Trainer calls every
logger on every rank; a custom ``Logger`` without ``rank_zero_only`` writes each rank's own number:
tests/facts/test_printing_and_loggers.py.) With ``sync_dist=True`` Lightning all-reduces the
weighted sum and the sample count, so every rank gets the mean over all samples the ranks saw —
padding duplicates included.
Source: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultMetric.compute`` and
``_ResultCollection`` (the sync_dist warning); the built-in loggers are rank-zero-only through their own
``rank_zero_only`` methods and lightning_fabric/loggers/logger.py ``rank_zero_experiment``.
"""

import csv
import io

import pytest

from ddpprobe.probes import log_spec, validation
from tests.support import oracle


def _epoch_row(metrics_csv: str, key: str) -> float:
    rows = [row for row in csv.DictReader(io.StringIO(metrics_csv)) if row.get(key)]
    assert len(rows) == 1, metrics_csv
    return float(rows[0][key])


def test_without_sync_dist_each_rank_keeps_its_own_value_and_only_rank_0s_reaches_the_log_file(run_world, semantics):
    """``self.log("v", ..., sync_dist=False)``: ``callback_metrics["v"]`` is the mean over the rank's own
    shard, different on each rank; the CSV logger (rank 0 only) writes rank 0's local mean; rank 1 writes
    no file; rank 0 gets the "It is recommended to use `self.log('v', ..., sync_dist=True)`" warning."""
    n, world_size = 5, 2
    world = run_world(validation.validate, world_size, n=n, batch_size=2, logs=[log_spec("v")], csv_logger=True)

    local = [oracle.mean(oracle.values(oracle.shard(n, world_size, r))) for r in range(world_size)]
    oracle.assert_distinct(rank0_local=local[0], rank1_local=local[1])
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("rank 0's v", got[0], vs=("rank 1's v", got[1]))
    assert got == pytest.approx(local), oracle.side_by_side("v", got) + f"  expected {local}"

    assert "lightning_logs/version_0/metrics.csv" in world[0].files
    assert all(path.startswith("lightning_logs/version_0/") for path in world[0].files), list(world[0].files)
    assert _epoch_row(world[0].files["lightning_logs/version_0/metrics.csv"], "v") == pytest.approx(local[0])
    assert world[1].files == {}

    hint = "It is recommended to use `self.log('v', ..., sync_dist=True)`"
    counts = [sum(hint in w["message"] for w in rec["warnings"]) for rec in world.records]
    assert counts == [1, 0], oracle.side_by_side("sync_dist warnings", counts)


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset(
    run_world, semantics, world_size, n
):
    """``self.log("v", ..., sync_dist=True)``: every rank gets the same number, the sample mean over all
    samples the ranks evaluated (padding duplicates included). With N not divisible by W this differs
    from the single-process mean over the N unique samples, from either rank's local mean, and from the
    unweighted mean of batch means."""
    world = run_world(validation.validate, world_size, n=n, batch_size=2, logs=[log_spec("v", sync_dist=True)])

    padded_mean = oracle.mean(oracle.values(oracle.padded_indices(n, world_size)))
    single_process_mean = oracle.mean(oracle.values(range(n)))
    batch_means = [
        oracle.mean(oracle.values(b))
        for r in range(world_size)
        for b in oracle.batches(oracle.shard(n, world_size, r), 2)
    ]
    oracle.assert_distinct(
        padded=padded_mean,
        single_process=single_process_mean,
        rank0_local=oracle.mean(oracle.values(oracle.shard(n, world_size, 0))),
        mean_of_batch_means=oracle.mean(batch_means),
    )
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced mean", got[0], vs=("single-process mean", single_process_mean))
    assert got == pytest.approx([padded_mean] * world_size), (
        oracle.side_by_side("v", got)
        + f"  expected padded mean {padded_mean}, single-process mean {single_process_mean}"
    )
    assert all(not any("sync_dist=True" in w["message"] for w in rec["warnings"]) for rec in world.records)
