"""What does Fabric do for the ranks of a DDP world? ``rank_zero_first`` runs rank 0's block before the others
enter theirs, ``no_backward_sync`` leaves each rank its own gradient, and ``setup_dataloaders`` keeps a loader's
``shuffle=False`` in its ``DistributedSampler``, sets the epoch itself and wraps a custom sampler.

Unlike the Trainer, Fabric keeps the loader's shuffling choice (lightning_fabric/fabric.py
``Fabric._get_distributed_sampler``); a custom sampler with a length is wrapped in ``DistributedSamplerWrapper``,
one without ``__len__`` raises ``TypeError`` (lightning_fabric/utilities/distributed.py
``_DatasetSamplerWrapper``). Probes: ddpprobe/probes/strategy_and_fabric_collectives.py. Fabric's
``all_reduce`` and ``all_gather`` are in tests/facts/test_reductions_outside_log.py.
"""

import pytest
import torch
from torch.utils.data import WeightedRandomSampler

from ddpprobe.probes import strategy_and_fabric_collectives
from tests.support import oracle


@pytest.mark.mirrors("tests_fabric/test_fabric.py::test_rank_zero_first")
def test_fabric_rank_zero_first_runs_rank_0s_block_before_the_others_enter(run_world, semantics):
    """Inside ``with fabric.rank_zero_first():`` rank 0 holds for half a second and then leaves a marker
    file: rank 0 entered without it, rank 1 entered only after it existed (its block waits at a barrier
    until rank 0's block is done). Mirrors Lightning's tests_fabric/test_fabric.py::test_rank_zero_first
    (mocked barrier). Source: lightning_fabric/fabric.py ``Fabric.rank_zero_first``."""
    world = run_world(strategy_and_fabric_collectives.fabric_collectives_and_loaders, 2)

    saw = [rec["rank_zero_first"]["saw_rank0_done_on_entry"] for rec in world.records]
    assert saw == [False, True], oracle.side_by_side("rank 0's block done on entry", saw)
    semantics.number("rank 1 entered after rank 0's block", int(saw[1]))


@pytest.mark.mirrors(
    "tests_fabric/strategies/test_ddp.py::test_ddp_no_backward_sync",
    "tests_fabric/test_fabric.py::test_no_backward_sync",
)
def test_fabric_no_backward_sync_leaves_each_ranks_own_gradient_and_the_default_averages_them(run_world, semantics):
    """A Fabric-set-up ``Linear(1, 1)`` with weight 0.5, input ``r + 1`` and loss ``(w x)^2``: inside
    ``fabric.no_backward_sync(model)`` the gradient is the rank's own ``2 w x^2`` (1.0 on rank 0, 4.0 on
    rank 1); outside it (``enabled=False``) the backward all-reduces it to the mean, 2.5 on both. Mirrors
    Lightning's tests_fabric/strategies/test_ddp.py::test_ddp_no_backward_sync and tests_fabric/
    test_fabric.py::test_no_backward_sync (mocked). Source: lightning_fabric/strategies/ddp.py
    ``_DDPBackwardSyncControl.no_backward_sync`` (``DistributedDataParallel.no_sync``)."""
    world_size = 2
    world = run_world(strategy_and_fabric_collectives.fabric_collectives_and_loaders, world_size)

    local = [2 * 0.5 * (r + 1) ** 2 for r in range(world_size)]
    mean = oracle.mean(local)
    oracle.assert_distinct(rank0=local[0], rank1=local[1], mean=mean)
    got = [(rec["no_backward_sync"]["no_sync"], rec["no_backward_sync"]["synced"]) for rec in world.records]
    assert got == [pytest.approx((local[r], mean)) for r in range(world_size)], oracle.side_by_side(
        "(no_sync, synced)", got
    )
    semantics.number("rank 1's gradient inside no_backward_sync", got[1][0], vs=("synced", got[1][1]))


#: The start of Fabric's ``TypeError`` for a custom sampler without ``__len__`` (``_DatasetSamplerWrapper``).
UNSIZED_MESSAGE = "You seem to have configured a sampler in your DataLoader which does not provide `__len__` method."


@pytest.mark.mirrors(
    "tests_fabric/test_fabric.py::test_setup_dataloaders_distributed_sampler_shuffle",
    "tests_fabric/test_fabric.py::test_setup_dataloaders_distributed_sampler_parity",
    "tests_fabric/test_fabric.py::test_setup_dataloaders_replace_custom_sampler",
)
def test_fabric_setup_dataloaders_keeps_shuffle_false_sets_the_epoch_itself_and_wraps_a_custom_sampler(
    run_world, semantics
):
    """``fabric.setup_dataloaders`` at W=2 over 8 samples: a ``shuffle=False`` loader gets
    ``DistributedSampler(shuffle=False)``, rank 0 reading 0, 2, 4, 6 (the Trainer's training loader would
    shuffle); a ``shuffle=True`` loader reads torch's ``DistributedSampler(shuffle=True, seed=0)`` shard,
    a new permutation on the second pass because Fabric calls ``set_epoch`` at each ``iter``; a seeded
    ``WeightedRandomSampler`` (it has a length) is wrapped in ``DistributedSamplerWrapper(shuffle=False)``,
    each rank taking every second draw; a custom sampler without ``__len__`` raises ``TypeError`` "You seem
    to have configured a sampler in your DataLoader which does not provide `__len__` method" on every rank.
    Mirrors Lightning's tests_fabric/test_fabric.py::test_setup_dataloaders_distributed_sampler_shuffle,
    ::test_setup_dataloaders_distributed_sampler_parity and ::test_setup_dataloaders_replace_custom_sampler
    (its ``TypeError`` is the one for a sampler without ``__len__``, a ``Mock(spec=Sampler)``). Source:
    lightning_fabric/fabric.py ``Fabric._get_distributed_sampler``; lightning_fabric/utilities/distributed.py
    ``_DatasetSamplerWrapper`` (the ``Sized`` check); lightning_fabric/wrappers.py ``_FabricDataLoader.__iter__``
    (``_set_sampler_epoch``)."""
    world_size, n, seed = 2, 8, 3
    world = run_world(strategy_and_fabric_collectives.fabric_collectives_and_loaders, world_size, n=n, seed=seed)

    weights = [1.0] * (n - 1) + [float(n)]
    draws = [int(i) for i in WeightedRandomSampler(weights, n, generator=torch.Generator().manual_seed(seed))]
    expected = [
        {
            "plain": oracle.shard(n, world_size, r),
            "plain_shuffle": False,
            "shuffled": [oracle.distributed_sampler_ids(n, world_size, r, e, shuffle=True) for e in (0, 1)],
            "custom": [draws[p] for p in oracle.shard(n, world_size, r)],
            "custom_sampler": "DistributedSamplerWrapper",
            "custom_shuffle": False,
            "unsized": ["TypeError", UNSIZED_MESSAGE],
        }
        for r in range(world_size)
    ]
    assert expected[0]["shuffled"][0] != expected[0]["shuffled"][1], "data do not discriminate: epochs coincide"
    assert expected[0]["plain"] != expected[0]["shuffled"][0], "data do not discriminate: shuffled = unshuffled"
    got = [rec["dataloaders"] for rec in world.records]
    for rank in got:  # Lightning's message goes on with what to do; its first sentence says what is wrong
        if rank["unsized"] is not None:
            rank["unsized"][1] = rank["unsized"][1][: len(UNSIZED_MESSAGE)]
    assert got == expected, oracle.side_by_side("loaders", got) + f"  expected {expected}"
    semantics.number("rank 0's ids with shuffle=False", str(got[0]["plain"]))
