"""Preemption: a real ``SIGTERM`` delivered to one rank during ``trainer.fit`` (what a cluster manager
sends before it kills a job), and the collective Lightning adds to every training step to share it.

Since 2.5.2 (Lightning #20806, PR #20825) Lightning's ``SIGTERM`` handler sets ``trainer.received_sigterm``
and itself calls ``torch.distributed.broadcast(tensor([1]), src=0)``; at the start of every training step
every rank broadcasts rank 0's flag, and a rank that receives 1 runs a barrier and raises
``SIGTERMException``; a rank whose own flag is set raises it at the end of its current step. So the
outcome depends on which rank gets the signal and when: the handler's broadcast is a collective only that
rank makes, and it pairs with whatever collective the other ranks make next. Before 2.5.2 there was no
broadcast: only the signalled rank raised, and the others went on alone into the next step.

Rank ``target`` sends its own process ``SIGTERM`` at batch 1 of 12 (W = 2) or 8 (W = 3): in
``on_train_batch_end`` (between two steps) or in ``training_step`` (before the step's backward). Every
rank catches what ``fit`` raises and reports it; the process-group timeout is short (5 s; 3 s where the ranks
hang by design), so a rank that would hang fails instead. The probe is ddpprobe/probes/preemption.py.
Sources: pytorch_lightning/trainer/connectors/signal_connector.py ``_SignalConnector._sigterm_notifier_fn``;
pytorch_lightning/loops/training_epoch_loop.py ``_TrainingEpochLoop._broadcast_sigterm_tensor``,
``advance``, ``on_advance_end``; pytorch_lightning/utilities/exceptions.py ``SIGTERMException`` (a
``SystemExit``); pytorch_lightning/trainer/call.py ``_call_and_handle_interrupt``.
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import preemption
from tests.support import gloo, oracle

#: The batch at which the signal is sent, and the short timeouts of these worlds (seconds): a world that
#: stops within ``PG_TIMEOUT_S`` did not hang; one that hangs by design is released after ``HANG_PG_TIMEOUT_S``.
AT_STEP = 1
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 5, 30
HANG_PG_TIMEOUT_S = 3


def _run(run_world, world_size: int, where: str, target: int, pg_timeout: float = PG_TIMEOUT_S):
    return run_world(
        preemption.sigterm_during_fit,
        world_size,
        where=where,
        target_rank=target,
        at_step=AT_STEP,
        timeout=WORLD_TIMEOUT_S,
        pg_timeout=pg_timeout,
    )


def _outcomes(world) -> list:
    """``[(exception class or None, last training_step's batch index)]`` per rank."""
    return [(rec["raised"], rec["steps"][-1] if rec["steps"] else None) for rec in world.records]


@run_if(lightning=">=2.5.2")
@pytest.mark.parametrize("world_size", [2, 3])
def test_sigterm_to_rank_0_between_steps_makes_every_rank_raise_sigterm_exception_before_the_next_step(
    run_world, semantics, world_size
):
    """``SIGTERM`` to rank 0 after step 1: rank 0's handler broadcasts 1, which the other ranks receive in
    the broadcast at the start of step 2; they raise ``SIGTERMException`` there, before ``training_step``
    2, and rank 0 raises it at the end of step 1 (``on_advance_end``). Every rank stops at step 1, well
    within the process-group timeout; only rank 0's own ``received_sigterm`` is set."""
    world = _run(run_world, world_size, "between_steps", target=0)

    got = _outcomes(world)
    semantics.number(
        "ranks raising SIGTERMException", sum(r == "SIGTERMException" for r, _ in got), vs=("W", world_size)
    )
    assert got == [("SIGTERMException", AT_STEP)] * world_size, (
        oracle.side_by_side("(raised, last step)", got) + f"  expected SIGTERMException after step {AT_STEP} everywhere"
    )
    flags = [rec["received_sigterm"] for rec in world.records]
    assert flags == [True] + [False] * (world_size - 1), oracle.side_by_side("received_sigterm", flags)
    seconds = [rec["seconds"] for rec in world.records]
    assert max(seconds) < PG_TIMEOUT_S, oracle.side_by_side("seconds in fit", seconds)


@run_if(lightning=">=2.0", backend="gloo")  # SIGTERMException since 2.0; the text of gloo's error
@pytest.mark.parametrize("world_size, target", [(2, 1), (3, 1), (3, 2)])
def test_sigterm_to_another_rank_between_steps_stops_that_rank_only_and_the_others_fail_in_the_next_step(
    run_world, semantics, world_size, target
):
    """``SIGTERM`` to a rank other than 0 after step 1: its handler's broadcast pairs with the others'
    broadcast at the start of step 2 and receives rank 0's flag, 0, so no other rank learns of the
    signal. That rank raises ``SIGTERMException`` at the end of step 1; the others run step 2 and fail in
    its gradient all_reduce when it leaves (gloo: "Connection closed by peer"), promptly, not at the timeout.
    No rank saves or stops cleanly but the one signalled. The same happened before 2.5.2, without the
    broadcast (checked on 2.5.1)."""
    world = _run(run_world, world_size, "between_steps", target=target)

    got = _outcomes(world)
    expected = [
        ("SIGTERMException", AT_STEP) if r == target else ("RuntimeError", AT_STEP + 1) for r in range(world_size)
    ]
    semantics.number(
        "ranks raising SIGTERMException", sum(r == "SIGTERMException" for r, _ in got), vs=("W", world_size)
    )
    assert got == expected, oracle.side_by_side("(raised, last step)", got) + f"  expected {expected}"
    kinds = [gloo.error_kind(rec["message"]) for r, rec in enumerate(world.records) if r != target]
    assert kinds == [gloo.PEER_GONE] * (world_size - 1), oracle.side_by_side("gloo errors", kinds)
    seconds = [rec["seconds"] for rec in world.records]
    assert max(seconds) < PG_TIMEOUT_S, oracle.side_by_side("seconds in fit", seconds)


@run_if(lightning=">=2.5.2", backend="gloo")  # the text of gloo's timeout; NCCL reports its own
@pytest.mark.waits_for_timeout
@pytest.mark.parametrize("world_size, target", [(2, 0), (2, 1), (3, 0)])
def test_sigterm_during_a_training_step_blocks_every_rank_until_the_process_group_timeout(
    run_world, semantics, world_size, target
):
    """``SIGTERM`` arriving inside ``training_step`` 1 (where a real signal most likely lands): the handler's
    broadcast is made by that rank alone, while the others are in the step's gradient all_reduce, so the
    two collectives pair with each other and neither completes. Every rank blocks until the
    process-group timeout and fails with gloo's timeout (or, where its peers timed out a moment earlier
    and left, with "Connection closed by peer"); no rank raises ``SIGTERMException``."""
    world = _run(run_world, world_size, "mid_step", target=target, pg_timeout=HANG_PG_TIMEOUT_S)

    got = _outcomes(world)
    semantics.number(
        "ranks raising SIGTERMException", sum(r == "SIGTERMException" for r, _ in got), vs=("W", world_size)
    )
    assert got == [("RuntimeError", AT_STEP)] * world_size, oracle.side_by_side("(raised, last step)", got)
    kinds = [gloo.error_kind(rec["message"]) for rec in world.records]
    assert gloo.TIMED_OUT in kinds and set(kinds) <= {gloo.TIMED_OUT, gloo.PEER_GONE}, oracle.side_by_side(
        "gloo errors", kinds
    )
    seconds = [rec["seconds"] for rec in world.records]
    assert min(seconds) >= HANG_PG_TIMEOUT_S * 0.9, oracle.side_by_side("seconds in fit", seconds)


def _between_steps(rec) -> list:
    """Collectives the backend ran between each ``on_train_batch_end`` and the next ``on_train_batch_start``."""
    return [start - end for end, start in zip(rec["ends"], rec["starts"][1:])]


@run_if(lightning=">=2.5.2")
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_training_step_starts_with_one_broadcast_of_the_sigterm_flag_when_w_is_above_1(
    run_world, semantics, world_size
):
    """With no signal at all, the process group's sequence number (``trace.pg_seq``) moves by exactly one
    between the end of a training step and the start of the next at W = 2 and 3: the broadcast of rank 0's
    ``SIGTERM`` flag that ``_TrainingEpochLoop.advance`` runs before fetching every batch (``world_size > 1``
    only, so none at W = 1). The steps' own collectives (the gradient all_reduce) lie inside the step."""
    world = _run(run_world, world_size, "nowhere", target=0)

    per_step = 1 if world_size > 1 else 0
    steps = 24 // (2 * world_size)
    got = [_between_steps(rec) for rec in world.records]
    semantics.number("collectives between two steps", got[0][0], vs=("before 2.5.2", 0))
    assert got == [[per_step] * (steps - 1)] * world_size, (
        oracle.side_by_side("collectives between steps", got) + f"  expected {per_step} before each step"
    )
    assert [rec["raised"] for rec in world.records] == [None] * world_size


@run_if(lightning="<2.5.2")
@pytest.mark.parametrize("world_size", [2, 3])
def test_before_2_5_2_no_collective_runs_between_training_steps(run_world, semantics, world_size):
    """Before 2.5.2 the training loop ran no collective of its own between steps: the sequence number of
    the process group does not move between one step's end and the next one's start."""
    world = _run(run_world, world_size, "nowhere", target=0)

    got = [_between_steps(rec) for rec in world.records]
    semantics.number("collectives between two steps", got[0][0], vs=("since 2.5.2", 1))
    assert got == [[0] * (24 // (2 * world_size) - 1)] * world_size, oracle.side_by_side("between steps", got)


@run_if(lightning=">=2.0,<2.5.2", backend="gloo")  # SIGTERMException since 2.0; the text of gloo's error
@pytest.mark.parametrize("world_size", [2, 3])
def test_before_2_5_2_sigterm_to_rank_0_stops_rank_0_only_and_the_others_fail_in_the_next_step(
    run_world, semantics, world_size
):
    """From 2.0 to 2.5.1 (Lightning #20806): ``SIGTERM`` to rank 0 after step 1 made rank 0 alone raise
    ``SIGTERMException`` at the end of step 1; the other ranks ran step 2 and failed in its gradient
    all_reduce when rank 0 left (under NCCL they wait there until its timeout)."""
    world = _run(run_world, world_size, "between_steps", target=0)

    got = _outcomes(world)
    expected = [("SIGTERMException", AT_STEP)] + [("RuntimeError", AT_STEP + 1)] * (world_size - 1)
    semantics.number(
        "ranks raising SIGTERMException", sum(r == "SIGTERMException" for r, _ in got), vs=("W", world_size)
    )
    assert got == expected, oracle.side_by_side("(raised, last step)", got) + f"  expected {expected}"
    kinds = [gloo.error_kind(rec["message"]) for rec in world.records[1:]]
    assert kinds == [gloo.PEER_GONE] * (world_size - 1), oracle.side_by_side("gloo errors", kinds)
