"""The guard's store protocol (ddpprobe/guard/_exchange.py) and its arguments, without a process group.

Each "rank" here is a thread holding its own ``Exchange`` on one shared ``torch.distributed.HashStore``:
the same calls the ranks of a world make on the world's ``TCPStore``, so the protocol's rules (compare
every rank's entry of a check, wake at once on a peer's ``raised`` entry, name a missing rank with its
last check, keep about two entries per rank in the store) are checked in milliseconds.
"""

import types

import pytest

from ddpprobe.guard import CollectiveGuard, CollectiveMismatch, GuardTimeout, PeerFailed, _entries
from ddpprobe.trace import describe_collective
from tests.support.guard_exchange import exchanges, in_threads, log_sync

pytestmark = pytest.mark.not_a_fact("tests the guard's store protocol, not a fact about DDP")

#: The guard timeout of checks that are expected to be answered at once.
TIMEOUT_S = 60


def _world(world_size: int, timeout_s: float = TIMEOUT_S) -> list:
    return exchanges(world_size, timeout_s)


def test_matching_checks_pass_and_the_store_keeps_one_entry_per_rank():
    """Ten checks with the same entry on both ranks all pass, and each rank deleted its entry of every
    check but the last: the store holds ``W`` keys, however long the run."""
    world = _world(2)
    for _ in range(10):
        assert in_threads(world, lambda ex: log_sync(ex, "loss")) == {0: None, 1: None}
    assert world[0].store.num_keys() == 2


def test_different_keys_raise_the_same_collective_mismatch_on_both_ranks_naming_each_side():
    """Rank 0 syncs ``'a'``, rank 1 ``'b'`` at the same check: both raise ``CollectiveMismatch`` with the
    same text, naming each rank's key and call site in ``describe_collective``'s words, the function the
    audit's divergence report uses."""
    outcome = in_threads(_world(2), lambda ex: log_sync(ex, "ab"[ex.rank]))

    assert all(isinstance(e, CollectiveMismatch) for e in outcome.values()), outcome
    assert str(outcome[0]) == str(outcome[1])
    for rank, key in ((0, "a"), (1, "b")):
        side = f"rank {rank} is about to all_reduce float32 [] (self.log sync of '{key}', logged in validation_step)"
        assert f"  {side} at model.py:12 in validation_step" in str(outcome[0]), outcome[0]
        # the audit's words for the same collective: one function for both
        event = {"op": "all_reduce", "dtype": "float32", "shape": [], "source": "self.log", "key": key}
        event.update(hook="validation_step", call_site="model.py:12 in validation_step")
        assert f"  rank {rank} is about to {describe_collective(event)}\n" in str(outcome[0]) + "\n"
    assert outcome[0].check == 0 and set(outcome[0].sides) == {0, 1}


def test_a_guard_error_the_caller_swallowed_is_raised_again_at_the_next_check():
    """Lightning calls some collectives inside ``try: ... except Exception`` (its SIGTERM broadcast):
    after a mismatch, the rank's next check raises the same error again instead of going on."""
    world = _world(2)
    first = in_threads(world, lambda ex: log_sync(ex, "ab"[ex.rank]))
    with pytest.raises(CollectiveMismatch) as again:
        world[0].check(_entries.boundary(world[0].n, 0, "on_validation_batch_end", 0, 0))
    assert again.value is first[0]


def test_a_peer_that_raised_wakes_the_waiting_rank_at_once_with_its_error():
    """Rank 1 raises in a hook and posts its error (``on_exception``): rank 0, waiting at the check
    rank 1 never makes, raises ``PeerFailed`` naming rank 1's error, without waiting for its timeout."""
    world = _world(2)
    world[1].post_raised("MisconfigurationException: could not find the monitored key", "on_validation_end")
    outcome = in_threads(world[:1], lambda ex: log_sync(ex, "loss"))

    error = outcome[0]
    assert isinstance(error, PeerFailed), error
    assert error.failed == {1: "MisconfigurationException: could not find the monitored key"}
    assert "rank 1 raised MisconfigurationException: could not find the monitored key (in on_validation_end)" in str(
        error
    )


def test_a_missing_rank_is_named_with_its_last_check_and_a_late_arrival_learns_of_the_timeout():
    """Both ranks pass check 0; rank 1 then stays away. Rank 0 raises ``GuardTimeout`` after the guard's
    timeout, naming rank 1 with its last check (check 0's entry) and its own waiting side, and where rank 1
    may be (slow code, a collective the guard does not check: not DDP's gradient all-reduces, which its
    comm hook checks, or gone). When rank 1
    arrives at check 1 later it raises ``PeerFailed`` quoting rank 0's timeout instead of going on alone."""
    world = _world(2, timeout_s=0.5)
    in_threads(world, lambda ex: _entries.boundary(ex.n, ex.rank, "on_validation_batch_start", 0, 0))
    waited = in_threads(world[:1], lambda ex: _entries.boundary(ex.n, 0, "on_validation_batch_end", 0, 0))

    error = waited[0]
    assert isinstance(error, GuardTimeout), error
    assert error.missing == [1] and error.last_seen == {1: "is at on_validation_batch_start (batch 0, epoch 0)"}
    assert "rank 1 was last at check #0: is at on_validation_batch_start (batch 0, epoch 0)" in str(error)
    assert "rank 0 waits at check #1: is at on_validation_batch_end (batch 0, epoch 0)" in str(error)
    # where the missing rank can be: not in DDP's gradient all-reduces, which the comm hook checks
    assert "in a collective the guard does not check (e.g. DistributedDataParallel's buffer broadcast" in str(error)
    assert "only DDP's gradient all-reduces are checked, bucket by bucket" in str(error), error
    assert "gradient all_reduce in backward" not in str(error), error
    late = in_threads(world[1:], lambda ex: _entries.boundary(ex.n, 1, "on_validation_batch_end", 0, 0))
    assert isinstance(late[1], PeerFailed) and "rank 1 did not reach check #1" in str(late[1]), late


@pytest.mark.parametrize("timeout", [0, -1.0, "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused_naming_it(timeout):
    with pytest.raises(ValueError, match=rf"CollectiveGuard\(timeout={timeout!r}\): use a positive number"):
        CollectiveGuard(timeout=timeout)


def test_collectives_must_be_a_bool():
    with pytest.raises(ValueError, match=r"CollectiveGuard\(collectives='no'\): use True or False"):
        CollectiveGuard(collectives="no")


def test_a_timeout_not_below_the_process_group_timeout_is_refused_naming_both():
    """The guard must answer before the backend does: ``timeout=20`` under ``DDPStrategy(timeout=10 s)``
    raises, naming both and the two ways out; without ``timeout`` the guard waits half the
    process-group timeout, at most 300 s."""
    import datetime

    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(_timeout=datetime.timedelta(seconds=10)))
    with pytest.raises(ValueError, match=r"timeout=20\) is not below the process-group timeout \(10 s\)"):
        CollectiveGuard(timeout=20)._timeouts(trainer)
    assert CollectiveGuard()._timeouts(trainer) == (5.0, 10.0)
    trainer.strategy._timeout = datetime.timedelta(minutes=30)
    assert CollectiveGuard()._timeouts(trainer) == (300.0, 1800.0)


@pytest.mark.parametrize(
    "ranks, text", [([3], "rank 3"), ([2, 0], "ranks 0, 2"), ([0, 1, 2, 3, 5], "ranks 0-3, 5"), ([4, 5], "ranks 4, 5")]
)
def test_ranks_are_named_in_runs(ranks, text):
    assert _entries.ranks_text(ranks) == text


def test_a_guard_crosses_a_pickle_with_its_settings_only():
    """``strategy="ddp_spawn"`` pickles the Trainer's callbacks into new processes: a guard keeps its
    ``timeout`` and ``collectives`` and nothing of a session."""
    import pickle

    copy = pickle.loads(pickle.dumps(CollectiveGuard(timeout=7, collectives=False)))
    assert (copy.timeout, copy.collectives, copy.checks, copy._exchange) == (7.0, False, 0, None)
