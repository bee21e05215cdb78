"""Seed question 1: does ``on_validation_epoch_end`` see the outputs of all ranks, or only its own?

Lightning 2.x removed ``validation_epoch_end(outputs)``; the documented replacement is to append step
outputs to a list attribute in ``validation_step`` and read it in ``on_validation_epoch_end``. That list
is an ordinary Python attribute of the module in *this* process: nothing gathers it across ranks.
Source: the migration guide in Lightning-AI/pytorch-lightning PR #16520 and
pytorch_lightning/loops/evaluation_loop.py (no collective touches user attributes).
"""

from collections import Counter

import pytest

from ddpprobe.probes import validation
from tests.support import oracle


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 10)])
def test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end(run_world, semantics, world_size, n):
    """Each rank's ``on_validation_epoch_end`` holds exactly the samples of its own shard, never another
    rank's; only the union over ranks is the whole dataset, and it includes the padding duplicates."""
    world = run_world(validation.validate, world_size, n=n, batch_size=2)

    held = [rec["epoch_end_ids"] for rec in world.records]
    expected = [oracle.shard(n, world_size, r) for r in range(world_size)]
    semantics.number("samples in rank 0's epoch-end list", len(held[0]), vs=("all ranks together", sum(map(len, held))))
    assert held == expected, oracle.side_by_side("epoch end held", held) + f"  expected {expected}"
    union = Counter(sum(held, []))
    assert union == Counter(range(n)) + oracle.duplicates(n, world_size)
    assert all(len(ids) < n for ids in held), "a rank held the whole dataset: outputs were gathered"
