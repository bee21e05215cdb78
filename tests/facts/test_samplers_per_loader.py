"""Samplers Lightning does not know, custom batch samplers, ``overfit_batches`` and a shuffling validation
loader: what each rank sees, as Lightning's own tests assert it, in real worlds.

Under ``strategy="ddp"`` Lightning swaps in a ``DistributedSampler`` unless told not to
(pytorch_lightning/trainer/connectors/data_connector.py ``_get_distributed_sampler``):

- a ``RandomSampler`` or ``SequentialSampler`` (a subclass too) becomes a ``DistributedSampler`` over the
  dataset; any other sampler (``WeightedRandomSampler``, a user's class) is wrapped in
  ``DistributedSamplerWrapper``, which lists the user's sampler and deals its draws out by position,
  every W-th draw to each rank (lightning_fabric/utilities/distributed.py); for predict,
  ``UnrepeatedDistributedSamplerWrapper`` (pytorch_lightning/overrides/distributed.py);
- the sampler shuffles in training unless ``overfit_batches`` is set (``shuffle and not overfit_batches``);
  for validation and test it shuffles when the user's loader does (``_is_dataloader_shuffled``);
- a custom ``BatchSampler`` is rebuilt as the same class around the ``DistributedSampler``
  (pytorch_lightning/utilities/data.py ``_dataloader_init_kwargs_resolve_sampler``).

Expected ids come from torch alone: the user's sampler drawn with its own seeded generator, and torch's
``DistributedSampler`` for the positions (tests/support/oracle.py ``distributed_sampler_ids``). Lightning
checks most of this in one process acting as rank 0 (tests/tests_pytorch/trainer/connectors/
test_data_connector.py); here every rank runs.
"""

import pytest
import torch
from torch.utils.data import WeightedRandomSampler

from ddpprobe.probes import samplers_per_loader
from tests.support import oracle

#: Sampling weights over 8 samples: ids 6 and 7 are drawn far more often, so draws repeat ids.
WEIGHTS = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 8.0]
SEED = 3


#: Lightning's warning for a shuffling evaluation loader, a ``PossibleUserWarning`` on rank 0
#: (pytorch_lightning/trainer/connectors/data_connector.py ``_process_dataloader``).
SHUFFLING_WARNING = (
    "Your `val_dataloader`'s sampler has shuffling enabled, it is strongly recommended that you turn shuffling off"
    " for val/test dataloaders."
)
#: Lightning's warning when every rank's loader is empty, a ``UserWarning`` (``rank_zero_warn``'s default) on
#: rank 0 (pytorch_lightning/utilities/data.py ``has_len_all_ranks``).
ZERO_LENGTH_WARNING = "Total length of `DataLoader` across ranks is zero. Please make sure this was your intention."


def _draws(seed: int, n: int = len(WEIGHTS)) -> list:
    """The ``n`` ids one listing of ``WeightedRandomSampler(WEIGHTS, n)`` gives from a generator seeded ``seed``."""
    return [int(i) for i in WeightedRandomSampler(WEIGHTS, n, generator=torch.Generator().manual_seed(seed))]


def _draw_lists(seed: int, listings: int, n: int = len(WEIGHTS)) -> list:
    """``listings`` successive listings of the same sampler (its generator carries on between them)."""
    sampler = WeightedRandomSampler(WEIGHTS, n, generator=torch.Generator().manual_seed(seed))
    return [[int(i) for i in sampler] for _ in range(listings)]


def _wrapped(draws: list, world_size: int, rank: int, epoch: int, shuffle: bool) -> list:
    """What ``DistributedSamplerWrapper`` gives rank ``rank``: the draws at the positions torch's
    ``DistributedSampler`` over ``len(draws)`` positions deals that rank (seed 0, after ``set_epoch``)."""
    positions = oracle.distributed_sampler_ids(len(draws), world_size, rank, epoch, shuffle=shuffle)
    return [draws[p] for p in positions]


def _flat(nested) -> list:
    return [x for batch in nested for x in batch]


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
    "tests_pytorch/utilities/test_combined_loader.py::test_combined_data_loader_with_max_size_cycle_and_ddp",
    "tests_pytorch/utilities/test_combined_loader.py::test_combined_data_loader_validation_test",
)
def test_every_loader_of_a_combined_loader_gets_its_own_shuffling_distributed_sampler(run_world, semantics):
    """Training on ``CombinedLoader({"a": ..., "b": ...})`` (``max_size_cycle``): each inner loader gets
    its own ``DistributedSampler(shuffle=True)``, the ``RandomSampler`` subclass of ``b`` replaced too, so
    each rank's epoch has ceil(ceil(N/W) / batch size) steps of each loader instead of ceil(N / batch
    size), and each key's ids are torch's ``DistributedSampler`` shard of that loader's dataset. Mirrors
    Lightning's tests_pytorch/utilities/test_combined_loader.py::
    test_combined_data_loader_with_max_size_cycle_and_ddp and ::test_combined_data_loader_validation_test
    (Trainers built in one process). Source: data_connector.py ``_prepare_dataloader`` per flattened
    loader; pytorch_lightning/utilities/combined_loader.py ``CombinedLoader``."""
    n_a, n_b, batch_size, world_size = 8, 6, 2, 2
    world = run_world(samplers_per_loader.fit_combined, world_size, n_a=n_a, n_b=n_b, batch_size=batch_size)

    expected = []
    for r in range(world_size):
        a = oracle.batches(oracle.distributed_sampler_ids(n_a, world_size, r, 0), batch_size)
        b = oracle.batches(oracle.distributed_sampler_ids(n_b, world_size, r, 0), batch_size)
        expected.append([{"a": x, "b": y} for x, y in zip(a, b)])
    assert len(expected[0]) != -(-n_a // batch_size), "data do not discriminate: sharded and whole lengths coincide"
    steps = [rec["steps"] for rec in world.records]
    assert steps == expected, oracle.side_by_side("steps", steps) + f"  expected {expected}"
    samplers = [(rec["samplers"], rec["shuffle"]) for rec in world.records]
    want = ({"a": "DistributedSampler", "b": "DistributedSampler"}, {"a": True, "b": True})
    assert samplers == [want] * world_size, oracle.side_by_side("samplers", samplers)
    semantics.number("steps per rank", len(steps[0]), vs=("unsharded", -(-n_a // batch_size)))


@pytest.mark.mirrors("tests_pytorch/trainer/test_dataloaders.py::test_warning_on_zero_len_dataloader")
def test_loader_lengths_are_summed_over_ranks_an_all_empty_world_warns_once_and_one_empty_rank_raises_alone(
    run_world, semantics
):
    """``trainer.validate`` with ``use_distributed_sampler=False`` and each rank's own loader: Lightning
    all-reduces the loaders' lengths first. When every rank's loader is empty, rank 0 alone warns "Total
    length of `DataLoader` across ranks is zero" and validation runs no batch; when only rank 1's is empty
    (rank 0 has 4 samples), rank 1 alone raises ``RuntimeError: `DataLoader` within local rank has zero
    length`` and rank 0 validates its two batches. Mirrors Lightning's tests_pytorch/trainer/
    test_dataloaders.py::test_warning_on_zero_len_dataloader (one process). Source:
    pytorch_lightning/utilities/data.py ``has_len_all_ranks`` (``strategy.reduce(local_length, "sum")``)."""
    world_size = 2
    empty = run_world(samplers_per_loader.validate_lengths, world_size, lengths=[0, 0])
    one_empty = run_world(samplers_per_loader.validate_lengths, world_size, lengths=[4, 0])

    warning = {"category": "UserWarning", "message": ZERO_LENGTH_WARNING}
    warned = [sum(w == warning for w in rec["warnings"]) for rec in empty.records]
    assert warned == [1, 0], oracle.side_by_side("zero-length warnings", warned)
    assert [(rec["seen"], rec["raised"]) for rec in empty.records] == [([], None)] * world_size
    outcome = [(rec["seen"], rec["raised"]) for rec in one_empty.records]
    assert outcome == [(oracle.batches([0, 1, 2, 3], 2), None), ([], "RuntimeError")], oracle.side_by_side(
        "seen, raised", outcome
    )
    assert "within local rank has zero length" in one_empty.records[1]["message"], one_empty.records[1]["message"]
    semantics.number("ranks warning when every loader is empty", sum(warned), vs=("world size", world_size))


@pytest.mark.mirrors(
    "tests_pytorch/trainer/test_dataloaders.py::test_auto_add_worker_init_fn_distributed",
    "tests_fabric/utilities/test_seed.py::test_pl_worker_init_function",
)
@pytest.mark.parametrize("workers", [False, True])
def test_dataloader_workers_draw_numpy_stdlib_and_torch_numbers_unique_per_rank_only_with_seed_everything_workers(
    run_world, semantics, workers
):
    """Two DataLoader workers per rank after ``seed_everything(7, workers=...)``, each item drawing from
    NumPy's, the standard library's and torch's global generator inside its worker. torch seeds all three
    in each worker from ``base_seed + worker_id``, so the two workers of a rank always draw differently;
    but ``base_seed`` comes from the rank's own generator, seeded alike on every rank, so with
    ``workers=False`` rank 1's workers draw exactly rank 0's numbers, for all three generators. With
    ``workers=True`` Lightning's ``pl_worker_init_function`` mixes the global rank in, and no number repeats
    across (rank, worker). Mirrors Lightning's tests_pytorch/trainer/test_dataloaders.py::
    test_auto_add_worker_init_fn_distributed (NumPy draws, 2 GPUs) and tests_fabric/utilities/test_seed.py::
    test_pl_worker_init_function (one process). Source: lightning_fabric/utilities/seed.py
    ``pl_worker_init_function``; pytorch_lightning/trainer/connectors/data_connector.py
    ``_auto_add_worker_init_fn``; torch/utils/data/_utils/worker.py ``_worker_loop`` (seeds ``random``,
    torch and NumPy)."""
    world_size = 2
    world = run_world(samplers_per_loader.worker_draws, world_size, seed=7, workers=workers)

    draws = [rec["draws"] for rec in world.records]
    for rank_draws in draws:
        by_worker = {d["worker"]: d for d in rank_draws}
        assert sorted(by_worker) == [0, 1], oracle.side_by_side("workers", draws)
        for generator in ("numpy", "stdlib", "torch"):
            assert by_worker[0][generator] != by_worker[1][generator], oracle.side_by_side(generator, draws)
    if workers:
        for generator in ("numpy", "stdlib", "torch"):
            values = [d[generator] for rank_draws in draws for d in rank_draws]
            assert len(set(values)) == len(values), oracle.side_by_side(generator, draws)
    else:
        assert draws == [draws[0]] * world_size, oracle.side_by_side("draws", draws)
    same = sum(d == draws[0] for d in draws)
    semantics.number(f"ranks drawing rank 0's worker numbers (workers={workers})", same, vs=("ranks", world_size))
