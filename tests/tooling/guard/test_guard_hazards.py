"""``CollectiveGuard`` turns every collective hazard the facts prove into one clear error at its first step.

Each test runs a hazard of tests/facts/test_collective_hazards_*.py or tests/facts/test_uneven_shards.py
(same LightningModules, tests/support/guarded.py) with ``Trainer(callbacks=[CollectiveGuard()])`` and
checks which error each rank raised and what it names. Without the guard these worlds finish with wrong
values, abort a rank, or wait for the process-group timeout; with it every rank raises the guard's error
(``CollectiveMismatch``, ``PeerFailed``, ``GuardTimeout``) before any collective pairs wrongly. The
process-group timeout here (10 s) is above the guard's (5 s, half of it) and the world's (30 s) above
both: a rank that raised a guard error raised it before the backend's timeout, and the world did not
time out (``pytest.raises(RankFailed)``: a ``WorldTimeout`` is not a ``RankFailed``). The fixed twins
are in test_guard_twins.py. Sources: ddpprobe/guard/_exchange.py (the store protocol),
ddpprobe/guard/_entries.py (the comparison and the words).

Recorded worlds (the fixture ``failed_world``, tests/support/guard_recordings.py): each hazard's world ran live once,
and what each rank posted at the check that differed is stored under tests/recordings/guard/ with each rank's
outcome; the test computes every rank's guard error from those entries again here (``_exchange.verdict``, the
function the live guard calls) and asserts on it as it would on the live world's. Live still: one uneven ``fit``
(where each rank raised, before any gradient all_reduce), one rank-0-only monitored key (a peer's own error reaches
the waiting rank through the store), the guard's timeout and the cheaper mode's run to its end.
"""

import inspect
import re

import pytest

from ddpprobe import RankFailed
from ddpprobe.hazards import fix_line
from ddpprobe.probes import hazards, log_spec
from tests.support import guarded, oracle

#: The process-group timeout and the world's timeout (seconds); the guard waits half the first.
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 10, 30
LIMITS = {"pg_timeout": PG_TIMEOUT_S, "timeout": WORLD_TIMEOUT_S}
#: Uneven shards (tests/facts/test_uneven_shards.py): sample i on rank i % W, every sample its own batch.
N_UNEVEN = 5
KEY_MIX = "The values of different keys would be reduced together"
UNEVEN = "The ranks ran different numbers of batches"


def _guard_errors(err, expected_type: str, ranks: list) -> dict:
    """Each of ``ranks``' error text, after checking it raised ``expected_type`` (the guard's, not gloo's)."""
    assert sorted(err.ranks) == sorted(ranks), f"failed ranks {err.ranks}, expected {ranks}\n{err}"
    got = {r: err.exc_types.get(r) for r in ranks}
    assert got == {r: expected_type for r in ranks}, oracle.side_by_side("error type", list(got.values()))
    return {r: err.rank_errors[r] for r in ranks}


def _sides(message: str) -> dict:
    """``{rank: its side}`` from the guard's lines ``"  rank 1 is at ..."`` / ``"  ranks 0, 2-4 are at ..."``
    (a group's verb read as the singular one)."""
    sides = {}
    for line in message.splitlines():
        found = re.match(r"\s+ranks? ((?:\d+(?:-\d+)?)(?:, \d+(?:-\d+)?)*) (.*)$", line)
        if not found:
            continue
        text = re.sub(r"^are ", "is ", re.sub(r"^wait ", "waits ", found.group(2)))
        for part in found.group(1).split(", "):
            first, _, last = part.partition("-")
            for rank in range(int(first), int(last or first) + 1):
                sides[rank] = sides.get(rank, "") + text
    return sides


def _line(rank: int, text: str, message: str) -> None:
    """``message`` has a line saying ``rank <rank> ...<text>...`` (alone, or in a group of ranks)."""
    assert text in _sides(message).get(rank, ""), f"no line for rank {rank} with {text!r} in:\n{message}"


def _log_keys(failed_world, world_size, hook, plan):
    """The failure of ``guarded.log_keys`` with ``plan`` logged in ``hook`` (recorded)."""
    where = "step_plan" if hook == "validation_step" else "epoch_end_plan"
    return failed_world(guarded.log_keys, world_size, n=3 * world_size, batch_size=2, **{where: plan}, **LIMITS)


# ---------------------------------------------------------------------------------------------
# self.log(..., sync_dist=True): keys per rank, their order, a key only some ranks log
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hook", ["validation_step", "on_validation_epoch_end"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_keys_named_after_the_rank_raise_collective_mismatch_on_every_rank_naming_each_ranks_key(
    failed_world, world_size, hook
):
    """Rank ``r`` logs ``f"loss_rank{r}"`` with ``sync_dist=True``: without the guard every rank's key
    silently holds the all-rank mean. With it, every rank raises ``CollectiveMismatch`` at the first sync,
    its message naming each rank's key, saying the values of different keys would be reduced together, and
    giving the fix with the fact that proves it (the same keys in the same order on every rank). Recorded: the
    ranks' entries at the first sync; the errors are computed from them here."""
    plan = [[[f"loss_rank{r}", float(r)]] for r in range(world_size)]
    failure = _log_keys(failed_world, world_size, hook, plan)

    errors = _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))
    for message in errors.values():
        for r in range(world_size):
            _line(r, f"(self.log epoch sync of 'loss_rank{r}', logged in {hook})", message)
        assert KEY_MIX in message, message
        assert fix_line("keys_differ") in message, message


def test_the_mismatch_names_the_line_each_key_was_logged_from(failed_world):
    """A key synced at the epoch end (Lightning's loop, no user frame on the stack) is named with the
    ``self.log`` call that logged it: ``guarded.py:<line> in validation_step``, the line of
    ``RankKeyModule.validation_step``'s ``self.log``, on both ranks' sides, as the issue's example reads.
    Recorded: the ranks' entries (the line is the one each rank's ``self.log`` recorded live)."""
    failure = failed_world(guarded.rank_keys, 2, **LIMITS)

    source, first = inspect.getsourcelines(guarded.RankKeyModule.validation_step)
    line = first + next(i for i, text in enumerate(source) if "self.log(" in text)
    errors = _guard_errors(failure, "CollectiveMismatch", [0, 1])
    for message in errors.values():
        for r in (0, 1):
            _line(
                r,
                f"barrier (self.log epoch sync of 'loss_rank{r}', logged in validation_step) at guarded.py:{line} "
                "in validation_step",
                message,
            )


@pytest.mark.parametrize("hook", ["validation_step", "on_validation_epoch_end"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_same_keys_in_a_different_order_raise_collective_mismatch_at_the_first_key(failed_world, world_size, hook):
    """Even ranks log ``a`` then ``b``, odd ranks ``b`` then ``a``: without the guard the values are
    swapped between keys, silently. With it every rank raises ``CollectiveMismatch`` at the first sync,
    naming ``a`` on the even ranks and ``b`` on the odd ones. Recorded: the ranks' entries at that sync."""
    plan = [[["a", 1.0], ["b", 2.0]][:: 1 if r % 2 == 0 else -1] for r in range(world_size)]
    failure = _log_keys(failed_world, world_size, hook, plan)

    errors = _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))
    for message in errors.values():
        for r in range(world_size):
            _line(r, f"(self.log epoch sync of '{'a' if r % 2 == 0 else 'b'}'", message)
        assert KEY_MIX in message, message


@pytest.mark.parametrize("hook", ["validation_step", "on_validation_epoch_end"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_key_only_some_ranks_log_raises_collective_mismatch_on_every_rank_not_only_the_crashing_ones(
    failed_world, world_size, hook
):
    """Every rank but the last logs ``extra`` then ``shared``; the last only ``shared``. Without the guard
    the others crash in gloo and the last rank keeps a wrong ``shared`` without an error. With it every
    rank, the last included, raises ``CollectiveMismatch`` at the first sync: ``extra`` against ``shared``.
    Recorded: the ranks' entries at that sync."""
    last = world_size - 1
    plan = [([["extra", 1.0]] if r != last else []) + [["shared", 2.0]] for r in range(world_size)]
    failure = _log_keys(failed_world, world_size, hook, plan)

    errors = _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))
    for message in errors.values():
        for r in range(last):
            _line(r, "(self.log epoch sync of 'extra'", message)
        _line(last, "(self.log epoch sync of 'shared'", message)


# ---------------------------------------------------------------------------------------------
# torchmetrics: compute() on rank 0 only
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_metric_compute_on_rank_0_only_raises_collective_mismatch_on_every_rank_naming_the_metric(
    failed_world, world_size
):
    """``if self.global_rank == 0: self.mean.compute()``: without the guard rank 0 is left alone in the
    metric's state sync and fails when its peers leave. With it every rank raises ``CollectiveMismatch``:
    rank 0 is about to sync ``MeanMetric``'s states at ``compute()``, the others are at a hook boundary,
    and the message says rank 0 would wait in a collective the others do not call, the barrier that opens
    the metric's state sync (torchmetrics/utilities/distributed.py ``gather_all_tensors``). Recorded: the
    ranks' entries at that check."""
    failure = failed_world(guarded.metric_compute, world_size, where="rank0", n=7, batch_size=2, **LIMITS)

    errors = _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))
    for message in errors.values():
        _line(0, "(MeanMetric state sync at compute())", message)
        for r in range(1, world_size):
            _line(r, "is at ", message)
        assert (
            "rank 0 would wait in a collective the other ranks do not call (a barrier for MeanMetric's states)"
            in message
        ), message


# ---------------------------------------------------------------------------------------------
# all_gather of different shapes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_of_different_first_dimensions_raises_collective_mismatch_naming_each_ranks_shape(
    failed_world, world_size
):
    """Rank ``r`` all-gathers ``r + 1`` rows (tests/facts/test_collectives.py): without the guard gloo
    aborts rank 0 ("Received data size doesn't match expected size"). With it every rank raises
    ``CollectiveMismatch`` before the all_gather, naming each rank's shape ``[r + 1, 2]``. Recorded: the ranks'
    entries before the all_gather."""
    failure = failed_world(guarded.gather_rows, world_size, action="uneven", **LIMITS)

    errors = _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))
    for message in errors.values():
        for r in range(world_size):
            _line(r, f"is about to all_gather float32 [{r + 1}, 2]", message)
        assert "contribute tensors of different dtypes or shapes" in message, message


# ---------------------------------------------------------------------------------------------
# Callbacks monitoring a key only rank 0 logs
# ---------------------------------------------------------------------------------------------

#: What Lightning raises on a rank without the monitored key (tests/facts/test_collective_hazards_callbacks.py).
MISSING_KEY = {
    "checkpoint": ("MisconfigurationException", f"`ModelCheckpoint(monitor='{hazards.MONITORED}')` could not find"),
    "early_stopping": ("RuntimeError", f"Early stopping conditioned on metric `{hazards.MONITORED}` which is not"),
}


@pytest.mark.parametrize("callback", sorted(MISSING_KEY))
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_callback_monitoring_a_rank_0_only_key_makes_rank_0_raise_peer_failed_naming_the_others_error(
    failed_world, world_size, callback
):
    """``ModelCheckpoint`` / ``EarlyStopping`` monitoring a key only rank 0 logs: ranks 1.. raise
    Lightning's "key not found" error (no collective there to check) and, without the guard, rank 0 is
    left in ``reduce_boolean_decision`` until it is killed or the process-group timeout expires. With the
    guard rank 0 raises ``PeerFailed`` at once, at that collective, its message quoting the peers' own
    error. Live at W = 2 with ``ModelCheckpoint`` (the peers' ``raised`` entries cross the store); recorded
    otherwise: each rank's entry at that check and the peers' own errors, rank 0's error computed here."""
    live = (world_size, callback) == (2, "checkpoint")
    values = [5.0, 3.0, 4.0, 3.5]
    err = failed_world(guarded.monitor_rank0_key, world_size, live=live, callback=callback, values=values, **LIMITS)
    exc_type, text = MISSING_KEY[callback]
    others = list(range(1, world_size))
    assert err.exc_types == {0: "PeerFailed", **{r: exc_type for r in others}}, f"{err.exc_types}\n{err}"
    message = err.rank_errors[0]
    for r in others:
        assert text in err.rank_errors[r], err.rank_errors[r]
        _line(r, f"raised {exc_type}: {text}", message)
    _line(0, "is about to ", message)
    # gloo (this world's backend) ends the wait when the peer's process exits, and not before it: the sentence
    # says both, and NCCL's, which waits for the timeout either way.
    it = "it" if world_size == 2 else "them"
    wait = message[message.index(f"would wait for {it} in the collective:") :]
    assert wait.index("on gloo until") < wait.index("on NCCL until"), message
    assert "(the closed connection fails the wait at once)" in wait and "until the process-group timeout" in wait


# ---------------------------------------------------------------------------------------------
# Uneven numbers of batches (a user-sharded IterableDataset)
# ---------------------------------------------------------------------------------------------


def _long_and_short(world_size):
    sizes = [len(oracle.modulo_shard(N_UNEVEN, world_size, r)) for r in range(world_size)]
    return (
        [r for r in range(world_size) if sizes[r] == max(sizes)],
        [r for r in range(world_size) if sizes[r] < max(sizes)],
        min(sizes),
    )


def _at_the_short_ranks_last_batch(message: str, stage: str, world_size: int) -> None:
    """The ranks with fewer batches are at the start of their last batch and say so; the others at the
    start of the same batch, with more to come; the fix is equal batch counts, with the fact that proves it."""
    long, short, fewest = _long_and_short(world_size)
    for r in long:
        _line(r, f"is at on_{stage}_batch_start (batch {fewest - 1}, epoch 0)", message)
    for r in short:
        _line(r, f"is at on_{stage}_batch_start (batch {fewest - 1}, epoch 0, this rank's last batch)", message)
    assert UNEVEN in message, message
    assert fix_line("uneven_batches") in message, message


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_batches_in_validate_raise_collective_mismatch_at_the_short_ranks_last_batch(failed_world, world_size):
    """A step-level synced log over uneven shards: without the guard a rank with fewer batches pairs its
    epoch sync with the others' extra step sync and gloo aborts a rank (SIGABRT). With the guard every
    rank raises ``CollectiveMismatch`` at ``on_validation_batch_start`` of the short ranks' last batch:
    Lightning's data fetcher reads one batch ahead (pytorch_lightning/loops/fetchers.py
    ``_PrefetchDataFetcher``), so there a short rank already knows no batch follows, and the ranks
    compare that too. Recorded: the ranks' entries at that batch's start."""
    failure = failed_world(
        guarded.validate_iterable,
        world_size,
        n=N_UNEVEN,
        shard="rank",
        plan=[log_spec("v", on_step=True, sync_dist=True)],
        **LIMITS,
    )

    errors = _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))
    for message in errors.values():
        _at_the_short_ranks_last_batch(message, "validation", world_size)


@pytest.mark.parametrize("collectives", [True, False], ids=["every_collective", "hook_boundaries_only"])
@pytest.mark.parametrize("synced_epoch_log", [False, True], ids=["no_log", "synced_epoch_log"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_batches_in_fit_raise_collective_mismatch_before_ddps_gradient_all_reduce(
    failed_world, world_size, synced_epoch_log, collectives
):
    """``trainer.fit`` over uneven shards: without the guard the ranks with more batches fail in DDP's
    gradient all_reduce of their extra step (or, with a synced epoch log, every rank waits until the
    process-group timeout). With the guard, in either mode, every rank raises ``CollectiveMismatch`` at
    ``on_train_batch_start`` of the short ranks' last batch, before that batch's ``training_step`` and so
    before any gradient all_reduce pairs different steps (DDP makes it from C++, where no Python check
    sees it). Live at W = 2 without a log, every collective checked; recorded otherwise: the ranks' entries at
    that batch's start and each rank's traceback frames (where it raised), the errors computed here."""
    plan = [log_spec("v", on_step=False, on_epoch=True, sync_dist=True)] if synced_epoch_log else []
    live = (world_size, synced_epoch_log, collectives) == (2, False, True)
    err = failed_world(
        guarded.fit_iterable,
        world_size,
        live=live,
        n=N_UNEVEN,
        shard="rank",
        plan=plan,
        collectives=collectives,
        **LIMITS,
    )
    errors = _guard_errors(err, "CollectiveMismatch", list(range(world_size)))
    for message in errors.values():
        _at_the_short_ranks_last_batch(message, "train", world_size)
    for r in range(world_size):
        assert "on_train_batch_start" in err.tracebacks[r] and "backward" not in err.tracebacks[r], err.tracebacks[r]


def test_hook_boundaries_only_do_not_see_keys_named_after_the_rank(run_world):
    """What the cheaper mode (``CollectiveGuard(collectives=False)``) gives up: it compares hook boundaries
    only, so keys named after the rank, synced by Lightning after ``on_validation_epoch_end``'s boundary,
    pass it as they pass without a guard: the run finishes, every rank's key holding the all-rank mean."""
    plan = [[[f"loss_rank{r}", float(2**r)]] for r in range(2)]
    world = run_world(guarded.validate_keys_boundaries_only, 2, n=6, batch_size=2, step_plan=plan, **LIMITS)

    mean = oracle.mean([2.0**0, 2.0**1])
    oracle.assert_distinct(all_rank_mean=mean, rank0_own=1.0, rank1_own=2.0)
    got = [rec["callback_metrics"] for rec in world.records]
    assert got == [{"loss_rank0": mean}, {"loss_rank1": mean}], oracle.side_by_side("callback_metrics", got)
    assert all(rec["checks"] > 0 for rec in world.records), oracle.side_by_side("checks", [r["checks"] for r in world])


# ---------------------------------------------------------------------------------------------
# A rank that does not arrive
# ---------------------------------------------------------------------------------------------


@pytest.mark.waits_for_timeout
def test_a_rank_that_does_not_arrive_within_the_guard_timeout_is_named_with_its_last_check(run_world):
    """Rank 1 sleeps 8 s in its first ``validation_step`` (slow code, or stuck where Python cannot see)
    under ``CollectiveGuard(timeout=2)``. Rank 0, waiting at the batch's end, raises ``GuardTimeout``
    after the guard's 2 s, not the process-group timeout: it names rank 1, where rank 1 was last (the
    start of batch 0) and where rank 0 waits (the end of batch 0). Rank 1, still asleep, is ended by the
    launcher."""
    with pytest.raises(RankFailed) as failure:
        run_world(guarded.slow_rank, 2, slow_rank=1, sleep_s=8.0, guard_timeout=2.0, **LIMITS)

    err = failure.value
    assert err.exc_types.get(0) == "GuardTimeout", f"{err.exc_types}\n{err}"
    message = err.rank_errors[0]
    assert "rank 1 did not arrive within 2 s (CollectiveGuard's timeout" in message, message
    _line(1, "was last at check #", message)
    _line(1, ": is at on_validation_batch_start (batch 0, epoch 0)", message)
    _line(0, ": is at on_validation_batch_end (batch 0, epoch 0)", message)
    # Still asleep when rank 0 failed, rank 1 was ended by the launcher (its sleep outlasts the launcher's grace).
    assert err.rank_errors[1] == "did not finish", err.rank_errors
