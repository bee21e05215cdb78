"""Sharding: which samples each rank's validation loop sees.

Under ``strategy="ddp"`` Lightning replaces the sampler of a ``shuffle=False`` (default) validation
dataloader with a ``DistributedSampler(shuffle=False)``; a ``shuffle=True`` loader keeps shuffling
(tests/facts/test_samplers_per_loader.py) (pytorch_lightning/trainer/connectors/data_connector.py,
``_process_dataloader`` -> lightning_fabric/utilities/data.py ``_get_distributed_sampler``). That sampler
deals the dataset out round-robin, and when the dataset size ``N`` does not divide by the world size
``W`` it pads the dataset by repeating its first samples, so every rank gets ``ceil(N / W)`` samples and
some samples are evaluated twice (torch/utils/data/distributed.py ``DistributedSampler.__iter__``).
"""

import math
from collections import Counter

import pytest

from ddpprobe.probes import validation
from tests.support import oracle


@pytest.mark.parametrize("world_size, n", [(1, 5), (2, 8), (3, 9)])
def test_each_rank_sees_a_disjoint_strided_shard_when_n_divides_by_world_size(run_world, semantics, world_size, n):
    """With N divisible by W, rank r's ``validation_step`` sees samples r, r+W, r+2W, ...; the shards
    are disjoint and together are the dataset, each sample exactly once."""
    world = run_world(validation.validate, world_size, n=n, batch_size=2)

    seen = [sum(rec["seen_ids"], []) for rec in world.records]
    expected = [list(range(r, n, world_size)) for r in range(world_size)]
    semantics.number("samples evaluated", sum(map(len, seen)), vs=("N", n))
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    assert Counter(sum(seen, [])) == Counter(range(n))
    assert [rec["sampler"] for rec in world.records] == ["DistributedSampler"] * world_size


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7), (3, 10), (4, 10)])
def test_distributed_sampler_pads_by_repeating_the_first_samples_when_n_does_not_divide(
    run_world, semantics, world_size, n
):
    """With N not divisible by W, every rank still sees ceil(N/W) samples: ``DistributedSampler`` pads
    the dataset with copies of its first ``ceil(N/W)*W - N`` samples, so those are evaluated twice."""
    world = run_world(validation.validate, world_size, n=n, batch_size=2)

    seen = [sum(rec["seen_ids"], []) for rec in world.records]
    expected = [oracle.shard(n, world_size, r) for r in range(world_size)]
    semantics.number("samples evaluated", sum(map(len, seen)), vs=("N", n))
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    assert all(len(ids) == math.ceil(n / world_size) for ids in seen)
    pad = math.ceil(n / world_size) * world_size - n
    extra = Counter(sum(seen, [])) - Counter(range(n))
    assert extra == Counter(range(pad)), oracle.side_by_side("saw", seen) + f"  expected duplicates {list(range(pad))}"


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_trainer_validate_warns_that_the_distributed_sampler_replicates_samples(run_world, semantics, world_size, n):
    """``trainer.validate`` under DDP emits a ``PossibleUserWarning`` that ``DistributedSampler``
    "replicates some samples" and recommends ``Trainer(devices=1)`` for exact evaluation. Like every
    ``rank_zero_warn``, it is raised on global rank 0 only.
    Source: pytorch_lightning/trainer/connectors/data_connector.py ``_DataConnector._resolve_sampler``."""
    world = run_world(validation.validate, world_size, n=n, batch_size=2)

    def replicate_warnings(rec):
        return [
            w
            for w in rec["warnings"]
            if w["category"] == "PossibleUserWarning"
            and "DistributedSampler" in w["message"]
            and "replicates some samples" in w["message"]
        ]

    counts = [len(replicate_warnings(rec)) for rec in world.records]
    semantics.number("ranks warned", sum(c > 0 for c in counts), vs=("world size", world_size))
    assert counts == [1] + [0] * (world_size - 1), oracle.side_by_side("DistributedSampler warnings", counts)
