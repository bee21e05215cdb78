"""Collectives Lightning's own tests assert outside ``self.log``, in real worlds: ``strategy.broadcast`` of a
Python object, ``_gather_all_tensors`` on shapes that differ between ranks, and Fabric's ``all_reduce`` /
``all_gather`` of collections, ``rank_zero_first``, ``no_backward_sync`` and ``setup_dataloaders``.

- ``DDPStrategy.broadcast(obj)`` pickles rank 0's object to every rank (``broadcast_object_list``); the
  caller's object is left as it was (pytorch_lightning/strategies/ddp.py, lightning_fabric/strategies/ddp.py).
- ``_gather_all_tensors`` gathers the shapes first, pads every tensor to the largest, gathers and trims
  (lightning_fabric/utilities/distributed.py). ``LightningModule.all_gather`` does not take that path for
  tensors of different first dimensions under gloo: see tests/facts/test_collectives.py.
- Fabric walks collections and reduces each tensor (default ``"mean"``), leaving other leaves as they are
  (lightning_fabric/fabric.py ``Fabric.all_reduce``, ``all_gather``), and, unlike the Trainer, keeps a
  loader's ``shuffle=False`` in its ``DistributedSampler`` (``Fabric._get_distributed_sampler``).

Probes: ddpprobe/probes/strategy_and_fabric_collectives.py.
"""

import pytest
import torch
from torch.utils.data import WeightedRandomSampler

from ddpprobe.probes import strategy_and_fabric_collectives
from tests.support import oracle

#: The start of Fabric's ``TypeError`` for a custom sampler without ``__len__`` (``_DatasetSamplerWrapper``).
UNSIZED_MESSAGE = "You seem to have configured a sampler in your DataLoader which does not provide `__len__` method."


@pytest.mark.mirrors("tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp")
@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_broadcast_returns_rank_0s_object_everywhere_and_leaves_each_ranks_input_as_it_was(
    run_world, semantics, world_size
):
    """``trainer.strategy.broadcast({"rank": r, "names": [...]})``: every rank gets rank 0's dict back, and
    the dict each rank passed in still holds its own rank. Mirrors Lightning's tests_pytorch/checkpointing/
    test_checkpoint_callback_frequency.py::test_top_k_ddp (its broadcast check; 2 GPUs). Source:
    pytorch_lightning/strategies/ddp.py ``DDPStrategy.broadcast`` (``broadcast_object_list`` of a new list)."""
    world = run_world(strategy_and_fabric_collectives.evaluate_collectives, world_size)

    got = [rec["broadcast"] for rec in world.records]
    assert got == [{"rank": 0, "names": ["from rank 0"]}] * world_size, oracle.side_by_side("broadcast", got)
    inputs = [rec["input_after"] for rec in world.records]
    assert inputs == [{"rank": r, "names": [f"from rank {r}"]} for r in range(world_size)], oracle.side_by_side(
        "input after", inputs
    )
    semantics.number("ranks holding rank 0's object", sum(g["rank"] == 0 for g in got), vs=("world size", world_size))


@pytest.mark.mirrors("tests_fabric/utilities/test_distributed.py::test_collective_operations")
@pytest.mark.parametrize("world_size", [2, 3])
def test_gather_all_tensors_gathers_tensors_whose_shapes_differ_between_ranks(run_world, semantics, world_size):
    """Lightning's private ``_gather_all_tensors`` of ``arange(r)`` (empty on rank 0) and of ``full((r+1,
    2-r), r)`` returns, on every rank, each rank's tensor with its own shape and values: no padding left,
    nothing cut. Mirrors Lightning's tests_fabric/utilities/test_distributed.py::test_collective_operations
    [_test_all_gather_uneven_tensors, _test_all_gather_uneven_tensors_multidim] (2 CPU ranks). Source:
    lightning_fabric/utilities/distributed.py ``_gather_all_tensors`` (gathers sizes, pads to the maximum,
    trims each slice back)."""
    world = run_world(strategy_and_fabric_collectives.evaluate_collectives, world_size)

    expected = [[t.tolist() for t in strategy_and_fabric_collectives.uneven_tensors(r)] for r in range(world_size)]
    shapes = {tuple(strategy_and_fabric_collectives.uneven_tensors(r)[1].shape) for r in range(world_size)}
    assert len(shapes) == world_size, "the ranks' 2-D shapes must differ for the fact to test uneven gathers"
    for rec in world.records:
        assert rec["gathered_1d"] == [e[0] for e in expected], oracle.side_by_side(
            "1-D gathered", [r["gathered_1d"] for r in world.records]
        )
        assert rec["gathered_2d"] == [e[1] for e in expected], oracle.side_by_side(
            "2-D gathered", [r["gathered_2d"] for r in world.records]
        )
    semantics.number("elements gathered (1-D)", sum(len(x) for x in world.records[0]["gathered_1d"]))


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


@pytest.mark.mirrors("tests_fabric/test_fabric.py::test_all_reduce", "tests_fabric/test_fabric.py::test_all_gather")
def test_fabric_all_reduce_and_all_gather_walk_collections_and_leave_other_leaves_alone(run_world, semantics):
    """``fabric.all_reduce({"a": r+1, "b": [2(r+1)], "s": "text"})`` returns the dict with each tensor
    averaged (the default op, ``"mean"``: 1.5 and 3.0 at W=2) and the string untouched; ``reduce_op="sum"``
    gives 3.0; ``fabric.all_gather`` of ``{"a": r, "b": [[r, r]]}`` stacks each leaf to shape (W, ...).
    Mirrors Lightning's tests_fabric/test_fabric.py::test_all_reduce and ::test_all_gather (mocked
    strategy). Source: lightning_fabric/fabric.py ``Fabric.all_reduce`` and ``all_gather``
    (``apply_to_collection``)."""
    world_size = 2
    world = run_world(strategy_and_fabric_collectives.fabric_collectives_and_loaders, world_size)

    values = [r + 1.0 for r in range(world_size)]
    oracle.assert_distinct(mean=oracle.mean(values), sum=sum(values), rank0=values[0])
    want = {
        "all_reduce": {"a": oracle.mean(values), "b": [2 * oracle.mean(values)], "s": "text"},
        "all_reduce_sum": sum(values),
        "all_gather": {"a": [float(r) for r in range(world_size)], "b": [[[r, r] for r in range(world_size)]]},
    }
    got = [rec["collections"] for rec in world.records]
    assert got == [want] * world_size, oracle.side_by_side("collections", got) + f"  expected {want}"
    semantics.number("all_reduce default of 1 and 2", got[0]["all_reduce"]["a"], vs=("sum", sum(values)))


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
