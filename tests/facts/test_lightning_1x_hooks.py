"""Lightning 1.x: what ``validation_step_end`` and ``validation_epoch_end(outputs)`` receive under ddp.

Answers written for Lightning 1.x say "return outputs from ``validation_step`` and compute the metric
over the whole set in ``validation_epoch_end(outputs)``", or "combine them in ``validation_step_end``".
Under ddp neither hook ever sees another rank's data: ``outputs`` is the list this rank's evaluation
loop appended to, and ``validation_step_end`` is handed this rank's own step output (the gathering
the 1.x docs describe for ``validation_step_end`` is DataParallel's, across the sub-batches of *one*
process). These facts apply to pytorch-lightning <2.0; their 2.x counterparts (the hooks raise or are
never called) are in ``tests/facts/test_removed_hooks.py``.
Source (1.9.5): pytorch_lightning/loops/epoch/evaluation_epoch_loop.py ``_evaluation_step_end`` and
``advance`` (``self._outputs.append(output)``), pytorch_lightning/loops/dataloader/evaluation_loop.py
``_evaluation_epoch_end``, and ``Strategy.validation_step_end`` (returns its argument unchanged;
only ``DataParallelStrategy`` reduces).
"""

from collections import Counter

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import legacy_hooks
from tests.support import oracle

pytestmark = run_if(lightning="<2.0")


@pytest.mark.parametrize("world_size, n", [(1, 5), (2, 5), (3, 10)])
def test_validation_epoch_end_receives_only_the_ranks_own_outputs(run_world, semantics, world_size, n):
    """``validation_epoch_end(outputs)`` is called once per rank with that rank's own ``validation_step``
    returns, one per batch of its shard (padding duplicates included); no rank's ``outputs`` holds
    another rank's samples, and only the union over ranks covers the dataset."""
    batch_size = 2
    world = run_world(legacy_hooks.legacy_hook, world_size, hook="validation_epoch_end", n=n, batch_size=batch_size)

    assert [rec["raised"] for rec in world.records] == [None] * world_size, [rec["message"] for rec in world.records]
    received = [rec["epoch_end_outputs"] for rec in world.records]
    expected = [[oracle.batches(oracle.shard(n, world_size, r), batch_size)] for r in range(world_size)]
    semantics.number("samples in rank 0's outputs", sum(map(len, received[0][0])) if received[0] else None, vs=("N", n))
    assert received == expected, (
        oracle.side_by_side("validation_epoch_end got", received) + f"  expected (own shard, by batch) {expected}"
    )
    union = Counter(i for calls in received for outputs in calls for batch in outputs for i in batch)
    assert union == Counter(range(n)) + oracle.duplicates(n, world_size)
    if world_size > 1:
        assert all(len(sum(calls[0], [])) < n for calls in received), "a rank's outputs held the whole set"


@pytest.mark.parametrize("world_size, n", [(1, 5), (2, 5), (3, 10)])
def test_validation_step_end_receives_only_the_local_step_output(run_world, semantics, world_size, n):
    """Under ddp ``validation_step_end(step_output)`` runs on every rank once per batch, and is handed the
    very object that rank's ``validation_step`` just returned: this rank's batch only, nothing gathered
    from the other ranks."""
    batch_size = 2
    world = run_world(legacy_hooks.legacy_hook, world_size, hook="validation_step_end", n=n, batch_size=batch_size)

    assert [rec["raised"] for rec in world.records] == [None] * world_size, [rec["message"] for rec in world.records]
    received = [rec["step_end_inputs"] for rec in world.records]
    expected = oracle.rank_batches(n, world_size, batch_size)
    semantics.number("samples handed to rank 0's validation_step_end", sum(map(len, received[0])), vs=("N", n))
    assert received == expected, oracle.side_by_side("validation_step_end got", received) + f"  expected {expected}"
    assert [rec["seen_ids"] for rec in world.records] == received
    same = [rec["step_end_same_object"] for rec in world.records]
    assert all(all(flags) for flags in same), oracle.side_by_side("step_output is validation_step's return", same)
