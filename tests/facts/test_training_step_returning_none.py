"""What happens under DDP when ``training_step`` returns None to skip a batch? It raises, but only on the rank
that returned it, while its peers go on into the backward's gradient all_reduce; at W = 1 the batch is skipped.

The check is the rank's own (``trainer.world_size > 1``) (pytorch_lightning/loops/optimization/automatic.py
``_AutomaticOptimization._training_step``). The module is a ``Linear(2, 1)`` on ``RegressionDataset``
(ddpprobe/probes/stopping_checkpoints_and_schedules.py).
"""

import pytest

from ddpprobe import RankFailed, _lightning
from ddpprobe.probes import stopping_checkpoints_and_schedules

NONE_MESSAGE = "Skipping the `training_step` by returning None in distributed training is not supported"


def lightning_file(path: str) -> str:
    """``path`` in the trainer package ddpprobe runs: ``pytorch_lightning/<path>`` or ``lightning/pytorch/<path>``."""
    return _lightning.PACKAGES[_lightning.chosen()][0].replace(".", "/") + "/" + path


@pytest.mark.mirrors("tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed")
def test_returning_none_from_training_step_on_one_rank_raises_there_while_its_peer_waits_in_backward(run_world):
    """Rank 1 returns None from ``training_step`` at batch 1, rank 0 returns its loss: rank 1 raises
    ``RuntimeError: Skipping the `training_step` by returning None in distributed training is not
    supported``; rank 0 raises nothing and is found, when the world is ended, inside ``backward`` (the
    DDP gradient all_reduce rank 1 never joins): under a launcher that does not end the world it waits
    there until the connection closes or the process-group timeout. Lightning's
    tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed sets
    ``trainer.strategy.world_size = 2`` in one process, so it cannot show that the check is per rank.
    Source: pytorch_lightning/loops/optimization/automatic.py ``_AutomaticOptimization._training_step``."""
    with pytest.raises(RankFailed) as failure:
        run_world(stopping_checkpoints_and_schedules.fit_none_step, 2, none_ranks=[1], none_at=1, n=8)

    err = failure.value
    assert err.exc_types == {1: "RuntimeError"}, err.exc_types
    assert NONE_MESSAGE in err.rank_errors[1], err.rank_errors[1]
    assert err.rank_errors[0] == "did not finish", err.rank_errors
    stack = err.stacks.get(0, "")
    strategy_file = lightning_file("strategies/strategy.py")
    frames = [line for line in stack.splitlines() if strategy_file in line and line.endswith(" in backward")]
    assert frames, f"rank 0 is not in {strategy_file} Strategy.backward:\n{stack}"


@pytest.mark.mirrors("tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed")
def test_returning_none_on_every_rank_at_the_same_batch_raises_on_every_rank(run_world, semantics):
    """When every rank returns None at the same batch, every rank raises the same ``RuntimeError`` at once
    and none is left waiting. Mirrors test_automatic_loop.py::test_skip_training_step_not_allowed.
    Source: automatic.py ``_AutomaticOptimization._training_step``."""
    with pytest.raises(RankFailed) as failure:
        run_world(stopping_checkpoints_and_schedules.fit_none_step, 2, none_ranks=[0, 1], none_at=1, n=8)

    err = failure.value
    semantics.number("ranks raising", len(err.exc_types), vs=("when one rank returns None", 1))
    assert err.exc_types == {0: "RuntimeError", 1: "RuntimeError"}, err.exc_types
    assert all(NONE_MESSAGE in err.rank_errors[r] for r in (0, 1)), err.rank_errors


@pytest.mark.mirrors("tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed")
def test_in_a_world_of_one_rank_returning_none_skips_the_batch_without_an_error(run_world, semantics):
    """The control: at W=1 (``strategy="ddp"``, one rank) the same None is allowed; the epoch runs all
    four batches. Source: automatic.py (the check needs ``trainer.world_size > 1``)."""
    world = run_world(stopping_checkpoints_and_schedules.fit_none_step, 1, none_ranks=[0], none_at=1, n=8)

    assert world.records[0]["steps"] == [0, 1, 2, 3], world.records
    semantics.number("training batches run at W=1", len(world.records[0]["steps"]))
