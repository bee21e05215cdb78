"""Several validation dataloaders: keys, padding and sync per ``dataloader_idx``, and what the epoch end sees;
in training, every loader of a ``CombinedLoader`` gets its own ``DistributedSampler``.

``trainer.validate(model, dataloaders=[loader_0, loader_1])`` runs the loaders one after the other and
calls ``validation_step(batch, batch_idx, dataloader_idx)``. Each loader gets its own
``DistributedSampler`` (so each is padded on its own), and ``self.log`` stores a value per loader,
under the key ``name/dataloader_idx_k`` unless ``add_dataloader_idx=False``
(pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultCollection.log`` and
``_forked_name``). When the loop moves to the next loader it computes, and syncs, the finished
loader's epoch values (pytorch_lightning/loops/evaluation_loop.py ``_EvaluationLoop.run`` ->
``_store_dataloader_outputs``).

Loader 0 holds samples ``0 .. N0-1``, loader 1 samples ``10 .. 10+N1-1`` (value ``id ** 2``), so a
value computed over the wrong loader, or over both, shows.
"""

import pytest

from ddpprobe.probes import dataloaders, log_spec, samplers_per_loader
from tests.support import oracle

FIRSTS = [0, 10]
#: (world size, [N0, N1]): neither loader's size divides by the world size, so both are padded.
WORLDS = [pytest.param(2, [5, 3], id="2-5+3"), pytest.param(3, [7, 4], id="3-7+4")]


def _loader_shard(n: int, first: int, world_size: int, rank: int) -> list:
    """Sample ids of a loader holding samples ``first .. first+n-1`` that rank ``rank`` gets."""
    return [first + i for i in oracle.shard(n, world_size, rank)]


def _padded_mean(n: int, first: int, world_size: int) -> float:
    return oracle.mean(oracle.values(first + i for i in oracle.padded_indices(n, world_size)))


@pytest.mark.parametrize("world_size, sizes", WORLDS)
def test_each_dataloader_idx_gets_its_own_key_padded_and_synced_on_its_own(run_world, semantics, world_size, sizes):
    """``self.log("v", ..., sync_dist=True)`` from two validation dataloaders gives two keys,
    ``v/dataloader_idx_0`` and ``v/dataloader_idx_1`` (no plain ``v``), each the synced mean over *its*
    loader's padded shards: each loader is padded by its own ``DistributedSampler``, and the values are
    not pooled across loaders. ``trainer.validate`` returns one dict per loader, holding only that
    loader's key. Rank 0 warns about replicated samples once per loader."""
    world = run_world(
        dataloaders.validate_loaders, world_size, sizes=sizes, firsts=FIRSTS, logs=[log_spec("v", sync_dist=True)]
    )

    for k, (n, first) in enumerate(zip(sizes, FIRSTS)):
        seen = [sum(rec["seen_ids"][str(k)], []) for rec in world.records]
        expected = [_loader_shard(n, first, world_size, r) for r in range(world_size)]
        assert seen == expected, oracle.side_by_side(f"loader {k} saw", seen) + f"  expected {expected}"

    padded = [_padded_mean(n, first, world_size) for n, first in zip(sizes, FIRSTS)]
    unpadded = [oracle.mean(oracle.values(range(first, first + n))) for n, first in zip(sizes, FIRSTS)]
    pooled = oracle.mean(
        oracle.values([first + i for n, first in zip(sizes, FIRSTS) for i in oracle.padded_indices(n, world_size)])
    )
    oracle.assert_distinct(
        padded_0=padded[0], padded_1=padded[1], unpadded_0=unpadded[0], unpadded_1=unpadded[1], pooled=pooled
    )
    keys = [sorted(rec["callback_metrics"]) for rec in world.records]
    assert keys == [["v/dataloader_idx_0", "v/dataloader_idx_1"]] * world_size, oracle.side_by_side("keys", keys)
    for k in (0, 1):
        got = [rec["callback_metrics"][f"v/dataloader_idx_{k}"] for rec in world.records]
        assert got == pytest.approx([padded[k]] * world_size), (
            oracle.side_by_side(f"v/dataloader_idx_{k}", got) + f"  expected padded mean of loader {k}: {padded[k]}"
        )
    returned = [[sorted(d) for d in rec["returned"]] for rec in world.records]
    assert returned == [[["v/dataloader_idx_0"], ["v/dataloader_idx_1"]]] * world_size, oracle.side_by_side(
        "returned keys", returned
    )
    warned = [sum("replicates some samples" in w["message"] for w in rec["warnings"]) for rec in world.records]
    assert warned == [2] + [0] * (world_size - 1), oracle.side_by_side("replicate warnings", warned)
    semantics.number(
        "v/dataloader_idx_1",
        world.records[0]["callback_metrics"]["v/dataloader_idx_1"],
        vs=("loader 1 single-process mean", unpadded[1]),
    )


@pytest.mark.parametrize("world_size, sizes", WORLDS)
def test_add_dataloader_idx_false_with_the_same_key_in_two_dataloaders_raises_on_the_second(
    run_world, semantics, world_size, sizes
):
    """``self.log("v", ..., add_dataloader_idx=False)`` from both loaders is a clash: on the first
    ``self.log`` of loader 1, every rank raises ``MisconfigurationException`` ("You called
    `self.log(v, ...)` twice in `validation_step` with different arguments"), because the stored entry
    remembers ``dataloader_idx=0``. Loader 0's value has already been synced and published under plain
    ``v`` by then, and ``on_validation_epoch_end`` never runs. Lightning does not merge the loaders.
    Source: result.py ``_ResultCollection.log`` (``meta != self[key].meta``)."""
    world = run_world(
        dataloaders.validate_loaders,
        world_size,
        sizes=sizes,
        firsts=FIRSTS,
        logs=[log_spec("v", sync_dist=True, add_dataloader_idx=False)],
        expect_error=True,
    )

    errors = [rec["error"] for rec in world.records]
    assert all(e is not None and e["type"] == "MisconfigurationException" for e in errors), oracle.side_by_side(
        "error", errors
    )
    assert all(
        "You called `self.log(v, ...)` twice in `validation_step` with different arguments" in e["message"]
        for e in errors
    ), oracle.side_by_side("error", errors)
    loader1_batches = [len(rec["seen_ids"].get("1", [])) for rec in world.records]
    assert loader1_batches == [1] * world_size, oracle.side_by_side("loader 1 batches run", loader1_batches)
    padded_0 = _padded_mean(sizes[0], FIRSTS[0], world_size)
    got = [rec["callback_metrics"] for rec in world.records]
    assert got == [{"v": pytest.approx(padded_0)}] * world_size, oracle.side_by_side("callback_metrics", got)
    assert [rec["epoch_end_calls"] for rec in world.records] == [0] * world_size
    semantics.number("loader 1 batches before the error", loader1_batches[0])


@pytest.mark.parametrize("world_size, sizes", WORLDS)
def test_add_dataloader_idx_false_with_one_key_per_dataloader_gives_plain_keys(run_world, semantics, world_size, sizes):
    """With ``add_dataloader_idx=False`` and a different name per loader (``v0``, ``v1``), nothing
    clashes: the keys are exactly the names given, each synced over its own loader's padded shards."""
    world = run_world(
        dataloaders.validate_loaders,
        world_size,
        sizes=sizes,
        firsts=FIRSTS,
        logs=[log_spec("v{dataloader_idx}", sync_dist=True, add_dataloader_idx=False)],
    )

    padded = [_padded_mean(n, first, world_size) for n, first in zip(sizes, FIRSTS)]
    oracle.assert_distinct(padded_0=padded[0], padded_1=padded[1])
    got = [rec["callback_metrics"] for rec in world.records]
    expected = {"v0": pytest.approx(padded[0]), "v1": pytest.approx(padded[1])}
    assert got == [expected] * world_size, oracle.side_by_side("callback_metrics", got) + f"  expected {padded}"
    semantics.number("v1", got[0]["v1"])


@pytest.mark.parametrize("world_size, sizes", WORLDS)
def test_on_validation_epoch_end_runs_once_after_every_dataloader_idx_and_sees_their_synced_values(
    run_world, semantics, world_size, sizes
):
    """``on_validation_epoch_end`` runs once, after the last loader, not once per loader. By then each
    loader's epoch values are already synced and in ``self.trainer.callback_metrics``
    (``v/dataloader_idx_0`` and ``_1`` equal on every rank), but what the module collected itself in
    ``validation_step`` is only this rank's padded shard of each loader (different on every rank).
    Source: evaluation_loop.py ``_EvaluationLoop.run`` (``_store_dataloader_outputs`` after each loader,
    then ``on_run_end`` -> ``_on_evaluation_epoch_end``)."""
    world = run_world(
        dataloaders.validate_loaders, world_size, sizes=sizes, firsts=FIRSTS, logs=[log_spec("v", sync_dist=True)]
    )

    calls = [rec["epoch_end_calls"] for rec in world.records]
    assert calls == [1] * world_size, oracle.side_by_side("on_validation_epoch_end calls", calls)
    padded = [_padded_mean(n, first, world_size) for n, first in zip(sizes, FIRSTS)]
    at_end = [rec["epoch_end_callback_metrics"] for rec in world.records]
    expected = {f"v/dataloader_idx_{k}": pytest.approx(padded[k]) for k in (0, 1)}
    assert at_end == [expected] * world_size, oracle.side_by_side("callback_metrics in the hook", at_end)
    for k, (n, first) in enumerate(zip(sizes, FIRSTS)):
        held = [rec["epoch_end_ids"][str(k)] for rec in world.records]
        own = [_loader_shard(n, first, world_size, r) for r in range(world_size)]
        assert held == own, oracle.side_by_side(f"loader {k} outputs held", held) + f"  expected {own}"
        assert all(len(h) < n for h in held), oracle.side_by_side(f"loader {k} outputs held", held)
    semantics.number("on_validation_epoch_end calls", calls[0], vs=("dataloaders", len(sizes)))


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
