"""What a failed world reports: every rank's full error text, however long, naming the rank.

A rank that raises sends its exception's full message; a rank that dies in C++ (gloo's or NCCL's
``terminate called ... what(): ...``) leaves the cause in its stderr, followed by faulthandler's dump of
every thread, so the last lines of stderr alone would show only stack frames. ``WorldError.rank_errors``
keeps each failed rank's text, and the error message keeps the stderr lines that say what went wrong
wherever they are. One builder turns the ranks' messages into the result or the error, for launched and
external worlds alike. (ddpprobe/launch/_results.py ``build_result``.)"""

import json
import os
import sys

import pytest

from ddpprobe.launch import (
    STDERR_TAIL_LINES,
    RankDied,
    RankFailed,
    RankMessage,
    WorldResult,
    WorldTimeout,
    build_result,
    run_world as api_run_world,
)
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests the launcher's failure reports, not a fact about DDP")

#: A backend's message longer than the stderr tail an error message shows.
LONG_MESSAGE = "\n".join(
    [f"[gloo/transport/tcp/pair.cc:{500 + i}] Connection closed by peer [127.0.0.1]:{40000 + i}" for i in range(40)]
)
#: What a C++ exception escaping into ``std::terminate`` prints (then the process aborts).
WHAT_LINES = [
    "terminate called after throwing an instance of 'gloo::IoException'",
    "  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:40217: "
    "Connection reset by peer",
]


def raise_long_message(info, rank=1):
    """Rank ``rank`` raises a ValueError whose message is ``LONG_MESSAGE``; the others wait in an all_reduce."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)
    if info.rank == rank:
        raise ValueError(LONG_MESSAGE)
    dist.all_reduce(torch.zeros(1))
    return {}


def abort_after_what(info, rank=1, noise_lines=3 * STDERR_TAIL_LINES):
    """Rank ``rank`` prints what a C++ ``std::terminate`` prints, then many more stderr lines, then
    aborts (SIGABRT; faulthandler adds every thread's stack); the others wait in an all_reduce."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)
    if info.rank == rank:
        sys.stderr.write("\n".join(WHAT_LINES + [f"unrelated log line {i}" for i in range(noise_lines)]) + "\n")
        sys.stderr.flush()
        os.abort()
    dist.all_reduce(torch.zeros(1))
    return {}


def finish_but_one(info, rank=1):
    """After one all_reduce of every rank (so every rank's connections are up: gloo connects them in
    ``init_process_group``, and a rank leaving before a peer's connect would fail that peer there), every
    rank but ``rank`` returns its record; rank ``rank`` enters an all_reduce nobody else enters and fails
    when the others leave (gloo: "Connection closed by peer"). A rank sends its record before it destroys
    its process group (ddpprobe/launch/_rank.py ``rank_main``), so every finished rank's record is sent
    before rank ``rank`` can fail."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)
    dist.all_reduce(torch.zeros(1))
    if info.rank == rank:
        dist.all_reduce(torch.zeros(1))
    return {"rank": info.rank, "squares": [info.rank**2]}


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_failed_world_keeps_the_records_of_the_ranks_that_finished_and_none_for_the_rank_that_raised(
    run_world, world_size
):
    with pytest.raises(RankFailed) as failure:
        run_world(finish_but_one, world_size, rank=1, timeout=60, pg_timeout=20)

    err = failure.value
    assert err.ranks == [1], f"{err.ranks}\n{err}"
    expected = [None if r == 1 else {"rank": r, "squares": [r**2]} for r in range(world_size)]
    assert err.records == expected, err.records


@pytest.mark.integration
def test_an_exception_message_longer_than_the_stderr_tail_is_kept_whole_naming_the_rank(run_world):
    with pytest.raises(RankFailed) as failure:
        run_world(raise_long_message, 2, rank=1, timeout=60)

    err = failure.value
    assert err.ranks == [1]
    assert err.rank_errors[1] == f"ValueError: {LONG_MESSAGE}"
    assert f"rank 1 raised ValueError: {LONG_MESSAGE}" in str(err)


@pytest.mark.integration
def test_a_rank_that_aborts_in_cpp_keeps_the_cause_from_its_stderr_not_only_the_last_lines(run_world):
    """The cause sits far above the end of the rank's stderr (noise, then faulthandler's dump), yet the
    error message and ``rank_errors`` both carry it."""
    with pytest.raises(RankDied) as failure:
        run_world(abort_after_what, 2, rank=1, timeout=60)

    err = failure.value
    assert err.exitcodes == {1: -6}
    stderr = err.outputs[1][1]
    last_lines = "\n".join(stderr.rstrip().splitlines()[-STDERR_TAIL_LINES:])
    for line in WHAT_LINES:
        assert line in stderr and line not in last_lines  # the test is not vacuous
        assert line in str(err)
        assert line in err.rank_errors[1]
    assert err.rank_errors[1].startswith("ended with signal SIGABRT (exit code -6) without reporting a result")


# ---------------------------------------------------------------------------------------------
# The builder alone (no processes): the same messages give the same result, whoever sent them
# ---------------------------------------------------------------------------------------------

WORLD = "world of 2 rank(s) running m:f (backend=gloo)"


def _ok(rank, record, **kw):
    return RankMessage(rank=rank, status="ok", pid=100 + rank, record_json=json.dumps(record), **kw)


def test_messages_of_every_rank_become_a_world_result_ordered_by_rank():
    world = build_result([_ok(1, {"r": 1}, stdout="one"), _ok(0, {"r": 0}, exitcode=0)], WORLD)

    assert isinstance(world, WorldResult)
    assert world.records == [{"r": 0}, {"r": 1}]
    assert [r.stdout for r in world] == ["", "one"] and [r.exitcode for r in world] == [0, None]
    assert world.pids == [100, 101]


def test_a_death_is_reported_as_the_cause_even_when_a_peers_error_arrived_first():
    error = RankMessage(
        rank=0,
        status="error",
        pid=100,
        exc_type="RuntimeError",
        error="Connection closed by peer",
        traceback="Traceback ...",
    )
    died = RankMessage(rank=1, status="died", pid=101, exitcode=-9)

    with pytest.raises(RankDied) as failure:
        build_result([error, died], WORLD, order=[0, 1])

    err = failure.value
    assert err.ranks == [1] and err.exitcodes == {1: -9}
    assert err.rank_errors == {
        0: "RuntimeError: Connection closed by peer",
        1: "ended with signal SIGKILL (exit code -9) without reporting a result",
    }
    assert str(err).startswith(f"{WORLD}: rank(s) [1] died\nrank 0 raised RuntimeError: Connection closed by peer")


def test_every_kind_of_world_error_keeps_each_finished_ranks_record_and_none_for_the_others():
    """``records`` holds one entry per rank, ordered by rank, whichever error the world raises."""
    error = RankMessage(rank=1, status="error", pid=101, exc_type="ValueError", error="bad", traceback="Traceback ...")
    died = RankMessage(rank=1, status="died", pid=101, exitcode=-9)
    stuck = RankMessage(rank=1, status="stuck", pid=101, stack='File "x.py", line 3 in hang')

    for kind, other in ((RankFailed, error), (RankDied, died), (WorldTimeout, stuck)):
        with pytest.raises(kind) as failure:
            build_result([other, _ok(2, {"r": 2}), _ok(0, {"r": 0})], "world of 3", timeout=5)
        assert failure.value.records == [{"r": 0}, None, {"r": 2}], (kind, failure.value.records)


def test_a_rank_still_running_makes_a_timeout_with_its_stack():
    stuck = RankMessage(rank=1, status="stuck", pid=101, stack='File "x.py", line 3 in hang')

    with pytest.raises(WorldTimeout, match=r"timed out after 5s") as failure:
        build_result([_ok(0, {}), stuck], WORLD, timeout=5)

    assert failure.value.stacks == {1: 'File "x.py", line 3 in hang'}
    assert failure.value.rank_errors == {1: "did not finish"}


def test_a_rank_still_running_when_a_peer_raised_leaves_its_stack_on_the_rank_failure():
    """The world ended on a peer's exception, not the timeout: the rank still running has no traceback,
    and ``stacks`` carries where it was, as ``WorldTimeout`` does."""
    error = RankMessage(
        rank=0, status="error", pid=100, exc_type="RuntimeError", error="Timed out waiting", traceback="Traceback ..."
    )
    stuck = RankMessage(rank=1, status="stuck", pid=101, stack='File "x.py", line 3 in hang')

    with pytest.raises(RankFailed) as failure:
        build_result([error, stuck], WORLD)

    err = failure.value
    assert err.ranks == [0] and list(err.tracebacks) == [0]
    assert err.stacks == {1: 'File "x.py", line 3 in hang'}
    assert err.rank_errors[1] == "did not finish"


def test_a_record_json_cannot_hold_is_a_type_error_naming_the_rank():
    bad = RankMessage(rank=1, status="unserialisable", pid=101, error="record['x'] is a Tensor")

    with pytest.raises(TypeError, match=r"rank\(s\) \[1\] returned a record JSON cannot hold\nrank 1: record\['x'\]"):
        build_result([_ok(0, {}), bad], WORLD)


def test_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match=r"status='fine'"):
        RankMessage(rank=0, status="fine")


def test_a_shared_forkserver_that_is_gone_is_reported_naming_its_address_and_the_fix(monkeypatch, tmp_path):
    """A process attached to another process's forkserver (``attach_forkserver``, as every xdist worker
    is) whose server has gone gets a clear error at its next world, not a bare socket error."""
    from ddpprobe.launch import _forkserver

    address = str(tmp_path / "gone.sock")
    monkeypatch.setattr(_forkserver, "_attached", _forkserver._SharedForkServer(address, None))
    with pytest.raises(RuntimeError, match="shared forkserver at .*gone.sock cannot be reached.*--start-method spawn"):
        api_run_world(scenarios.identity, 1, start_method="forkserver")
