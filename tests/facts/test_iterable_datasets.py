"""Iterable datasets: Lightning does not shard a ``torch.utils.data.IterableDataset`` across ranks.

A ``DistributedSampler`` needs indices, and an ``IterableDataset`` has none. Lightning's
``_DataConnector._requires_distributed_sampler`` (pytorch_lightning/trainer/connectors/data_connector.py)
is False for a loader over one (``has_iterable_dataset``), so ``_prepare_dataloader`` returns the user's
``DataLoader`` untouched, and ``_update_dataloader`` (pytorch_lightning/utilities/data.py) never puts a
sampler into one either. Every rank iterates everything the dataset yields, and with
``num_workers=K`` every worker of every rank does too, unless the dataset itself shards by
``torch.distributed.get_rank()`` and ``torch.utils.data.get_worker_info()``. The only related warning
Lightning has (``has_len_all_ranks``: "Your `IterableDataset` has `__len__` defined ...") fires for an
iterable dataset that defines ``__len__``; a plain streaming dataset without it gets none.

The probe is ``ddpprobe.probes.iterable`` (``IdIterable`` yields ``IdDataset``'s items, value ``id ** 2``);
expected values come from ``tests/support/oracle.py``.
"""

from collections import Counter

import pytest

from ddpprobe.probes import iterable, log_spec
from tests.support import oracle

#: Samples and batch size: the mean of all samples (6.0), the padded mean a DistributedSampler would
#: give (5.0 at W = 2 and 3) and the mean of batch means (7.67) all differ.
N, BATCH = 5, 2
#: ``self.log`` plan: the batch mean of ``value`` synced (epoch mean), and the batch's sample count summed.
PLAN = [log_spec("v", sync_dist=True)]
COUNT = {"reduce_fx": "sum", "sync_dist": True}
#: Words a warning would use if Lightning warned that an iterable dataset is not sharded.
SHARDING_WORDS = ("iterabledataset", "sampler", "shard", "duplicate", "replicat")


def _flat(rec) -> list:
    return [i for batch in rec["seen_ids"] for i in batch]


def _sharding_warnings(rec) -> list:
    return [w["message"] for w in rec["warnings"] if any(word in w["message"].lower() for word in SHARDING_WORDS)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_iterable_dataset_is_not_sharded_so_every_rank_validates_every_sample_and_nothing_warns(
    run_world, semantics, world_size
):
    """``trainer.validate`` over ``DataLoader(IterableDataset)`` under DDP: every rank's
    ``validation_step`` sees all N samples in the dataset's order, and the loader keeps torch's
    ``_InfiniteConstantSampler`` (no ``DistributedSampler``). No rank gets a warning about it. Source:
    data_connector.py ``_requires_distributed_sampler`` (``not has_iterable_dataset(dataloader)``)."""
    world = run_world(iterable.validate_iterable, world_size, n=N, batch_size=BATCH, plan=PLAN, count=COUNT)

    seen = [rec["seen_ids"] for rec in world.records]
    expected = oracle.batches(list(range(N)), BATCH)
    if_sharded = [oracle.batches(oracle.shard(N, world_size, r), BATCH) for r in range(world_size)]
    assert if_sharded != [expected] * world_size
    semantics.number("samples evaluated", sum(len(_flat(rec)) for rec in world.records), vs=("N", N))
    assert seen == [expected] * world_size, (
        oracle.side_by_side("saw", seen) + f"  expected every rank {expected}; a DistributedSampler would give "
        f"{if_sharded}"
    )
    samplers = [rec["sampler"] for rec in world.records]
    assert samplers == ["_InfiniteConstantSampler"] * world_size, oracle.side_by_side("sampler", samplers)
    warned = [_sharding_warnings(rec) for rec in world.records]
    assert warned == [[]] * world_size, oracle.side_by_side("sharding warnings", warned)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_with_an_iterable_dataset_a_synced_sum_counts_every_sample_world_size_times_while_the_synced_mean_looks_right(
    run_world, semantics, world_size
):
    """The trap: ``self.log("count", len(batch), reduce_fx="sum", sync_dist=True)`` gives ``W * N`` on every
    rank (every rank counted every sample), while ``self.log("v", batch_mean, sync_dist=True)`` gives
    exactly the single-process mean, because a mean over W identical copies of the dataset is the
    dataset's mean. A check of the mean alone "passes" while every sample was evaluated W times.
    Source: result.py ``_ResultMetric.compute`` (the synced sum and the batch-size-weighted mean)."""
    world = run_world(iterable.validate_iterable, world_size, n=N, batch_size=BATCH, plan=PLAN, count=COUNT)

    true_count, true_mean = float(N), oracle.mean(oracle.values(range(N)))
    padded = oracle.padded_indices(N, max(world_size, 2))
    competing = {
        "padded_mean_if_sharded": oracle.mean(oracle.values(padded)),
        "mean_of_batch_means": oracle.mean(
            oracle.mean(oracle.values(b)) for b in oracle.batches(list(range(N)), BATCH)
        ),
    }
    oracle.assert_distinct(true_mean=true_mean, **competing)
    if world_size > 1:
        oracle.assert_distinct(
            count_world_size_times=world_size * N, true_count=true_count, padded_count_if_sharded=len(padded)
        )

    counts = [rec["callback_metrics"]["count"] for rec in world.records]
    means = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced sample count", counts[0], vs=("N", N))
    semantics.number("synced mean", means[0], vs=("single-process mean", true_mean))
    assert counts == pytest.approx([world_size * N] * world_size), (
        oracle.side_by_side("count", counts) + f"  expected W * N = {world_size * N}; N = {N}"
    )
    assert means == pytest.approx([true_mean] * world_size, rel=1e-6), (
        oracle.side_by_side("v", means) + f"  expected the single-process mean {true_mean}; competing {competing}"
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_with_num_workers_2_every_dataloader_worker_of_every_rank_yields_the_whole_iterable_dataset(
    run_world, semantics, world_size
):
    """``DataLoader(IterableDataset, num_workers=2)``: each worker process runs its own copy of
    ``__iter__``, so a dataset that does not look at ``get_worker_info()`` is yielded once per worker;
    the loader hands out the workers' batches in turn. Each rank sees every sample twice, and the synced
    ``reduce_fx="sum"`` count is ``W * 2 * N``; the synced mean is still the single-process mean.
    Source: torch/utils/data/dataloader.py (``_MultiProcessingDataLoaderIter``; the ``IterableDataset``
    docs: "each worker process gets a different copy of the dataset object")."""
    workers = 2
    world = run_world(
        iterable.validate_iterable, world_size, n=N, batch_size=BATCH, num_workers=workers, plan=PLAN, count=COUNT
    )

    per_worker = oracle.batches(list(range(N)), BATCH)
    expected = oracle.round_robin([per_worker] * workers)
    expected_workers = oracle.round_robin([[[w] * len(b) for b in per_worker] for w in range(workers)])
    true_mean = oracle.mean(oracle.values(range(N)))
    oracle.assert_distinct(
        count_per_worker_and_rank=world_size * workers * N, count_per_rank=world_size * N, true_count=N
    )

    seen = [rec["seen_ids"] for rec in world.records]
    assert seen == [expected] * world_size, oracle.side_by_side("saw", seen) + f"  expected every rank {expected}"
    got_workers = [rec["seen_workers"] for rec in world.records]
    assert got_workers == [expected_workers] * world_size, oracle.side_by_side("workers", got_workers)
    counts = [rec["callback_metrics"]["count"] for rec in world.records]
    means = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced sample count", counts[0], vs=("N", N))
    assert counts == pytest.approx([world_size * workers * N] * world_size), (
        oracle.side_by_side("count", counts) + f"  expected W * workers * N = {world_size * workers * N}"
    )
    assert means == pytest.approx([true_mean] * world_size, rel=1e-6), oracle.side_by_side("v", means)


#: Samples for the recipe: N divides by W, so the ranks hold equal numbers of samples (see
#: test_uneven_shards.py for what uneven ones do to a synced mean) and the count's mean is exact.
RECIPE_N = 12


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_iterable_dataset_sharded_by_rank_and_worker_is_validated_once_per_sample(run_world, semantics, world_size):
    """The recipe: in ``__iter__`` read ``torch.distributed.get_rank()``/``get_world_size()`` and
    ``torch.utils.data.get_worker_info()`` (``id``, ``num_workers``) and yield only samples ``i`` with
    ``i % (W * K) == rank * K + worker``. With ``num_workers=2`` every sample is then validated exactly
    once over all ranks and workers, the synced ``reduce_fx="sum"`` count is N, and the synced mean is
    the single-process mean. (The sharding is the dataset's own code, ``ddpprobe.probes.iterable.IdIterable``
    with ``shard="rank_and_worker"``; Lightning adds nothing.)"""
    workers, n = 2, RECIPE_N
    world = run_world(
        iterable.validate_iterable,
        world_size,
        n=n,
        batch_size=BATCH,
        num_workers=workers,
        shard="rank_and_worker",
        plan=PLAN,
        count=COUNT,
    )

    expected = [
        oracle.round_robin(
            [oracle.batches(oracle.rank_and_worker_shard(n, world_size, r, workers, w), BATCH) for w in range(workers)]
        )
        for r in range(world_size)
    ]
    seen = [rec["seen_ids"] for rec in world.records]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    every = Counter(i for rec in world.records for i in _flat(rec))
    assert every == Counter(range(n)), (
        f"samples seen other than once: {every - Counter(range(n))} extra, {Counter(range(n)) - every} missing"
    )

    true_mean = oracle.mean(oracle.values(range(n)))
    oracle.assert_distinct(true_count=n, count_unsharded=world_size * workers * n)
    counts = [rec["callback_metrics"]["count"] for rec in world.records]
    means = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced sample count", counts[0], vs=("N", n))
    semantics.number("synced mean", means[0], vs=("single-process mean", true_mean))
    assert counts == pytest.approx([n] * world_size), oracle.side_by_side("count", counts) + f"  expected N = {n}"
    assert means == pytest.approx([true_mean] * world_size, rel=1e-6), (
        oracle.side_by_side("v", means) + f"  expected {true_mean}"
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_iterable_dataset_with_len_warns_on_rank_0_only_about_worker_duplicates_and_is_still_not_sharded(
    run_world, semantics, world_size
):
    """The one warning Lightning has for iterable datasets: when the ``IterableDataset`` defines ``__len__``,
    ``has_len_all_ranks`` warns "Your `IterableDataset` has `__len__` defined. In combination with
    multi-process data loading (when num_workers > 1), `__len__` could be inaccurate if each worker is not
    configured independently to avoid having duplicate data." It speaks of workers, not ranks, and, like
    every ``rank_zero_warn``, appears on global rank 0 only; every rank still validates every sample.
    Source: pytorch_lightning/utilities/data.py ``has_len_all_ranks``."""
    world = run_world(iterable.validate_iterable, world_size, n=N, batch_size=BATCH, plan=PLAN, count=COUNT, sized=True)

    expected = oracle.batches(list(range(N)), BATCH)
    seen = [rec["seen_ids"] for rec in world.records]
    assert seen == [expected] * world_size, oracle.side_by_side("saw", seen) + f"  expected every rank {expected}"
    fragment = "Your `IterableDataset` has `__len__` defined."
    warned = [sum(fragment in w["message"] for w in rec["warnings"]) for rec in world.records]
    semantics.number("ranks warned", sum(1 for k in warned if k), vs=("world size", world_size))
    assert warned == [1] + [0] * (world_size - 1), oracle.side_by_side("len warnings", warned)
    counts = [rec["callback_metrics"]["count"] for rec in world.records]
    assert counts == pytest.approx([world_size * N] * world_size), oracle.side_by_side("count", counts)
