"""A metric in ``ModelCheckpoint(filename=...)``: each rank formats the file name from its *own* metrics, so a
rank-local value (logged with ``sync_dist=False``) gives each rank a different ``best_model_path``, and only
rank 0's names a file that exists.

``ModelCheckpoint._monitor_candidates`` copies this rank's ``trainer.callback_metrics``;
``_update_best_and_save`` names the file with ``format_checkpoint_name(monitor_candidates)`` on every rank and
stores it in ``best_k_models``/``best_model_path``; ``Strategy.save_checkpoint`` writes on global rank 0 only,
under rank 0's name. ``trainer.test(ckpt_path="best")`` then loads each rank's own ``best_model_path``
(trainer/connectors/checkpoint_connector.py ``_parse_ckpt_path``). The reports: Lightning-AI/pytorch-lightning
issues #6716 ("trainer.test error when ModelCheckpoint specifies the filename") and #4319 ("After DDP train
processes have different best val paths"). The default name ``"{epoch}-{step}"`` holds only counters every rank
shares, which is why the facts of tests/facts/test_callbacks.py find one ``best_model_path``.

Rank ``r`` logs ``values[r][epoch]`` (``MonitoredRegressor``, ddpprobe/probes/callbacks.py, the same probe and
tables as tests/facts/test_callbacks.py); the epochs saved come from ``oracle.top1_checkpoint_epochs``.
"""

import pytest

from ddpprobe.probes import callbacks
from tests.support import gloo, oracle

#: values[r][epoch] each rank logs, mode="min", save_top_k=1 (the tables of tests/facts/test_callbacks.py).
CHECKPOINT_CASES = [
    (2, [[5.0, 4.0, 3.0], [6.0, 7.0, 8.0]]),
    (3, [[5.0, 4.0, 3.0], [6.0, 5.0, 7.0], [8.0, 7.0, 6.0]]),
]
N_PER_RANK, BATCH_SIZE = 4, 2
FILENAME = "{epoch}-{monitored:.3f}"


def _name(epoch: int, value: float) -> str:
    """``format_checkpoint_name`` of ``FILENAME`` (``auto_insert_metric_name=True`` writes ``key=``)."""
    return f"rank0/checkpoints/epoch={epoch}-monitored={value:.3f}.ckpt"


def _default_name(epoch: int) -> str:
    """The default ``"{epoch}-{step}"``: ``step`` is the global step after ``epoch``."""
    return f"rank0/checkpoints/epoch={epoch}-step={(epoch + 1) * (N_PER_RANK // BATCH_SIZE)}.ckpt"


def _run(run_world, world_size, values, filename, sync_dist=False, **kwargs):
    return run_world(
        callbacks.model_checkpoint,
        world_size,
        values=values,
        n_per_rank=N_PER_RANK,
        batch_size=BATCH_SIZE,
        filename=filename,
        sync_dist=sync_dist,
        **kwargs,
    )


@pytest.mark.parametrize("world_size, values", CHECKPOINT_CASES)
def test_a_rank_local_metric_in_the_checkpoint_filename_gives_each_rank_its_own_best_model_path_and_one_file(
    run_world, semantics, world_size, values
):
    """``filename="{epoch}-{monitored:.3f}"`` with ``monitored`` logged ``sync_dist=False``: at each save every
    rank names the checkpoint with its own value, so rank ``r``'s ``best_model_path`` and ``best_k_models`` key
    is ``epoch=<e>-monitored=<values[r][e]>.ckpt`` in rank 0's ``dirpath``. Rank 0 alone writes, under its own
    name (and removes its own previous name at the next save), so the folder holds one file, rank 0's, and
    every other rank's ``best_model_path`` names a file that does not exist."""
    world = _run(run_world, world_size, values, FILENAME)

    last = oracle.top1_checkpoint_epochs(values, all)[-1]
    names = [_name(last, row[last]) for row in values]
    oracle.assert_distinct(rank0_value=values[0][last], rank1_value=values[1][last])
    paths = [rec["best_model_path"] for rec in world.records]
    semantics.number("distinct best_model_path values", len(set(paths)), vs=("with the default filename", 1))
    assert paths == names, oracle.side_by_side("best_model_path", paths) + f"  expected {names}"
    best_k = [rec["best_k_models"] for rec in world.records]
    assert best_k == [{name: row[last]} for name, row in zip(names, values)], oracle.side_by_side("best_k", best_k)
    exists = [rec["best_exists"] for rec in world.records]
    assert exists == [True] + [False] * (world_size - 1), oracle.side_by_side("best_model_path exists", exists)
    files = [sorted(rank.files) for rank in world]
    expected_files = [[names[0].removeprefix("rank0/")]] + [[]] * (world_size - 1)
    assert files == expected_files, oracle.side_by_side("files", files)


@pytest.mark.parametrize("world_size, values", CHECKPOINT_CASES)
def test_test_with_ckpt_path_best_fails_on_every_rank_when_the_filename_holds_a_rank_local_metric(
    run_world, semantics, world_size, values
):
    """``trainer.test(ckpt_path="best")`` after that fit: each rank restores its own ``best_model_path``. On
    every rank but 0 the file does not exist and ``trainer.test`` raises ``FileNotFoundError`` naming that
    rank's path; rank 0 loads its file, then waits in its first collective for peers that have left, and
    raises there too (gloo's "Connection closed by peer", or the process-group timeout). No rank runs a test
    batch. (Here the failing ranks record their error and leave; in a user's script they crash, with the
    same result for rank 0.)"""
    world = _run(run_world, world_size, values, FILENAME, test_best=True, timeout=60, pg_timeout=8)

    last = oracle.top1_checkpoint_epochs(values, all)[-1]
    tests = [rec["test"] for rec in world.records]
    semantics.number(
        "ranks whose test(ckpt_path='best') raised",
        sum(t["raised"] is not None for t in tests),
        vs=("ranks", world_size),
    )
    assert [t["ckpt_path"] for t in tests] == [_name(last, row[last]) for row in values], oracle.side_by_side(
        "ckpt_path", tests
    )
    for rank in range(1, world_size):
        assert tests[rank]["raised"] == "FileNotFoundError", oracle.side_by_side("test", tests)
        assert _name(last, values[rank][last]).removeprefix("rank0/") in tests[rank]["message"], tests[rank]
    assert tests[0]["raised"] is not None, oracle.side_by_side("test", tests)
    assert tests[0]["raised"] != "FileNotFoundError", oracle.side_by_side("test", tests)
    # rank 0 fails in a collective whose peers left (or did not come): gloo's words, not an error of its own
    assert gloo.error_kind(tests[0]["message"]) in (gloo.PEER_GONE, gloo.TIMED_OUT), tests[0]
    assert [t["tested_batches"] for t in tests] == [0] * world_size, oracle.side_by_side("test batches", tests)


@pytest.mark.parametrize("world_size, values", CHECKPOINT_CASES)
@pytest.mark.parametrize("filename, sync_dist", [(FILENAME, True), (None, False)], ids=["synced_metric", "default"])
def test_a_filename_every_rank_formats_alike_names_one_best_model_path_and_test_best_loads_it_on_every_rank(
    run_world, semantics, world_size, values, filename, sync_dist
):
    """The fix, and the default for contrast. With ``sync_dist=True`` every rank holds the all-rank mean of
    ``values[.][epoch]``, so every rank formats the same name (``monitored=<mean>``) and takes the same save
    decisions; with the default ``"{epoch}-{step}"`` the name holds only shared counters. Either way every
    rank's ``best_model_path`` is the one file rank 0 wrote, it exists for every rank (one host, one folder),
    and ``trainer.test(ckpt_path="best")`` restores it and runs this rank's test batches
    (``N_PER_RANK / BATCH_SIZE``) on every rank."""
    world = _run(run_world, world_size, values, filename, sync_dist=sync_dist, test_best=True)

    if sync_dist:
        means = [oracle.mean(column) for column in zip(*values)]
        last = oracle.top1_checkpoint_epochs([means] * world_size, all)[-1]
        name = _name(last, means[last])
        oracle.assert_distinct(synced=means[last], rank0_own=values[0][last], rank1_own=values[1][last])
    else:
        last = oracle.top1_checkpoint_epochs(values, all)[-1]
        name = _default_name(last)
    paths = [rec["best_model_path"] for rec in world.records]
    semantics.number("distinct best_model_path values", len(set(paths)), vs=("ranks", world_size))
    assert paths == [name] * world_size, oracle.side_by_side("best_model_path", paths) + f"  expected {name}"
    assert [rec["best_exists"] for rec in world.records] == [True] * world_size
    tests = [rec["test"] for rec in world.records]
    expected = {"raised": None, "message": None, "ckpt_path": name, "tested_batches": N_PER_RANK // BATCH_SIZE}
    assert tests == [expected] * world_size, oracle.side_by_side("test", tests) + f"  expected {expected}"
