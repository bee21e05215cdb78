"""Printing and writing to the logger from a hook: who prints, who writes.

Every rank runs every hook, so a plain ``print`` appears once per rank. ``LightningModule.print`` and
functions decorated with ``rank_zero_only`` run on global rank 0 only
(pytorch_lightning/core/module.py ``LightningModule.print``; lightning_utilities ``rank_zero_only``).
The built-in loggers are rank-zero-only too: on other ranks their ``self.logger.experiment`` is a
``_DummyExperiment`` whose every method does nothing (lightning_fabric/loggers/logger.py
``rank_zero_experiment``), so the seed's ``self.logger.experiment.add_scalar(...)`` from rank 1 leaves no
trace. The Trainer itself calls every logger on every rank: a custom ``Logger`` without
``rank_zero_only`` writes once per rank (tests/facts/test_loggers_progress_bar_profiler_per_rank.py).
"""

import csv
import io

import pytest

from ddpprobe.probes import log_spec, validation
from tests.support import oracle


def test_plain_print_appears_once_per_rank_while_self_print_and_rank_zero_only_print_once(run_world, semantics):
    """In ``on_validation_epoch_end``: ``print`` writes on every rank; ``self.print`` and a
    ``rank_zero_only`` function write on rank 0 only."""
    world_size = 3
    world = run_world(validation.validate, world_size, n=6, batch_size=2, prints=True)

    for r, rank in enumerate(world):
        lines = rank.stdout.splitlines()
        assert f"plain print on rank {r}" in lines, rank.stdout
        assert (f"self.print on rank {r}" in lines) == (r == 0), oracle.side_by_side(
            "stdout", [x.stdout for x in world]
        )
        assert (f"rank_zero_only print on rank {r}" in lines) == (r == 0)
    plain = sum(x.stdout.count("plain print on rank") for x in world)
    once = sum(x.stdout.count("self.print on rank") + x.stdout.count("rank_zero_only print") for x in world)
    semantics.number("plain print lines at W=3", plain, vs=("self.print + rank_zero_only lines", once))
    assert (plain, once) == (world_size, 2)


def test_validation_results_table_is_printed_by_rank_0_only(run_world, semantics):
    """``trainer.validate(verbose=True)`` prints its table of logged metrics on global rank 0 only."""
    world = run_world(validation.validate, 2, n=6, batch_size=2, prints=True, logs=[log_spec("v", sync_dist=True)])

    # The table's header names the stage ("Validate metric"; "Runningstage.validating metric" in older
    # releases under Python 3.11); its "DataLoader 0" column is in every release.
    semantics.number("ranks printing the table at W=2", sum("DataLoader 0" in rank.stdout for rank in world))
    assert ["DataLoader 0" in rank.stdout for rank in world] == [True, False]


def test_logger_experiment_on_other_ranks_is_a_no_op_so_the_file_holds_rank_0s_local_value(run_world, semantics):
    """Writing a rank-local value straight to ``self.logger.experiment`` (the seed's pattern): rank 0's
    experiment is the real writer, rank 1's is ``_DummyExperiment``; the file on disk holds rank 0's
    local value only and rank 1 writes nothing."""
    n, world_size = 5, 2
    world = run_world(validation.validate, world_size, n=n, batch_size=2, csv_logger=True, experiment_log=True)

    assert [rec["experiment_type"] for rec in world.records] == ["ExperimentWriter", "_DummyExperiment"]
    local = [oracle.mean(oracle.values(oracle.shard(n, world_size, r))) for r in range(world_size)]
    oracle.assert_distinct(rank0=local[0], rank1=local[1], whole_set=oracle.mean(oracle.values(range(n))))
    rows = list(csv.DictReader(io.StringIO(world[0].files["lightning_logs/version_0/metrics.csv"])))
    written = [float(row["local_mean_direct"]) for row in rows if row.get("local_mean_direct")]
    semantics.number(
        "value in the log file",
        written[0] if written else None,
        vs=("whole-set mean", oracle.mean(oracle.values(range(n)))),
    )
    assert written == pytest.approx([local[0]])
    assert world[1].files == {}
