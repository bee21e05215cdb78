"""What does ``lr_find`` give each rank under DDP? Rank 0's results, broadcast: every rank ends with rank 0's
smoothed loss curve and the same learning rate (pytorch_lightning/tuner/lr_finder.py ``_lr_find``).

The module is a ``Linear(2, 1)`` on ``RegressionDataset`` (ddpprobe/probes/stopping_checkpoints_and_schedules.py).
"""

import pytest

from ddpprobe.probes import stopping_checkpoints_and_schedules
from tests.support import oracle


def _lr_finder_smoothed(losses, beta=0.98) -> list:
    """The losses ``lr_find`` records for one rank's step losses: a running average with momentum
    ``beta``, divided by ``1 - beta ** (global_step + 1)`` where the global step, read after the
    optimizer step, is ``k + 1`` at step ``k``. Source: pytorch_lightning/tuner/lr_finder.py
    ``_LRCallback.on_train_batch_end``."""
    avg, out = 0.0, []
    for k, loss in enumerate(losses):
        avg = beta * avg + (1 - beta) * loss
        out.append(avg / (1 - beta ** (k + 2)))
    return out


@pytest.mark.mirrors("tests_pytorch/tuner/test_lr_finder.py::test_lr_finder_with_ddp")
def test_lr_find_under_ddp_gives_every_rank_rank_0s_loss_curve_and_the_same_learning_rate(run_world, semantics):
    """``Tuner(trainer).lr_find(model)`` at W=2: each rank trains on its own shard, so the ranks' losses
    differ, but every rank ends with the same ``results`` (the smoothed loss curve of rank 0's losses, not
    rank 1's), the same suggestion and the same ``model.lr``. Mirrors Lightning's
    tests_pytorch/tuner/test_lr_finder.py::test_lr_finder_with_ddp (standalone, 2 CPU ranks; it checks the
    same lr on every rank). Source: pytorch_lightning/tuner/lr_finder.py ``_lr_find``
    (``lr_finder.results = trainer.strategy.broadcast(lr_finder.results)``)."""
    world_size, steps = 2, 20
    world = run_world(stopping_checkpoints_and_schedules.find_lr, world_size, num_training=steps)

    curves = [_lr_finder_smoothed(rec["losses"]) for rec in world.records]
    oracle.assert_distinct(rank0_first=curves[0][0], rank1_first=curves[1][0])
    for rec in world.records:
        assert len(rec["losses"]) == steps, rec["losses"]
        assert rec["results_loss"] == pytest.approx(curves[0], rel=1e-6), (
            oracle.side_by_side("results['loss'][:3]", [r["results_loss"][:3] for r in world.records])
            + f"  expected rank 0's {curves[0][:3]}, rank 1's would be {curves[1][:3]}"
        )
    lrs = [(rec["suggestion"], rec["lr"]) for rec in world.records]
    assert lrs[0][0] is not None and lrs[0][0] == lrs[0][1], lrs
    assert lrs == [lrs[0]] * world_size, oracle.side_by_side("suggestion, model.lr", lrs)
    semantics.number("learning rate chosen", lrs[0][1])
