"""The guard's digest protocol (ddpprobe/guard/_exchange.py) at world sizes beyond two: what one rank costs
the store per check, and that every error keeps its meaning with many ranks.

As in test_guard_protocol.py, each "rank" is a thread holding its own ``Exchange`` on one shared
``torch.distributed.HashStore``; here a proxy around each rank's store counts the requests it makes.
"""

import time

import pytest
import torch.distributed as dist

from ddpprobe.guard import CollectiveMismatch, GuardTimeout, PeerFailed, _entries
from ddpprobe.guard._exchange import Exchange
from tests.support.guard_exchange import JOIN_S, exchanges, in_threads, log_sync

pytestmark = pytest.mark.not_a_fact("tests the guard's store protocol, not a fact about DDP")

#: The store requests one rank makes at an agreeing check (compare_set, add, set, wait, get), at most.
REQUESTS_PER_CHECK = 5


class Counting:
    """A proxy around a rank's store: the requests made through it, by method, and the keys it wrote."""

    def __init__(self, store):
        self._store, self.calls, self.written = store, [], []

    def __getattr__(self, name):
        method = getattr(self._store, name)

        def call(*args):
            self.calls.append(name)
            if name == "set":
                self.written.append(args[0])
            return method(*args)

        return call


def _world(world_size: int, timeout_s: float = 60.0) -> list:
    world = exchanges(world_size, timeout_s)
    for ex in world:
        ex.store = Counting(ex.store)
    return world


def _log_sync(ex, key: str, line: int = 12) -> dict:
    return log_sync(ex, key, line, group_size=ex.world_size)


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_an_agreeing_check_costs_each_rank_at_most_five_store_requests_and_no_entry_whatever_the_world_size(
    world_size,
):
    """Twenty agreeing checks at W = 2, 3 and 8: each rank makes at most five store requests per check (the
    last arrival, which closes the check, a few deletes more in all), the same bound at every world size; no
    rank writes its full entry (``<n>/e/<rank>``) or reads all ``W`` (no ``multi_get``); and the store
    holds ``W`` keys afterwards (``W - 1`` position records and the last verdict), as after two checks."""
    world = _world(world_size)
    for _ in range(20):
        assert in_threads(world, lambda ex: _log_sync(ex, "loss")) == dict.fromkeys(range(world_size))

    calls = [ex.store.calls for ex in world]
    closes = [c.count("delete_key") for c in calls]
    per_check = [(len(c) - d) / 20 for c, d in zip(calls, closes)]
    assert all(p <= REQUESTS_PER_CHECK for p in per_check), per_check
    assert not any("multi_get" in c for c in calls)
    assert not any("/e/" in key for ex in world for key in ex.store.written)
    assert world[0].store.num_keys() == world_size


def test_one_rank_of_eight_with_another_key_makes_every_rank_raise_the_same_mismatch_naming_it():
    """At W = 8 rank 5 syncs ``'b'`` where the seven others sync ``'a'``: the digests differ, every rank
    writes its full entry, and all eight raise the same ``CollectiveMismatch``, the seven named as one side."""
    outcome = in_threads(_world(8), lambda ex: _log_sync(ex, "b" if ex.rank == 5 else "a"))

    assert all(isinstance(e, CollectiveMismatch) for e in outcome.values()), outcome
    assert len({str(e) for e in outcome.values()}) == 1, outcome
    text = str(outcome[0])
    assert "  ranks 0-4, 6, 7 are about to all_reduce float32 [] (self.log sync of 'a'" in text, text
    assert "  rank 5 is about to all_reduce float32 [] (self.log sync of 'b'" in text, text


def test_a_peer_that_raised_wakes_every_waiting_rank_of_four_with_its_error():
    """Rank 2 of four raised (``on_exception`` posts it under its next check): ranks 0, 1 and 3 at that
    check raise ``PeerFailed`` naming rank 2's error, without waiting for their timeout (60 s here)."""
    world = _world(4)
    world[2].post_raised("ValueError: bad batch", "training_step")
    started = time.monotonic()
    outcome = in_threads([world[0], world[1], world[3]], lambda ex: _log_sync(ex, "loss"))

    assert time.monotonic() - started < JOIN_S
    assert all(isinstance(e, PeerFailed) and e.failed == {2: "ValueError: bad batch"} for e in outcome.values())
    assert "rank 2 raised ValueError: bad batch (in training_step)" in str(outcome[0])


def test_two_missing_ranks_of_four_are_named_with_their_own_last_check_even_the_one_that_closed_it():
    """Check 0 passes with rank 3 arriving last (it closes the check, so its position is in the check's
    verdict rather than in a position record); then ranks 2 and 3 stay away. Ranks 0 and 1 raise
    ``GuardTimeout`` naming both, each with its own last check: its call site (line 12 + rank) differs
    from the others' (call sites are named, not compared), so a position taken from another rank would show."""
    world = _world(4, timeout_s=0.5)
    passed = in_threads(world, lambda ex: _log_sync(ex, "loss", 12 + ex.rank), delay_s={3: 0.3})
    assert passed == dict.fromkeys(range(4))
    outcome = in_threads(world[:2], lambda ex: _entries.boundary(ex.n, ex.rank, "on_validation_batch_end", 0, 0))

    for rank, error in outcome.items():
        assert isinstance(error, GuardTimeout), error
        assert error.missing == [2, 3], error
        for missing in (2, 3):
            assert f"model.py:{12 + missing} in validation_step" in error.last_seen[missing], error.last_seen
        assert "ranks 2, 3 did not arrive within 0.5 s" in str(error), error


def test_a_wait_that_times_out_as_the_last_rank_closes_the_check_passes():
    """A rank's wait ran out, but the last arrival set the verdict before the rank claimed it (both ranks
    ``compare_set`` the one verdict key, so only one of them writes it): the rank goes on as if in time,
    and a rank that finds no verdict claims ``differ`` and raises ``GuardTimeout``."""
    world = _world(2, timeout_s=0.2)
    entry = _log_sync(world[0], "loss")
    closed = world[1].store.compare_set("0/v", "", '{"rank": 1, "n": 0, "text": "is about to ..."}')
    assert world[0]._timed_out(0, entry) is None and closed.startswith(b"{")

    with pytest.raises(GuardTimeout):
        world[0]._timed_out(1, _log_sync(world[0], "loss"))
    assert world[0].store.get("1/v") == b"differ"


def test_a_peer_writing_a_checkpoint_is_waited_for_up_to_the_process_group_timeout_then_named_with_it():
    """Rank 1 noted that it is writing a checkpoint (``busy``, from ``on_save_checkpoint``) and never
    arrives. Rank 0, with a guard timeout of 0.2 s and a process-group timeout of 0.6 s, waits on past its
    timeout while rank 1 is busy, up to the process-group timeout, then raises ``GuardTimeout`` naming
    rank 1 and the step it was in, and how long it waited."""
    store = dist.HashStore()
    world = [Exchange(store, 0, r, 2, 0.2, 0.6, "fit") for r in range(2)]
    passed = in_threads(world, lambda ex: _entries.boundary(ex.n, ex.rank, "on_train_epoch_end", 0))
    assert passed == {0: None, 1: None}
    world[1].busy("writing a checkpoint (Trainer.save_checkpoint)")
    started = time.monotonic()
    outcome = in_threads(world[:1], lambda ex: _log_sync(ex, "loss"))
    waited = time.monotonic() - started

    error = outcome[0]
    assert isinstance(error, GuardTimeout) and error.missing == [1], error
    assert 0.6 <= waited < JOIN_S, waited
    assert error.last_seen[1] == "is writing a checkpoint (Trainer.save_checkpoint) (after check #0)", error
    assert "rank 1 did not arrive within 0.6 s" in str(error), error
