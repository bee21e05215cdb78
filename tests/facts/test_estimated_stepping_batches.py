"""What does ``trainer.estimated_stepping_batches`` count under DDP? One rank's optimizer steps: its own
shard's batches, divided by ``accumulate_grad_batches``, times the epochs (pytorch_lightning/trainer/trainer.py
``estimated_stepping_batches``).

The module is a ``Linear(2, 1)`` on ``RegressionDataset`` (ddpprobe/probes/stopping_checkpoints_and_schedules.py).
"""

import math

import pytest

from ddpprobe.probes import stopping_checkpoints_and_schedules
from tests.support import oracle


@pytest.mark.mirrors(
    "tests_pytorch/trainer/properties/test_estimated_stepping_batches.py::test_num_stepping_batches_gpu"
)
@pytest.mark.parametrize("world_size, accumulate", [(2, 1), (2, 2), (3, 1)])
def test_estimated_stepping_batches_counts_one_ranks_optimizer_steps(run_world, semantics, world_size, accumulate):
    """``trainer.estimated_stepping_batches`` read in ``configure_optimizers`` (what a OneCycle or warmup
    schedule is sized with) is one rank's count: ``ceil(ceil(ceil(N/W) / batch size) / accumulate) *
    epochs`` (9 for N=10, W=2, batch size 2, 3 epochs), and equals the optimizer steps the run takes, not
    the single-process count (15). Mirrors Lightning's tests_pytorch/trainer/properties/
    test_estimated_stepping_batches.py::test_num_stepping_batches_gpu (world size mocked). Source:
    trainer.py ``Trainer.estimated_stepping_batches`` (``num_training_batches``, per rank)."""
    n, batch_size, epochs = 10, 2, 3
    world = run_world(
        stopping_checkpoints_and_schedules.fit_stepping,
        world_size,
        n=n,
        batch_size=batch_size,
        max_epochs=epochs,
        accumulate_grad_batches=accumulate,
    )

    def steps(samples):
        return math.ceil(math.ceil(samples / batch_size) / accumulate) * epochs

    per_rank = steps(math.ceil(n / world_size))
    oracle.assert_distinct(per_rank=per_rank, single_process=steps(n))
    got = [(rec["estimated"], rec["global_step"]) for rec in world.records]
    assert got == [(per_rank, per_rank)] * world_size, oracle.side_by_side("estimated, taken", got)
    semantics.number("estimated_stepping_batches", got[0][0], vs=("single process", steps(n)))
