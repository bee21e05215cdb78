"""The guard checks DDP's gradient all-reduces bucket by bucket, like any other collective.

DDP all-reduces gradients from C++ during ``backward``, so a wrapper of ``torch.distributed`` never sees
them; the guard registers a communication hook (ddpprobe/trace/_gradients.py) that checks each bucket
before it reduces it. ``TwoLayers`` (tests/tooling/trace/gradient_modules.py) with manual optimization
leaves out ``self.manual_backward(loss)`` on rank 1 at batch 1: without the guard the other ranks wait in
the gradient all-reduce for a partner that is already at the next batch (gloo pairs it with the next
batch's buckets or fails). With it every rank raises ``CollectiveMismatch`` at that bucket, naming it, the
call that ran it, and rank 1 at the end of batch 1; a ``CollectiveMismatch`` is raised only once every rank
posted, so before the guard's timeout (a ``GuardTimeout`` would be a different type).

Live at W = 2 (the comm hook checking a real bucket in a real backward); at W = 3 the recorded world (the fixture
``failed_world``, tests/support/guard_recordings.py): what each rank posted at that check, the errors computed from
it here by the guard's own verdict.
"""

import inspect

import pytest

from tests.tooling.guard.test_guard_hazards import LIMITS, _guard_errors, _line
from tests.tooling.trace import gradient_modules


def _backward_line() -> str:
    lines, start = inspect.getsourcelines(gradient_modules.TwoLayers.training_step)
    offset = next(i for i, line in enumerate(lines) if "self.manual_backward(loss)" in line)
    return f"gradient_modules.py:{start + offset} in training_step"


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_rank_that_skips_a_backward_raises_collective_mismatch_at_the_gradient_bucket(failed_world, world_size):
    """Rank 1 skips batch 1's backward: every rank raises ``CollectiveMismatch``; the other ranks' side is
    DDP's gradient all_reduce of bucket 0 at the user's ``manual_backward`` line, run by
    ``LightningModule.manual_backward()``, rank 1's the end of batch 1. Live at W = 2, recorded at W = 3."""
    failure = failed_world(
        gradient_modules.fit, world_size, live=world_size == 2, under="guard", skip=[1, 1], n=6 * world_size, **LIMITS
    )
    bucket = "(DistributedDataParallel's gradient all_reduce of bucket 0)"
    for message in _guard_errors(failure, "CollectiveMismatch", list(range(world_size))).values():
        for rank in [r for r in range(world_size) if r != 1]:
            _line(rank, f"{bucket} at {_backward_line()}, run by `LightningModule.manual_backward()`", message)
        _line(1, "is at on_train_batch_end (batch 1, epoch 0", message)
