"""Printing and writing to the logger from a hook: who prints, who writes.

Every rank runs every hook, so a plain ``print`` appears once per rank. ``LightningModule.print`` and
functions decorated with ``rank_zero_only`` run on global rank 0 only
(pytorch_lightning/core/module.py ``LightningModule.print``; lightning_utilities ``rank_zero_only``).
The built-in loggers are rank-zero-only too: on other ranks their ``self.logger.experiment`` is a
``_DummyExperiment`` whose every method does nothing (lightning_fabric/loggers/logger.py
``rank_zero_experiment``), so the seed's ``self.logger.experiment.add_scalar(...)`` from rank 1 leaves no
trace. The Trainer itself calls every logger on every rank: ``_LoggerConnector.log_metrics`` loops over
``trainer.loggers`` and calls ``log_metrics`` and ``save`` with no rank check
(pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py), so a custom ``Logger`` without
``rank_zero_only`` writes once per rank, each rank its own values. Other per-rank output: ``EarlyStopping``'s
messages (``[rank: r]`` prefix) and the progress bar (global rank 0 only, with one rank's totals); the
probe module of those facts is ddpprobe/probes/loggers_per_rank.py, where sample ``i`` logs ``i ** 2``.
"""

import ast
import csv
import io

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import log_spec, loggers_per_rank, validation
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


def _local_epoch_mean(n, world_size, rank, batch_size) -> float:
    """A rank's epoch value of an unsynced ``self.log`` of batch means: the batch-size weighted mean of its
    batches' means, i.e. the mean over its padded shard."""
    return oracle.log_reduce(
        "mean",
        [
            (oracle.mean(oracle.values(b)), len(b))
            for b in oracle.batches(oracle.shard(n, world_size, rank), batch_size)
        ],
    )


@pytest.mark.mirrors("tests_pytorch/trainer/logging_/test_distributed_logging.py::test_all_rank_logging_ddp_cpu")
def test_a_custom_logger_without_rank_zero_only_is_called_on_every_rank_with_each_ranks_own_values(
    run_world, semantics
):
    """A user's ``Logger`` subclass with plain methods, under ``trainer.validate`` at W=2: its
    ``log_metrics`` is called on rank 0 *and* rank 1 (one call each at the epoch's end, and ``save()`` on
    both), and each rank writes its own file line. The unsynced key ``"v"`` carries each rank's local
    mean (6.67 on rank 0, 3.33 on rank 1 for N=5), the synced ``"v_synced"`` the same number on both.
    So a logger that writes to a shared place without ``rank_zero_only`` writes W times. Mirrors
    Lightning's tests_pytorch/trainer/logging_/test_distributed_logging.py::test_all_rank_logging_ddp_cpu
    (ddp_spawn, 2 CPU ranks: "Logger to test all-rank logging (i.e. not just rank 0)"). Source:
    logger_connector.py ``_LoggerConnector.log_metrics``."""
    n, world_size, batch_size = 5, 2, 2
    logs = [log_spec("v"), log_spec("v_synced", sync_dist=True)]
    world = run_world(loggers_per_rank.validate_with_logger, world_size, n=n, batch_size=batch_size, logs=logs)

    local = [_local_epoch_mean(n, world_size, r, batch_size) for r in range(world_size)]
    oracle.assert_distinct(rank0=local[0], rank1=local[1])
    calls = [rec["calls"] for rec in world.records]
    assert [len(c) for c in calls] == [1] * world_size, oracle.side_by_side("log_metrics calls", calls)
    got = [c[0]["metrics"]["v"] for c in calls]
    assert got == pytest.approx(local), oracle.side_by_side("v written", got) + f"  expected each rank's own {local}"
    synced = [c[0]["metrics"]["v_synced"] for c in calls]
    assert synced == pytest.approx([synced[0]] * world_size), oracle.side_by_side("v_synced written", synced)
    assert all(rec["saves"] >= 1 for rec in world.records), oracle.side_by_side("save() calls", world.records)
    lines = [rank.files.get(loggers_per_rank.LOGGER_FILE, "").splitlines() for rank in world]
    written = [[ast.literal_eval(line)["metrics"]["v"] for line in rank_lines] for rank_lines in lines]
    assert written == [[pytest.approx(v)] for v in local], oracle.side_by_side("file lines", lines)
    semantics.number("ranks whose logger wrote", sum(bool(x) for x in lines), vs=("built-in loggers", 1))


@pytest.mark.mirrors("tests_pytorch/trainer/logging_/test_distributed_logging.py::test_all_rank_logging_ddp_cpu")
def test_a_logger_whose_log_metrics_is_rank_zero_only_writes_once_with_rank_0s_value(run_world, semantics):
    """The control: the same logger with ``log_metrics`` decorated by ``rank_zero_only`` (what CSVLogger,
    TensorBoardLogger and the other built-in loggers do): its ``log_metrics`` runs on rank 0 only and
    writes rank 0's local value; rank 1 writes nothing. Source: pytorch_lightning/loggers/csv_logs.py
    ``CSVLogger.log_metrics`` (``@rank_zero_only``); lightning_utilities ``rank_zero_only``."""
    n, world_size, batch_size = 5, 2, 2
    world = run_world(
        loggers_per_rank.validate_with_logger,
        world_size,
        n=n,
        batch_size=batch_size,
        logs=[log_spec("v")],
        rank_zero=True,
    )

    local0 = _local_epoch_mean(n, world_size, 0, batch_size)
    calls = [rec["calls"] for rec in world.records]
    assert [len(c) for c in calls] == [1, 0], oracle.side_by_side("log_metrics calls that ran", calls)
    assert calls[0][0]["metrics"]["v"] == pytest.approx(local0)
    assert [loggers_per_rank.LOGGER_FILE in rank.files for rank in world] == [True, False]
    semantics.number("ranks whose logger wrote", sum(bool(c) for c in calls), vs=("without rank_zero_only", 2))


@pytest.mark.mirrors("tests_pytorch/callbacks/test_early_stopping.py::test_early_stopping_log_info")
@pytest.mark.parametrize("log_rank_zero_only", [False, True])
def test_early_stopping_messages_carry_the_rank_prefix_and_log_rank_zero_only_keeps_rank_0s(
    run_world, semantics, log_rank_zero_only
):
    """``EarlyStopping(verbose=True)`` on a synced ``"v"`` that falls by 1 each epoch: at W=2 every rank logs
    "Metric v improved ..." each epoch, prefixed ``[rank: r]``; with ``log_rank_zero_only=True`` rank 1
    logs nothing. Mirrors Lightning's tests_pytorch/callbacks/test_early_stopping.py::
    test_early_stopping_log_info (a mocked trainer). Source: pytorch_lightning/callbacks/early_stopping.py
    ``EarlyStopping._log_info`` (``rank_prefixed_message`` when ``world_size > 1``)."""
    world_size, epochs = 2, 2
    world = run_world(
        loggers_per_rank.early_stopping_messages, world_size, epochs=epochs, log_rank_zero_only=log_rank_zero_only
    )

    def expected(rank):
        if log_rank_zero_only and rank != 0:
            return []
        return [
            f"[rank: {rank}] Metric v improved. New best score: 10.000",
            f"[rank: {rank}] Metric v improved by 1.000 >= min_delta = 0.0. New best score: 9.000",
        ]

    messages = [rec["messages"] for rec in world.records]
    assert messages == [expected(r) for r in range(world_size)], oracle.side_by_side("EarlyStopping messages", messages)
    semantics.number("ranks logging EarlyStopping messages", sum(bool(m) for m in messages))


@pytest.mark.mirrors(
    "tests_pytorch/callbacks/progress/test_tqdm_progress_bar.py::test_tqdm_progress_bar_disabled_when_not_rank_zero",
    "tests_pytorch/callbacks/progress/test_tqdm_progress_bar.py::test_progress_bar_max_val_check_interval_ddp",
)
def test_the_progress_bar_runs_on_global_rank_0_only_and_counts_one_ranks_batches(run_world, semantics):
    """With the default ``TQDMProgressBar``, rank 1's bar is disabled and rank 0's is not; the totals are
    one rank's batch counts (``ceil(ceil(N/W) / batch size)``: 3 training and 2 validation batches for
    N=10, 7 at W=2, batch size 2), not the dataset's (5 and 4). Mirrors Lightning's
    tests_pytorch/callbacks/progress/test_tqdm_progress_bar.py::test_tqdm_progress_bar_disabled_when_not_rank_zero
    (mocked) and ::test_progress_bar_max_val_check_interval_ddp (2 GPUs). Source:
    pytorch_lightning/callbacks/progress/tqdm_progress.py ``TQDMProgressBar.setup`` (``disable()`` when not
    ``is_global_zero``); progress_bar.py ``total_train_batches`` (``trainer.num_training_batches``)."""
    n, val_n, batch_size, world_size = 10, 7, 2, 2
    world = run_world(loggers_per_rank.fit_with_progress_bar, world_size, n=n, val_n=val_n, batch_size=batch_size)

    per_rank = [len(oracle.batches(oracle.shard(k, world_size, 0), batch_size)) for k in (n, val_n)]
    whole = [len(oracle.batches(list(range(k)), batch_size)) for k in (n, val_n)]
    oracle.assert_distinct(per_rank_train=per_rank[0], whole_train=whole[0])
    oracle.assert_distinct(per_rank_val=per_rank[1], whole_val=whole[1])
    disabled = [rec["disabled"] for rec in world.records]
    assert disabled == [False, True], oracle.side_by_side("progress bar disabled", disabled)
    totals = [[rec["total_train_batches"], rec["total_val_batches"]] for rec in world.records]
    assert totals == [per_rank] * world_size, oracle.side_by_side("totals", totals) + f"  expected {per_rank}"
    semantics.number("training batches on the bar", totals[0][0], vs=("the dataset's", whole[0]))


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors(
    "tests_pytorch/callbacks/progress/test_tqdm_progress_bar.py::test_progress_bar_max_val_check_interval_ddp"
)
def test_the_progress_bar_counts_one_ranks_batches_on_two_gpus(run_world, semantics):
    """test_printing_and_loggers.py::test_the_progress_bar_runs_on_global_rank_0_only_and_counts_one_ranks_batches
    over NCCL. Mirrors tests_pytorch/callbacks/progress/test_tqdm_progress_bar.py::
    test_progress_bar_max_val_check_interval_ddp."""
    test_the_progress_bar_runs_on_global_rank_0_only_and_counts_one_ranks_batches(run_world, semantics)
