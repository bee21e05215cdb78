"""Sharding: which samples each rank's validation loop sees.

Under ``strategy="ddp"`` Lightning replaces the sampler of a ``shuffle=False`` (default) validation
dataloader with a ``DistributedSampler(shuffle=False)``; a ``shuffle=True`` loader keeps shuffling
(the last fact below) (pytorch_lightning/trainer/connectors/data_connector.py,
``_process_dataloader`` -> lightning_fabric/utilities/data.py ``_get_distributed_sampler``). That sampler
deals the dataset out round-robin, and when the dataset size ``N`` does not divide by the world size
``W`` it pads the dataset by repeating its first samples, so every rank gets ``ceil(N / W)`` samples and
some samples are evaluated twice (torch/utils/data/distributed.py ``DistributedSampler.__iter__``).
"""

import math
from collections import Counter

import pytest

from ddpprobe.probes import samplers_per_loader, validation
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


def _flat(nested) -> list:
    return [x for batch in nested for x in batch]


def _code(ids) -> float:
    """One number per id list, order-sensitive, so ``assert_distinct`` can compare two lists."""
    return float(sum((k + 1) * (i + 1) for k, i in enumerate(ids)))


#: Lightning's warning for a shuffling evaluation loader, a ``PossibleUserWarning`` on rank 0
#: (pytorch_lightning/trainer/connectors/data_connector.py ``_process_dataloader``).
SHUFFLING_WARNING = (
    "Your `val_dataloader`'s sampler has shuffling enabled, it is strongly recommended that you turn shuffling off"
    " for val/test dataloaders."
)


@pytest.mark.mirrors(
    "tests_pytorch/trainer/connectors/test_data_connector.py::test_eval_shuffle_with_distributed_sampler_replacement",
    "tests_pytorch/trainer/connectors/test_data_connector.py::test_non_sequential_sampler_warning_is_raised_for_eval_dataloader",
    "tests_pytorch/loops/test_evaluation_loop.py::test_evaluation_loop_sampler_set_epoch_called",
)
def test_a_shuffling_validation_loader_keeps_shuffling_under_ddp_with_a_new_order_every_epoch(run_world, semantics):
    """A validation ``DataLoader(shuffle=True)`` gets ``DistributedSampler(shuffle=True)`` (the user's
    choice is kept for validation and test), the "turn shuffling off for val/test dataloaders" warning on
    rank 0 only, and ``set_epoch`` with the training epoch before each validation: rank r validates the
    ids torch's ``DistributedSampler(shuffle=True, seed=0)`` deals it after ``set_epoch(e)``, a new
    order each epoch. Mirrors Lightning's test_data_connector.py::
    test_eval_shuffle_with_distributed_sampler_replacement[True] and
    ::test_non_sequential_sampler_warning_is_raised_for_eval_dataloader, and loops/test_evaluation_loop.py::
    test_evaluation_loop_sampler_set_epoch_called. Source: data_connector.py ``_process_dataloader``
    (``_is_dataloader_shuffled``); evaluation_loop.py (``_set_sampler_epoch`` when fitting)."""
    n, val_n, world_size, epochs = 4, 7, 2, 2
    world = run_world(
        samplers_per_loader.fit_sampled,
        world_size,
        n=n,
        batch_size=2,
        max_epochs=epochs,
        val_n=val_n,
        val_shuffle=True,
    )

    expected = [
        [oracle.distributed_sampler_ids(val_n, world_size, r, e, shuffle=True) for e in range(epochs)]
        for r in range(world_size)
    ]
    oracle.assert_distinct(
        epoch1=_code(expected[0][1]),
        epoch0=_code(expected[0][0]),
        unshuffled=_code(oracle.shard(val_n, world_size, 0)),
    )
    seen = [[_flat(rec["val_ids"][str(e)]) for e in range(epochs)] for rec in world.records]
    assert seen == expected, oracle.side_by_side("validation ids per epoch", seen) + f"  expected {expected}"
    flags = [(rec["val"]["sampler"], rec["val"]["shuffle"]) for rec in world.records]
    assert flags == [("DistributedSampler", True)] * world_size, oracle.side_by_side("validation sampler", flags)
    warning = {"category": "PossibleUserWarning", "message": SHUFFLING_WARNING}
    warned = [sum(w == warning for w in rec["warnings"]) for rec in world.records]
    assert warned == [1] + [0] * (world_size - 1), oracle.side_by_side("shuffling warnings", warned)
    semantics.number("rank 0's validation ids, epoch 1", str(seen[0][1]), vs=("epoch 0", str(seen[0][0])))
