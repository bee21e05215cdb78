"""Training samplers Lightning replaces or re-wraps: a custom order is shuffled, a ``RandomSampler`` with
replacement becomes a plain ``DistributedSampler``, and a random custom sampler is listed on each rank
with that process's own RNG.

For the training dataloader Lightning always asks for a *shuffling* distributed sampler
(pytorch_lightning/trainer/connectors/data_connector.py ``_process_dataloader``, ``is_shuffled = True``),
and ``_get_distributed_sampler`` builds it: a ``RandomSampler`` or ``SequentialSampler`` becomes
``DistributedSampler(dataset, shuffle=True, seed=PL_GLOBAL_SEED or 0)``, any other sampler
``DistributedSamplerWrapper(sampler, shuffle=True, ...)`` (lightning_fabric/utilities/distributed.py),
which lists the user's sampler once per epoch on each rank and deals out *positions* of that list as a
shuffling ``DistributedSampler`` deals out indices. So rank ``r`` sees ``listed[i]`` for ``i`` in torch's
own ``DistributedSampler(range(N), shuffle=True, seed=0)`` shard (``oracle.distributed_sampler_ids``),
where ``listed`` is what the user's sampler yielded *on that rank*. The probe is
ddpprobe/probes/samplers_rewrapped.py.
"""

import pytest
import torch
from torch.utils.data import RandomSampler

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import samplers_rewrapped as samplers
from tests.support import oracle

#: The categories of the warnings Lightning gives a user: ``rank_zero_warn``'s default ``UserWarning`` and its
#: subclass ``PossibleUserWarning`` (lightning_fabric/utilities/rank_zero.py, utilities/warnings.py). A fact
#: that says "nothing warns" asserts no captured warning record of these categories, whatever its words.
LIGHTNING_WARNINGS = ("UserWarning", "PossibleUserWarning")


def _flat(nested) -> list:
    return [x for batch in nested for x in batch]


def _wrapped(listed: list, world_size: int, rank: int) -> list:
    """What ``DistributedSamplerWrapper(shuffle=True, seed=0)`` gives rank ``rank`` of a sampler that yielded
    ``listed`` there: the entries at the positions torch's shuffling ``DistributedSampler`` deals that rank."""
    return [listed[i] for i in oracle.distributed_sampler_ids(len(listed), world_size, rank, shuffle=True, seed=0)]


# ---------------------------------------------------------------------------------------------
# 1. A custom sampler that yields an order: shuffled by the wrapper, at W = 1 too
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_custom_ordered_training_sampler_is_wrapped_with_shuffle_true_so_no_rank_sees_its_order(
    run_world, semantics, world_size
):
    """A custom ``Sampler`` yielding the ids from the last to the first (a curriculum, a length-grouped
    order) is wrapped in ``DistributedSamplerWrapper(shuffle=True, seed=0)``: rank ``r`` sees the order's
    entries at the positions of a shuffled ``DistributedSampler`` shard, not ``order[r::W]`` and not the
    order itself, and nothing warns. It happens at W = 1 too, since ``strategy="ddp"`` counts as distributed.
    Lightning issues #21131 and #21447 (open). Source: data_connector.py ``_process_dataloader``,
    ``_get_distributed_sampler``; lightning_fabric/utilities/distributed.py ``DistributedSamplerWrapper``."""
    n = 12
    world = run_world(samplers.fit_with_sampler, world_size, n=n, sampler="ordered")

    order = samplers.ordered_ids(n)
    expected = [_wrapped(order, world_size, r) for r in range(world_size)]
    in_order = [order[r::world_size] for r in range(world_size)]
    assert expected != in_order, "the data cannot tell the shuffled shards from the user's order; choose another n"
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    semantics.number("rank 0's first ids", str(seen[0][:4]), vs=("the user's order", str(in_order[0][:4])))
    assert seen == expected, (
        oracle.side_by_side("saw", seen) + f"  expected (wrapped, shuffled) {expected}; the user's order {in_order}"
    )
    used = [(rec["sampler"], rec["shuffle"], rec["seed"]) for rec in world.records]
    assert used == [("DistributedSamplerWrapper", True, 0)] * world_size, oracle.side_by_side("sampler", used)
    warned = [[w for w in rec["warnings"] if w["category"] in LIGHTNING_WARNINGS] for rec in world.records]
    assert warned == [[]] * world_size, oracle.side_by_side("Lightning's warnings", warned)


@pytest.mark.parametrize("world_size", [2, 3])
def test_with_use_distributed_sampler_false_the_users_own_distributed_order_is_kept(run_world, semantics, world_size):
    """The control: ``Trainer(use_distributed_sampler=False)`` and the user's own distributed version of
    the sampler (rank ``r`` yields ``order[r::W]``): Lightning keeps the very object, and every rank sees
    its share of the order, in order, each sample exactly once.
    Source: data_connector.py ``_requires_distributed_sampler`` (``use_distributed_sampler`` is off)."""
    n = 12
    world = run_world(
        samplers.fit_with_sampler, world_size, n=n, sampler="ordered_shard", use_distributed_sampler=False
    )

    order = samplers.ordered_ids(n)
    expected = [order[r::world_size] for r in range(world_size)]
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    semantics.number("rank 0's first ids", str(seen[0][:4]), vs=("the order", str(order[:4])))
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    assert sorted(_flat(seen)) == list(range(n)), f"not every sample once: {sorted(_flat(seen))}"
    kept = [(rec["sampler"], rec["same_sampler"]) for rec in world.records]
    assert kept == [("OrderedShardSampler", True)] * world_size, oracle.side_by_side("sampler", kept)


# ---------------------------------------------------------------------------------------------
# 2. RandomSampler(replacement=True, num_samples=K): a plain DistributedSampler over the dataset
# ---------------------------------------------------------------------------------------------


@run_if(lightning=">=2.0.3")  # RandomSampler -> DistributedSampler(dataset) since 2.0.3 (PR #17713); wrapped before
@pytest.mark.parametrize("world_size", [2, 3])
def test_random_sampler_with_replacement_becomes_a_plain_distributed_sampler_that_draws_ceil_n_over_w_without_warning(
    run_world, semantics, world_size
):
    """``DataLoader(sampler=RandomSampler(ds, replacement=True, num_samples=K))`` with K = 30 over N = 10
    samples: Lightning replaces the sampler by ``DistributedSampler(ds, shuffle=True)``, dropping
    ``replacement`` and ``num_samples``. Each rank draws ``ceil(N / W)`` samples per epoch (5 at W = 2),
    not ``K / W`` (15), none twice, and the world sees a padded permutation of the dataset; no warning
    says the sampler was replaced (Lightning #1995 asked for one). Source: data_connector.py
    ``_get_distributed_sampler`` (``isinstance(dataloader.sampler, (RandomSampler, SequentialSampler))``)."""
    n, k = 10, 30
    world = run_world(samplers.fit_with_sampler, world_size, n=n, sampler="replacement", num_samples=k)

    expected = [oracle.distributed_sampler_ids(n, world_size, r, shuffle=True, seed=0) for r in range(world_size)]
    per_rank = -(-n // world_size)
    oracle.assert_distinct(replaced=per_rank, user_draws_per_rank=k / world_size, user_draws=k)
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    semantics.number("samples drawn per rank", len(seen[0]), vs=("num_samples / W", k / world_size))
    assert [len(s) for s in seen] == [per_rank] * world_size, oracle.side_by_side("draws", [len(s) for s in seen])
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    used = [(rec["sampler"], rec["shuffle"]) for rec in world.records]
    assert used == [("DistributedSampler", True)] * world_size, oracle.side_by_side("sampler", used)
    warned = [[w for w in rec["warnings"] if w["category"] in LIGHTNING_WARNINGS] for rec in world.records]
    assert warned == [[]] * world_size, oracle.side_by_side("Lightning's warnings", warned)


@run_if(lightning="<2.0.3")
@pytest.mark.parametrize("world_size", [2, 3])
def test_before_2_0_3_random_sampler_with_replacement_was_wrapped_so_each_rank_drew_ceil_k_over_w(
    run_world, semantics, world_size
):
    """Before 2.0.3 (PR #17713) a ``RandomSampler`` was wrapped like any custom sampler
    (``DistributedSamplerWrapper``): each rank listed its own K = 30 draws and took its positions of them,
    ``ceil(K / W)`` samples per epoch (15 at W = 2), with repeats. Checked on 1.9.5."""
    n, k = 10, 30
    world = run_world(samplers.fit_with_sampler, world_size, n=n, sampler="replacement", num_samples=k)

    per_rank = -(-k // world_size)
    oracle.assert_distinct(wrapped=per_rank, replaced=-(-n // world_size))
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    semantics.number("samples drawn per rank", len(seen[0]), vs=("ceil(N / W)", -(-n // world_size)))
    assert [len(s) for s in seen] == [per_rank] * world_size, oracle.side_by_side("draws", [len(s) for s in seen])
    used = [(rec["sampler"], rec["shuffle"]) for rec in world.records]
    assert used == [("DistributedSamplerWrapper", True)] * world_size, oracle.side_by_side("sampler", used)


@pytest.mark.parametrize("world_size", [2, 3])
def test_with_use_distributed_sampler_false_each_rank_draws_its_share_of_the_replacement_samples(
    run_world, semantics, world_size
):
    """The control: ``use_distributed_sampler=False`` and each rank's own
    ``RandomSampler(replacement=True, num_samples=K // W, generator=seeded with the rank)``: Lightning
    keeps it, each rank draws K // W samples (15 at W = 2), with repeats, exactly the draws of that
    sampler computed here. Source: data_connector.py ``_requires_distributed_sampler``."""
    n, k = 10, 30
    world = run_world(
        samplers.fit_with_sampler,
        world_size,
        n=n,
        sampler="replacement_shard",
        num_samples=k,
        use_distributed_sampler=False,
    )

    expected = [
        [int(i) for i in RandomSampler(range(n), True, k // world_size, generator=torch.Generator().manual_seed(r))]
        for r in range(world_size)
    ]
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    semantics.number("samples drawn per rank", len(seen[0]), vs=("ceil(N / W)", -(-n // world_size)))
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    assert all(len(set(s)) < len(s) for s in seen), oracle.side_by_side("saw (expected repeats)", seen)
    kept = [(rec["sampler"], rec["same_sampler"]) for rec in world.records]
    assert kept == [("RandomSampler", True)] * world_size, oracle.side_by_side("sampler", kept)


# ---------------------------------------------------------------------------------------------
# 3. A random custom sampler: each rank lists it with its own RNG
# ---------------------------------------------------------------------------------------------

#: Samples in the random-sampler facts: two ranks' independent permutations partition the set by chance
#: with probability 1 / C(32, 16) (about 1.7e-9).
N_RANDOM = 32


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_unseeded_random_custom_sampler_is_listed_with_each_ranks_own_rng_so_shards_overlap_and_skip_samples(
    run_world, semantics, world_size
):
    """A custom sampler drawing a permutation with ``random.shuffle`` and no seed of its own, without
    ``seed_everything``: Python seeds its RNG per process, so each rank's wrapper lists a different
    permutation and takes its positions of it. Rank ``r`` sees ``listed_r[i]`` at its positions: the
    shards overlap, and samples are seen by no rank, in a world that should have covered the set once.
    Source: lightning_fabric/utilities/distributed.py ``DistributedSamplerWrapper.__iter__``
    (``self.dataset.reset()`` lists the user's sampler on each rank), ``_DatasetSamplerWrapper``."""
    world = run_world(samplers.fit_with_sampler, world_size, n=N_RANDOM, sampler="python_random")

    listed = [rec["listed"] for rec in world.records]
    assert [len(lst) for lst in listed] == [1] * world_size, oracle.side_by_side("listings", listed)
    listed = [lst[0] for lst in listed]
    assert len({tuple(lst) for lst in listed}) == world_size, "ranks drew the same permutation without a seed"
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    expected = [_wrapped(listed[r], world_size, r) for r in range(world_size)]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    never = sorted(set(range(N_RANDOM)) - set(_flat(seen)))
    semantics.number("samples no rank saw", len(never), vs=("with seed_everything", 0))
    assert never, f"every sample was seen: {oracle.side_by_side('saw', seen)}"
    assert len(_flat(seen)) > len(set(_flat(seen))), "no sample was seen twice"


@pytest.mark.parametrize("world_size", [2, 3])
def test_with_seed_everything_a_random_custom_sampler_gives_every_rank_the_same_list_so_shards_partition_the_data(
    run_world, semantics, world_size
):
    """The fix: ``seed_everything(7)`` before building the loader seeds Python's RNG alike on every rank, so
    every rank's wrapper lists the same permutation; its positions partition it (padded to a multiple of
    W), so every sample is seen once. The wrapper's own ``seed`` is 7 too (``PL_GLOBAL_SEED``).
    Source: lightning_fabric/utilities/seed.py ``seed_everything``; data_connector.py
    ``_get_distributed_sampler`` (``seed=int(os.getenv("PL_GLOBAL_SEED", 0))``)."""
    world = run_world(samplers.fit_with_sampler, world_size, n=N_RANDOM, sampler="python_random", seed=7)

    listed = [rec["listed"][0] for rec in world.records]
    assert listed == [listed[0]] * world_size, oracle.side_by_side("listed", listed)
    positions = [
        oracle.distributed_sampler_ids(N_RANDOM, world_size, r, shuffle=True, seed=7) for r in range(world_size)
    ]
    expected = [[listed[0][i] for i in positions[r]] for r in range(world_size)]
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    never = sorted(set(range(N_RANDOM)) - set(_flat(seen)))
    semantics.number("samples no rank saw", len(never), vs=("dataset", N_RANDOM))
    assert never == [], f"never seen: {never}"
    assert [rec["seed"] for rec in world.records] == [7] * world_size


@run_if(lightning=">=2.0.3")  # DataLoader(shuffle=True) -> DistributedSampler(dataset) since 2.0.3 (PR #17713)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_plain_shuffled_loader_partitions_the_data_without_seed_everything(run_world, semantics, world_size):
    """The plain ``DataLoader(shuffle=True)`` needs no seed: its ``RandomSampler`` is replaced by
    ``DistributedSampler(dataset, shuffle=True, seed=0)``, one permutation computed alike on every rank, so
    the shards partition the data (padded), unlike the unseeded custom sampler above.
    Source: data_connector.py ``_get_distributed_sampler``."""
    world = run_world(samplers.fit_with_sampler, world_size, n=N_RANDOM, sampler="shuffle")

    expected = [
        oracle.distributed_sampler_ids(N_RANDOM, world_size, r, shuffle=True, seed=0) for r in range(world_size)
    ]
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    never = sorted(set(range(N_RANDOM)) - set(_flat(seen)))
    semantics.number("samples no rank saw", len(never), vs=("dataset", N_RANDOM))
    assert never == []
    assert [rec["sampler"] for rec in world.records] == ["DistributedSampler"] * world_size
