"""``trainer.log_dir`` and logger versions per rank: a ``CSVLogger`` without ``version`` picks its version on
each rank from the folders it finds, so a rank that looks after rank 0 has created ``version_0`` holds
``version == 1`` and a ``log_dir`` no one writes; ``trainer.log_dir`` is rank 0's on every rank because it is a
broadcast, and for the same reason it must be read on every rank: read inside a ``@rank_zero_only`` function
it leaves rank 0 alone in a broadcast. What follows depends on the other ranks' next collective: if they
enter one (a barrier after the function, or ``ModelCheckpoint``'s sync when it saves at the epoch end),
no collective matches and the whole world fails at the process-group timeout; if they enter none, they
finish ``fit`` and rank 0's broadcast fails as soon as they leave ("connection closed"), long before it.

Sources: lightning_fabric/loggers/csv_logs.py ``CSVLogger.version`` (``_get_next_version``: one more than the
highest ``version_<n>`` folder, read when ``version`` is first asked), ``CSVLogger.experiment``
(``@rank_zero_experiment``: rank 0 alone creates the folder); pytorch_lightning/trainer/trainer.py
``Trainer.log_dir`` (``self.strategy.broadcast(dirpath)``; its docstring: "You must call this on all
processes. Failing to do so will cause your program to stall forever."); pytorch_lightning/callbacks/
model_checkpoint.py ``ModelCheckpoint.setup`` (broadcasts the resolved ``dirpath``). The probe is
ddpprobe/probes/rank_state.py ``logger_versions``; every rank's logger writes under the world's one folder.
"""

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import rank_state
from tests.support import gloo, oracle

PG_TIMEOUT_S, WORLD_TIMEOUT_S = 2, 40


def _version(n):
    return f"lightning_logs/version_{n}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_csvlogger_without_version_gives_ranks_starting_after_rank_0_the_next_version_and_trainer_log_dir_rank_0s(
    run_world, semantics, world_size
):
    """Rank 0 creates ``lightning_logs/version_0`` before the other ranks make their ``CSVLogger(save_dir)``:
    each of them finds ``version_0`` and takes ``version == 1`` (``logger.log_dir`` ``.../version_1``), for the
    whole run. ``trainer.log_dir`` and the checkpoint folder are broadcast from rank 0, so they say
    ``version_0`` on every rank, and ``version_0`` is the only folder that exists: ``version_1`` is never
    created (only rank 0 writes)."""
    world = run_world(rank_state.logger_versions, world_size, rank0_first=True)

    expected_versions = [0] + [1] * (world_size - 1)
    versions = [rec["version"] for rec in world.records]
    oracle.assert_distinct(rank0=expected_versions[0], others=expected_versions[1])
    semantics.number("rank 1's logger.version", versions[1], vs=("rank 0's", versions[0]))
    assert versions == expected_versions, oracle.side_by_side("logger.version", versions)
    assert [rec["version_before_fit"] for rec in world.records] == expected_versions
    log_dirs = [rec["logger_log_dir"] for rec in world.records]
    assert log_dirs == [_version(v) for v in expected_versions], oracle.side_by_side("logger.log_dir", log_dirs)
    trainer_dirs = [rec["trainer_log_dir"] for rec in world.records]
    assert trainer_dirs == [_version(0)] * world_size, oracle.side_by_side("trainer.log_dir", trainer_dirs)
    dirpaths = [rec["checkpoint_dirpath"] for rec in world.records]
    assert dirpaths == [f"{_version(0)}/checkpoints"] * world_size, oracle.side_by_side("checkpoint dirpath", dirpaths)
    folders = world.records[0]["version_folders"]
    assert sorted(folders) == ["version_0"], folders
    assert "metrics.csv" in folders["version_0"], folders


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_csvlogger_with_an_explicit_version_gives_every_rank_the_same_log_dir(run_world, semantics, world_size):
    """The fix: ``CSVLogger(save_dir, version=0)`` (or any fixed version or name, e.g. from the launcher's job
    id) is not looked up, so every rank's ``logger.version`` and ``logger.log_dir`` match ``trainer.log_dir``
    even when rank 0 created the folder first. (Reading ``trainer.log_dir`` on every rank also gives one
    answer, see above.)"""
    world = run_world(rank_state.logger_versions, world_size, rank0_first=True, version=0)

    versions = [rec["version"] for rec in world.records]
    semantics.number("distinct logger versions", len(set(versions)), vs=("without version=", 2))
    assert versions == [0] * world_size, oracle.side_by_side("logger.version", versions)
    for key in ("logger_log_dir", "trainer_log_dir"):
        got = [rec[key] for rec in world.records]
        assert got == [_version(0)] * world_size, oracle.side_by_side(key, got)


#: The collective the ranks other than 0 enter after the hook's ``@rank_zero_only`` function, and a frame of
#: their traceback that shows it: the probe's barrier in ``on_train_epoch_end``, or (no barrier there)
#: ``ModelCheckpoint``'s ``file_exists`` sync (``reduce_boolean_decision``) when it saves at the epoch end.
LATER_COLLECTIVE = {
    "barrier": ({"barrier_after_read": True}, "on_train_epoch_end"),
    "checkpoint": ({"barrier_after_read": False, "checkpointing": True}, "file_exists"),
}


@pytest.mark.parametrize("later", sorted(LATER_COLLECTIVE))
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.waits_for_timeout
def test_reading_trainer_log_dir_inside_a_rank_zero_only_function_fails_every_rank_at_the_process_group_timeout(
    run_world, semantics, world_size, later
):
    """``@rank_zero_only def save(): path = trainer.log_dir`` at the end of a training epoch, followed on every
    rank by a collective: a barrier after the function, or, without one, ``ModelCheckpoint``'s save at the
    epoch end (its ``file_exists`` sync: a barrier, then an all_reduce). ``log_dir`` is a broadcast that
    rank 0 enters alone while the others enter that barrier, so the collectives do not match and, once the
    process-group timeout (2 s) expires, every rank raises: gloo's timeout, or "Connection closed by peer"
    on a rank whose peer timed out and left first (rank 0 from the broadcast under ``Trainer.log_dir``).
    ddpprobe reports ``RankFailed`` naming every rank."""
    options, frame = LATER_COLLECTIVE[later]
    with pytest.raises(RankFailed) as failure:
        run_world(
            rank_state.logger_versions,
            world_size,
            rank0_first=False,
            read_log_dir="in_rank_zero_only",
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
            **options,
        )

    err = failure.value
    semantics.number("ranks that raised", len(err.ranks), vs=("ranks that read log_dir", 1))
    assert sorted(err.ranks) == list(range(world_size)), f"{err.ranks}\n{err}"
    timed_out = f"Timed out waiting {PG_TIMEOUT_S * 1000}ms"
    assert any(timed_out in message for message in err.rank_errors.values()), err.rank_errors
    for rank in range(world_size):  # the first to time out leaves; its peers may see it go first
        message = err.rank_errors[rank]
        assert timed_out in message or "Connection closed by peer" in message, err.rank_errors
    assert "log_dir" in err.tracebacks[0], err.tracebacks[0]
    # rank 0 waits in the broadcast of Trainer.log_dir, the others in the barrier after the function
    stuck_in = [gloo.collective_in(err.tracebacks[rank]) for rank in range(world_size)]
    assert stuck_in == ["broadcast"] + ["barrier"] * (world_size - 1), oracle.side_by_side("stuck in", stuck_in)
    for rank in range(1, world_size):
        assert frame in err.tracebacks[rank] and "log_dir" not in err.tracebacks[rank], err.tracebacks[rank]


@run_if(backend="gloo")  # gloo fails a collective whose peers left; NCCL would wait until its timeout
@pytest.mark.parametrize("world_size", [2, 3])
def test_reading_trainer_log_dir_inside_a_rank_zero_only_function_with_no_later_collective_fails_rank_0_alone(
    run_world, semantics, world_size
):
    """The same read with no collective after it on the other ranks (no barrier, no checkpointing, nothing
    after ``fit``): they never enter rank 0's broadcast, finish ``fit``, return their records and leave.
    Rank 0's broadcast under ``Trainer.log_dir`` then fails as soon as they close their connections
    ("connection closed" / "reset by peer", not a timeout). ddpprobe reports ``RankFailed`` naming rank 0
    alone, with the other ranks' records: each logger wrote ``version_0``, and their functions did not run."""
    with pytest.raises(RankFailed) as failure:
        run_world(
            rank_state.logger_versions,
            world_size,
            rank0_first=False,
            read_log_dir="in_rank_zero_only",
            barrier_after_read=False,
            checkpointing=False,
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )

    err = failure.value
    semantics.number("ranks that raised", len(err.ranks), vs=("with a later collective", world_size))
    assert err.ranks == [0] and err.exc_types == {0: "RuntimeError"}, f"{err.ranks}\n{err}"
    assert gloo.error_kind(err.rank_errors[0]) == gloo.PEER_GONE, err.rank_errors[0]
    assert "log_dir" in err.tracebacks[0] and gloo.collective_in(err.tracebacks[0]) == "broadcast", err.tracebacks[0]
    finished = err.records[1:]
    assert all(rec is not None for rec in finished), oracle.side_by_side("records", err.records)
    versions = [(rec["version"], rec["logger_log_dir"], rec["read"]) for rec in finished]
    assert versions == [(0, _version(0), [])] * (world_size - 1), oracle.side_by_side("finished ranks", versions)


@pytest.mark.parametrize("world_size", [2, 3])
def test_reading_trainer_log_dir_on_every_rank_and_passing_it_to_the_rank_zero_only_function_finishes(
    run_world, semantics, world_size
):
    """The fix: every rank reads ``trainer.log_dir`` (all enter the broadcast), then only rank 0 uses it:
    the world finishes, and rank 0's function got rank 0's ``log_dir``; the other ranks' functions did not run."""
    world = run_world(rank_state.logger_versions, world_size, rank0_first=False, read_log_dir="on_every_rank")

    read = [rec["read"] for rec in world.records]
    semantics.number("ranks whose function ran", sum(bool(r) for r in read), vs=("ranks", world_size))
    # the world folder starts empty, so rank 0's logger takes version 0 and the broadcast hands it to every rank
    trainer_dirs = [rec["trainer_log_dir"] for rec in world.records]
    assert trainer_dirs == [_version(0)] * world_size, oracle.side_by_side("trainer.log_dir", trainer_dirs)
    assert read == [[_version(0)]] + [[]] * (world_size - 1), oracle.side_by_side("read", read)
