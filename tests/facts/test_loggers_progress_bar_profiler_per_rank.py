"""Loggers, log lines, the progress bar and the profiler on every rank, as Lightning's own tests assert
them, in real worlds.

The Trainer calls every logger on every rank: ``_LoggerConnector.log_metrics`` loops over
``trainer.loggers`` and calls ``log_metrics`` and ``save`` with no rank check
(pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py). The built-in loggers write
on global rank 0 only because their own methods are decorated with ``rank_zero_only`` and their
``experiment`` with ``rank_zero_experiment`` (pytorch_lightning/loggers/csv_logs.py,
lightning_fabric/loggers/logger.py); a user's ``Logger`` without them writes W times, each rank its own
values. Other per-rank output: ``EarlyStopping``'s messages (``[rank: r]`` prefix), the progress bar
(global rank 0 only, with per-rank totals) and profiler files (one per local rank).

The probe module is ddpprobe/probes/loggers_per_rank.py; sample ``i`` logs ``i ** 2``.
"""

import ast

import pytest

from ddpprobe.probes import log_spec, loggers_per_rank
from tests.support import oracle


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


def profiler_files(run_world, world_size: int, num_nodes: int, backend=None) -> list:
    """Run ``fit_with_profiler`` on ``world_size`` ranks over ``num_nodes`` nodes; assert every rank wrote one
    report named by its local rank, and nothing else. Returns ``[(global, local rank, [files])]``."""
    world = run_world(
        loggers_per_rank.fit_with_profiler,
        world_size,
        num_nodes=num_nodes,
        backend=backend,
        n=4 * world_size,
        batch_size=2,
    )

    per_node = world_size // num_nodes
    local = [g % per_node for g in range(world_size)]
    got = [(rec["global_rank"], rec["local_rank"], sorted(rank.files)) for rec, rank in zip(world.records, world)]
    want = [(g, local[g], [f"fit-perf-{local[g]}.txt"]) for g in range(world_size)]
    assert got == want, oracle.side_by_side("global rank, local rank, files", got)
    assert all("Action" in rank.files[f"fit-perf-{local[rank.rank]}.txt"] for rank in world), (
        "a report without its table"
    )
    return got


@pytest.mark.mirrors("tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp")
def test_the_profiler_writes_one_file_per_rank_named_by_its_local_rank(run_world, semantics):
    """``Trainer(profiler=SimpleProfiler(dirpath=".", filename="perf"))`` on 2 nodes of 2 ranks (forked
    "nodes" on this host, ``num_nodes=2``): every rank writes its own report in its own working directory,
    named by its *local* rank: global ranks 0 and 2 write ``fit-perf-0.txt``, 1 and 3 ``fit-perf-1.txt``
    (not ``fit-perf-2.txt``, ``fit-perf-3.txt``, as a global rank would name them), and nothing else there.
    So on a shared file system two nodes write the same names. Mirrors Lightning's
    tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp (2 GPUs, one node,
    ``PyTorchProfiler``: the file name comes from the same base class). Source:
    pytorch_lightning/profilers/profiler.py ``Profiler._prepare_filename`` (stage, filename, local rank);
    pytorch_lightning/trainer/trainer.py (``profiler.setup(..., local_rank=...)``)."""
    world_size, num_nodes = 4, 2
    global_named = [f"fit-perf-{g}.txt" for g in range(world_size)]
    got = profiler_files(run_world, world_size, num_nodes, backend="gloo")  # forked nodes share this host: gloo

    assert [files for _, _, files in got] != [[name] for name in global_named], "local and global rank must differ"
    names = {f for _, _, files in got for f in files}
    semantics.number("profiler file names on 2 nodes of 2", len(names), vs=("ranks", world_size))
