"""The launcher itself: worlds run, failures are reported with the rank and its traceback or stack, and
no rank process outlives its world. (ddpprobe/launch/_world.py ``run_world``.)"""

import os

import pytest

from ddpprobe import RankDied, RankFailed, WorldTimeout, run_world as api_run_world
from tests import scenarios


def _gone(pids) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_records_come_back_ordered_by_rank_from_a_real_process_group(run_world, world_size):
    """Each rank is its own process in one gloo process group (an all_reduce of the ranks gives
    0+1+...+(W-1) on every rank); records come back ordered by rank and every process is gone."""
    world = run_world(scenarios.identity, world_size, tag="t")

    assert [rec["rank"] for rec in world.records] == list(range(world_size))
    assert {rec["rank_sum"] for rec in world.records} == {float(sum(range(world_size)))}
    assert len({rec["pid"] for rec in world.records}) == world_size
    assert [rec["env"]["LOCAL_RANK"] for rec in world.records] == [str(r) for r in range(world_size)]
    assert {rec["env"]["WORLD_SIZE"] for rec in world.records} == {str(world_size)}
    assert _gone(world.pids)


def test_a_rank_that_raises_is_reported_with_its_traceback_and_the_others_are_killed(run_world):
    """Rank 1 raises while rank 0 waits in an all_reduce: the failure names rank 1, its exception and
    traceback, arrives long before any timeout, and no rank survives."""
    with pytest.raises(RankFailed) as failure:
        run_world(scenarios.raise_on, 2, rank=1, timeout=60)

    err = failure.value
    assert err.ranks == [1]
    assert err.exc_types == {1: "ValueError"}
    assert "deliberate failure on rank 1" in str(err) and "raise_on" in err.tracebacks[1]
    assert _gone(err.pids)


def test_a_world_that_hangs_is_killed_at_its_timeout_naming_the_stuck_ranks_with_their_stacks(run_world):
    """Rank 1 never enters the all_reduce that rank 0 waits in: at the world timeout both are killed and
    the error names them, with each one's Python stack (rank 1 in ``hang_on``'s sleep)."""
    with pytest.raises(WorldTimeout) as failure:
        run_world(scenarios.hang_on, 2, rank=1, timeout=4, pg_timeout=3.5)

    err = failure.value
    assert 1 in err.ranks
    assert "hang_on" in err.stacks[1] and "time.sleep" in open(scenarios.__file__).read()
    assert "did not finish" in str(err)
    assert _gone(err.pids)


@pytest.mark.parametrize("how, code", [("exit3", 3), ("sigkill", -9), ("segfault", -11)])
def test_a_rank_that_dies_without_an_exception_is_reported_with_its_exit_code(run_world, how, code):
    """``os._exit(3)``, SIGKILL and a segfault on rank 1 are each reported as ``RankDied`` with the rank
    and its exit code (negative: the signal)."""
    with pytest.raises(RankDied) as failure:
        run_world(scenarios.exit_on, 2, rank=1, how=how, timeout=60)

    err = failure.value
    assert err.exitcodes[1] == code
    assert "rank 1" in str(err)
    assert _gone(err.pids)


def test_a_record_json_cannot_hold_is_reported_with_the_key_and_type(run_world):
    with pytest.raises(TypeError, match=r"record\['nested'\]\['value'\] is a Tensor"):
        run_world(scenarios.unserialisable, 1)


def test_the_next_world_in_the_same_process_runs_after_failures(run_world):
    with pytest.raises(RankFailed):
        run_world(scenarios.raise_on, 2, rank=0)
    assert [rec["rank"] for rec in run_world(scenarios.identity, 2).records] == [0, 1]


@pytest.mark.parametrize(
    "kwargs, error, names",
    [
        ({"world_size": 0}, ValueError, "world_size=0"),
        ({"world_size": -2}, ValueError, "world_size=-2"),
        ({"world_size": 2.0}, TypeError, "2.0"),
        ({"world_size": 10_000}, ValueError, "world_size=10000"),
        ({"backend": "mpi"}, ValueError, "'mpi'"),
        ({"timeout": 0}, ValueError, "timeout=0"),
        ({"timeout": -1}, ValueError, "timeout=-1"),
        ({"timeout": 5, "pg_timeout": 5}, ValueError, "pg_timeout=5"),
        ({"start_method": "fork"}, ValueError, "'fork'"),
        ({"no_such_param": 1}, TypeError, "no_such_param"),
    ],
)
def test_bad_arguments_raise_a_clear_error_before_any_process_starts(kwargs, error, names):
    args = {"world_size": 2, **kwargs}
    with pytest.raises(error, match=names.replace("(", r"\(").replace(".", r"\.").replace("[", r"\[")):
        api_run_world(scenarios.identity, **args)


def test_a_lambda_or_closure_is_rejected_as_a_scenario():
    def local(info):
        return {}

    for bad in (lambda info: {}, local):
        with pytest.raises(TypeError, match="not an importable top-level function"):
            api_run_world(bad, 2)
