"""Samplers Lightning replaces or re-wraps: a custom order is shuffled, a ``RandomSampler`` with
replacement becomes a plain ``DistributedSampler``, a random custom sampler is listed on each rank with that
process's own RNG, a ``WeightedRandomSampler`` is dealt out by position (``set_epoch`` forwarded in training
and validation, not by predict's wrapper), a custom ``BatchSampler`` is rebuilt as its own class, and
``overfit_batches`` turns the training sampler's shuffling off.

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

The same wrapping holds outside training: for validation and test the sampler shuffles only when the user's
loader does (``_is_dataloader_shuffled``), and predict uses ``UnrepeatedDistributedSamplerWrapper``
(pytorch_lightning/overrides/distributed.py). The sampler shuffles in training unless ``overfit_batches`` is
set (``shuffle and not overfit_batches``), and a custom ``BatchSampler`` is rebuilt as the same class around
the ``DistributedSampler`` (pytorch_lightning/utilities/data.py ``_dataloader_init_kwargs_resolve_sampler``).
For those facts (probe ddpprobe/probes/samplers_per_loader.py) expected ids come from torch alone: the user's
sampler drawn with its own seeded generator, and torch's ``DistributedSampler`` for the positions. Lightning
checks most of this in one process acting as rank 0 (tests/tests_pytorch/trainer/connectors/
test_data_connector.py); here every rank runs.
"""

import pytest
import torch
from torch.utils.data import RandomSampler, WeightedRandomSampler

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import samplers_per_loader, samplers_rewrapped as samplers
from tests.support import oracle

#: The categories of the warnings Lightning gives a user: ``rank_zero_warn``'s default ``UserWarning`` and its
#: subclass ``PossibleUserWarning`` (lightning_fabric/utilities/rank_zero.py, utilities/warnings.py). A fact
#: that says "nothing warns" asserts no captured warning record of these categories, whatever its words.
LIGHTNING_WARNINGS = ("UserWarning", "PossibleUserWarning")


def _flat(nested) -> list:
    return [x for batch in nested for x in batch]


def _wrapped(listed: list, world_size: int, rank: int, epoch: int = 0, shuffle: bool = True) -> list:
    """What ``DistributedSamplerWrapper(shuffle=shuffle, seed=0)`` gives rank ``rank`` after ``set_epoch(epoch)``
    of a sampler that yielded ``listed`` there: the entries at the positions torch's ``DistributedSampler`` over
    ``len(listed)`` positions deals that rank."""
    return [
        listed[i] for i in oracle.distributed_sampler_ids(len(listed), world_size, rank, epoch, shuffle=shuffle, seed=0)
    ]


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


#: Sampling weights over 8 samples: ids 6 and 7 are drawn far more often, so draws repeat ids.
WEIGHTS = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 8.0]


SEED = 3


def _draws(seed: int, n: int = len(WEIGHTS)) -> list:
    """The ``n`` ids one listing of ``WeightedRandomSampler(WEIGHTS, n)`` gives from a generator seeded ``seed``."""
    return [int(i) for i in WeightedRandomSampler(WEIGHTS, n, generator=torch.Generator().manual_seed(seed))]


def _draw_lists(seed: int, listings: int, n: int = len(WEIGHTS)) -> list:
    """``listings`` successive listings of the same sampler (its generator carries on between them)."""
    sampler = WeightedRandomSampler(WEIGHTS, n, generator=torch.Generator().manual_seed(seed))
    return [[int(i) for i in sampler] for _ in range(listings)]


def _code(ids) -> float:
    """One number per id list, order-sensitive, so ``assert_distinct`` can compare two lists."""
    return float(sum((k + 1) * (i + 1) for k, i in enumerate(ids)))


@pytest.mark.mirrors("tests_pytorch/trainer/connectors/test_data_connector.py::test_dataloader_reinit_for_subclass")
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_weighted_random_sampler_is_wrapped_and_each_rank_gets_every_wth_of_its_draws(
    run_world, semantics, world_size
):
    """``trainer.validate`` through ``DataLoader(sampler=WeightedRandomSampler(...))``: Lightning wraps the
    sampler in ``DistributedSamplerWrapper(shuffle=False)``; each rank lists the whole sampler (the same
    draws on every rank here, since the sampler has a seeded generator) and takes the draws at positions
    r, r+W, ... (padded from the start to a multiple of W). The ranks together evaluate the sampler's
    draws, weights kept, not a plain shard of the dataset. Mirrors Lightning's
    tests_pytorch/trainer/connectors/test_data_connector.py::test_dataloader_reinit_for_subclass (rank 0
    of 2 gets draws 0, 2, 4, ...), checked there in one process. Source: data_connector.py
    ``_get_distributed_sampler``; lightning_fabric/utilities/distributed.py ``DistributedSamplerWrapper``."""
    n = len(WEIGHTS)
    world = run_world(
        samplers_per_loader.evaluate_sampled,
        world_size,
        n=n,
        batch_size=2,
        sampler="weighted",
        weights=WEIGHTS,
        seed=SEED,
    )

    draws = _draws(SEED)
    expected = [_wrapped(draws, world_size, r, 0, shuffle=False) for r in range(world_size)]
    plain_shard = oracle.shard(n, world_size, 0)
    oracle.assert_distinct(wrapped=_code(expected[0]), plain_shard=_code(plain_shard), every_draw=_code(draws))
    seen = [_flat(rec["seen"]) for rec in world.records]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected draws {draws} dealt by position"
    loaders = [(rec["loader"]["sampler"], rec["loader"]["shuffle"]) for rec in world.records]
    assert loaders == [("DistributedSamplerWrapper", False)] * world_size, oracle.side_by_side("sampler", loaders)
    semantics.number("rank 0's draws", str(seen[0]), vs=("plain DistributedSampler shard", str(plain_shard)))


@pytest.mark.mirrors("tests_pytorch/trainer/connectors/test_data_connector.py::test_dataloader_reinit_for_subclass")
def test_in_training_the_wrapper_shuffles_the_draws_positions_and_the_sampler_draws_anew_every_epoch(
    run_world, semantics
):
    """In ``trainer.fit`` the same wrapping uses ``shuffle=True``: each epoch the wrapper lists the
    ``WeightedRandomSampler`` again (its generator carries on, so epoch 1 has new draws) and deals the
    draws by a permutation of positions seeded ``PL_GLOBAL_SEED + epoch`` (0 + epoch here). Rank r's ids
    are the draws at torch's ``DistributedSampler(shuffle=True)`` positions, not at r, r+W, ...
    ``DistributedSamplerWrapper``'s docstring says its ``shuffle`` and ``seed`` "won't have any effect":
    they do, on the positions. Mirrors test_data_connector.py::test_dataloader_reinit_for_subclass (which
    checks the wrapper only with ``shuffle=False``). Source: data_connector.py ``_process_dataloader``
    (``is_shuffled = True`` for training), ``_get_distributed_sampler``; lightning_fabric/utilities/
    distributed.py ``DistributedSamplerWrapper.__iter__`` (``self.dataset.reset()``)."""
    n, world_size, epochs = len(WEIGHTS), 2, 2
    world = run_world(
        samplers_per_loader.fit_sampled,
        world_size,
        n=n,
        batch_size=2,
        max_epochs=epochs,
        sampler="weighted",
        weights=WEIGHTS,
        seed=SEED,
    )

    listings = _draw_lists(SEED, epochs)
    expected = [
        [_wrapped(listings[e], world_size, r, e, shuffle=True) for e in range(epochs)] for r in range(world_size)
    ]
    unshuffled = [_wrapped(listings[e], world_size, 0, e, shuffle=False) for e in range(epochs)]
    same_draws = [_wrapped(listings[0], world_size, 0, e, shuffle=True) for e in range(epochs)]
    oracle.assert_distinct(
        shuffled=_code(expected[0][1]), unshuffled=_code(unshuffled[1]), first_draws_again=_code(same_draws[1])
    )
    seen = [[_flat(rec["train_ids"][str(e)]) for e in range(epochs)] for rec in world.records]
    assert seen == expected, oracle.side_by_side("saw per epoch", seen) + f"  expected {expected}"
    shuffle = [(rec["train"]["sampler"], rec["train"]["shuffle"]) for rec in world.records]
    assert shuffle == [("DistributedSamplerWrapper", True)] * world_size, oracle.side_by_side("sampler", shuffle)
    semantics.number("rank 0's epoch-1 ids", str(seen[0][1]), vs=("unshuffled positions", str(unshuffled[1])))


@pytest.mark.mirrors(
    "tests_fabric/utilities/test_distributed.py::test_distributed_sampler_wrapper_set_epoch",
    "tests_pytorch/loops/test_evaluation_loop.py::test_evaluation_loop_sampler_set_epoch_called",
)
def test_distributed_sampler_wrapper_forwards_set_epoch_to_the_users_sampler_in_training_and_validation(
    run_world, semantics
):
    """A user's sampler with a callable ``set_epoch`` gets every epoch through the wrapper: in training
    ``set_epoch(e)`` before each epoch, in validation inside ``fit`` before the sanity check and before
    each epoch's validation (the training epoch's number). The sampler here reseeds its generator with
    ``seed + 1 + e``, so each epoch's draws are those of that seed on every rank. Without the
    forwarding its generator would carry on from ``seed``. Mirrors Lightning's
    tests_fabric/utilities/test_distributed.py::test_distributed_sampler_wrapper_set_epoch (issue
    #21454) and tests_pytorch/loops/test_evaluation_loop.py::test_evaluation_loop_sampler_set_epoch_called.
    Source: lightning_fabric/utilities/distributed.py ``DistributedSamplerWrapper.set_epoch``;
    pytorch_lightning/loops/fit_loop.py ``on_advance_start`` and evaluation_loop.py ``_on_evaluation_epoch_start``
    (``_set_sampler_epoch`` with ``fit_loop.epoch_progress.current.processed``)."""
    n, world_size, epochs = len(WEIGHTS), 2, 2
    world = run_world(
        samplers_per_loader.fit_sampled,
        world_size,
        n=n,
        batch_size=2,
        max_epochs=epochs,
        sampler="epoch_seeded",
        weights=WEIGHTS,
        seed=SEED,
        val_n=n,
        val_sampler="epoch_seeded",
        num_sanity_val_steps=1,
    )

    expected_train = [
        [_wrapped(_draws(SEED + 1 + e), world_size, r, e, shuffle=True) for e in range(epochs)]
        for r in range(world_size)
    ]
    not_forwarded = [_wrapped(d, world_size, 0, e, shuffle=True) for e, d in enumerate(_draw_lists(SEED, epochs))]
    oracle.assert_distinct(forwarded=_code(expected_train[0][0]), not_forwarded=_code(not_forwarded[0]))
    calls = [(rec["epochs_set"], rec["val_epochs_set"]) for rec in world.records]
    assert calls == [([0, 1], [0, 0, 1])] * world_size, oracle.side_by_side("set_epoch calls (train, val)", calls)
    seen = [[_flat(rec["train_ids"][str(e)]) for e in range(epochs)] for rec in world.records]
    assert seen == expected_train, oracle.side_by_side("training ids per epoch", seen) + f"  expected {expected_train}"
    val = [{k: _flat(v) for k, v in rec["val_ids"].items()} for rec in world.records]
    expected_val = [
        {
            "sanity": _wrapped(_draws(SEED + 1), world_size, r, 0, shuffle=False)[:2],
            **{str(e): _wrapped(_draws(SEED + 1 + e), world_size, r, 0, shuffle=False) for e in range(epochs)},
        }
        for r in range(world_size)
    ]
    assert val == expected_val, oracle.side_by_side("validation ids", val) + f"  expected {expected_val}"
    semantics.number("set_epoch calls of the validation sampler", str(calls[0][1]))


@pytest.mark.mirrors("tests_pytorch/loops/test_prediction_loop.py::test_prediction_loop_batch_sampler_set_epoch_called")
def test_predict_wraps_a_custom_sampler_without_forwarding_set_epoch(run_world, semantics):
    """``trainer.predict`` wraps the same sampler in ``UnrepeatedDistributedSamplerWrapper``, which
    deals draws r, r+W, ... without padding but does not forward ``set_epoch``: the user's sampler is
    never called with it and draws from its initial seed. Lightning's tests_pytorch/loops/test_prediction_loop.py::
    test_prediction_loop_batch_sampler_set_epoch_called checks that the sampler *in the loader* gets
    ``set_epoch``, which holds: that sampler is the wrapper (put in at one rank too), and the test does not
    look inside it at the user's sampler. Source:
    pytorch_lightning/overrides/distributed.py ``UnrepeatedDistributedSamplerWrapper`` (subclasses
    ``UnrepeatedDistributedSampler``, not ``DistributedSamplerWrapper``); data_connector.py
    ``_process_dataloader`` (``_set_sampler_epoch`` outside fit)."""
    n, world_size = len(WEIGHTS), 2
    world = run_world(
        samplers_per_loader.evaluate_sampled,
        world_size,
        n=n,
        batch_size=2,
        sampler="epoch_seeded",
        weights=WEIGHTS,
        seed=SEED,
        stage="predict",
    )

    draws = _draws(SEED)
    expected = [[draws[p] for p in oracle.unrepeated_shard(n, world_size, r)] for r in range(world_size)]
    forwarded = [_draws(SEED + 1)[p] for p in oracle.unrepeated_shard(n, world_size, 0)]
    oracle.assert_distinct(not_forwarded=_code(expected[0]), forwarded=_code(forwarded))
    assert [rec["epochs_set"] for rec in world.records] == [[]] * world_size, oracle.side_by_side(
        "set_epoch calls", [rec["epochs_set"] for rec in world.records]
    )
    seen = [_flat(rec["seen"]) for rec in world.records]
    assert seen == expected, oracle.side_by_side("predicted ids", seen) + f"  expected {expected}"
    samplers = [rec["loader"]["batch_sampler_sampler"] for rec in world.records]
    assert samplers == ["UnrepeatedDistributedSamplerWrapper"] * world_size, oracle.side_by_side("sampler", samplers)
    semantics.number("set_epoch calls reaching the user's sampler in predict", len(world.records[0]["epochs_set"]))


@pytest.mark.mirrors("tests_pytorch/trainer/connectors/test_data_connector.py::test_replace_distributed_sampler")
@pytest.mark.parametrize("n, drop_last", [(7, False), (5, True)])
def test_a_custom_batch_sampler_is_rebuilt_as_its_own_class_around_a_distributed_sampler(
    run_world, semantics, n, drop_last
):
    """A loader with ``batch_sampler=ReversedBatchSampler(SequentialSampler(ds), batch_size=2, drop_last)``
    (a ``BatchSampler`` subclass that reverses each batch): Lightning builds a new
    ``ReversedBatchSampler`` with the same ``batch_size`` and ``drop_last`` around a
    ``DistributedSampler(shuffle=False)``, so rank r gets its padded shard cut into batches by the user's
    class (each batch reversed; with ``drop_last`` the short last batch dropped). Mirrors Lightning's
    tests_pytorch/trainer/connectors/test_data_connector.py::test_replace_distributed_sampler (one-rank
    world). Source: pytorch_lightning/utilities/data.py ``_dataloader_init_kwargs_resolve_sampler``."""
    world_size, batch_size = 2, 2
    world = run_world(
        samplers_per_loader.validate_with_batch_sampler, world_size, n=n, batch_size=batch_size, drop_last=drop_last
    )

    def cut(ids):
        batches = oracle.batches(ids, batch_size)
        return [b[::-1] for b in batches if not (drop_last and len(b) < batch_size)]

    expected = [cut(oracle.shard(n, world_size, r)) for r in range(world_size)]
    user_as_given = cut(list(range(n)))
    oracle.assert_distinct(
        rebuilt=_code(_flat(expected[0])),
        not_reversed=_code(_flat(oracle.batches(oracle.shard(n, world_size, 0), batch_size))),
        as_given=_code(_flat(user_as_given)),
    )
    seen = [rec["seen"] for rec in world.records]
    assert seen == expected, oracle.side_by_side("batches", seen) + f"  expected {expected}"
    fields = [
        {k: rec["loader"][k] for k in ("batch_sampler", "batch_sampler_sampler", "batch_size", "drop_last")}
        for rec in world.records
    ]
    want = {
        "batch_sampler": "ReversedBatchSampler",
        "batch_sampler_sampler": "DistributedSampler",
        "batch_size": batch_size,
        "drop_last": drop_last,
    }
    assert fields == [want] * world_size, oracle.side_by_side("batch sampler", fields)
    assert [rec["same_batch_sampler"] for rec in world.records] == [False] * world_size
    semantics.number("rank 0's batches", str(seen[0]), vs=("the user's batch sampler as given", str(user_as_given)))


@pytest.mark.mirrors(
    "tests_pytorch/trainer/flags/test_overfit_batches.py::test_distributed_sampler_with_overfit_batches"
)
@pytest.mark.parametrize("world_size", [2, 3])
def test_with_overfit_batches_the_training_sampler_does_not_shuffle_and_every_epoch_repeats_the_same_batches(
    run_world, semantics, world_size
):
    """With ``Trainer(overfit_batches=2)`` the training ``DistributedSampler`` is built with
    ``shuffle=False`` (``shuffle and not overfit_batches``): rank r trains on the first two batches of
    r, r+W, ... in every epoch, the same ids in the same order, instead of a new permutation each epoch.
    Mirrors Lightning's tests_pytorch/trainer/flags/test_overfit_batches.py::
    test_distributed_sampler_with_overfit_batches (a Trainer built in one process). Source:
    data_connector.py ``_get_distributed_sampler`` and ``_resolve_overfit_batches``."""
    n, batch_size, epochs, overfit = 12, 2, 2, 2
    world = run_world(
        samplers_per_loader.fit_sampled,
        world_size,
        n=n,
        batch_size=batch_size,
        max_epochs=epochs,
        overfit_batches=overfit,
    )

    expected = [oracle.batches(oracle.shard(n, world_size, r), batch_size)[:overfit] for r in range(world_size)]
    shuffled = oracle.batches(oracle.distributed_sampler_ids(n, world_size, 0, 1, shuffle=True), batch_size)[:overfit]
    oracle.assert_distinct(unshuffled=_code(_flat(expected[0])), shuffled=_code(_flat(shuffled)))
    seen = [[rec["train_ids"][str(e)] for e in range(epochs)] for rec in world.records]
    assert seen == [[batches] * epochs for batches in expected], (
        oracle.side_by_side("training batches per epoch", seen) + f"  expected every epoch {expected}"
    )
    flags = [(rec["train"]["sampler"], rec["train"]["shuffle"]) for rec in world.records]
    assert flags == [("DistributedSampler", False)] * world_size, oracle.side_by_side("training sampler", flags)
    semantics.number("rank 0's epoch-1 batches", str(seen[0][1]), vs=("without overfit_batches", str(shuffled)))
