"""Samplers the user picks: ``use_distributed_sampler=False``, a user's ``DistributedSampler`` or unrepeated
sampler, and ``trainer.test`` next to ``trainer.validate``; each rank's own loader, empty on some ranks or all.

Lightning swaps in its own ``DistributedSampler`` only when all of these hold: ``use_distributed_sampler``
is on, the run is distributed, the loader's sampler is not already a ``DistributedSampler`` and the
dataset is not iterable (pytorch_lightning/trainer/connectors/data_connector.py
``_DataConnector._requires_distributed_sampler``). Otherwise the user's loader runs as given on every
rank. Sample ``i`` has value ``i * i`` (ddpprobe/probes/data.py); the probe logs each batch's mean.
"""

import pytest

from ddpprobe.probes import log_spec, samplers, samplers_per_loader
from tests.support import oracle, upstream

SYNCED = [log_spec("v", sync_dist=True)]


def _flat(nested) -> list:
    return [x for batch in nested for x in batch]


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_use_distributed_sampler_false_makes_every_rank_see_the_whole_dataset(run_world, semantics, world_size, n):
    """With ``Trainer(use_distributed_sampler=False)`` and a plain map-style loader, Lightning leaves the
    loader's ``SequentialSampler`` in place: every rank's ``validation_step`` sees all N samples, so the
    world evaluates W * N samples. A synced mean then equals the single-process mean (every sample
    counted W times), not the padded mean ``DistributedSampler`` would give, and nothing warns.
    Source: data_connector.py ``_requires_distributed_sampler`` (``use_distributed_sampler`` is off)."""
    world = run_world(
        samplers.evaluate_with_sampler, world_size, n=n, batch_size=2, use_distributed_sampler=False, logs=SYNCED
    )

    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    assert seen == [list(range(n))] * world_size, oracle.side_by_side("saw", seen) + f"  expected 0..{n - 1} on each"
    assert [rec["sampler"] for rec in world.records] == ["SequentialSampler"] * world_size
    single_process = oracle.mean(oracle.values(range(n)))
    padded = oracle.mean(oracle.values(oracle.padded_indices(n, world_size)))
    oracle.assert_distinct(
        single_process=single_process,
        padded=padded,
        rank0_shard=oracle.mean(oracle.values(oracle.shard(n, world_size, 0))),
    )
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    assert got == pytest.approx([single_process] * world_size), (
        oracle.side_by_side("v", got) + f"  expected {single_process}, padded would be {padded}"
    )
    replicate = [sum("replicates some samples" in w["message"] for w in rec["warnings"]) for rec in world.records]
    assert replicate == [0] * world_size, oracle.side_by_side("replicate warnings", replicate)
    semantics.number("samples evaluated by the world", sum(len(s) for s in seen), vs=("dataset", n))


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_use_distributed_sampler_keeps_a_user_distributed_sampler_with_drop_last_so_the_last_samples_are_never_seen(
    run_world, semantics, world_size, n
):
    """A loader that already has a ``DistributedSampler`` keeps it, even with ``use_distributed_sampler``
    on: with the user's ``drop_last=True`` each rank gets ``floor(N/W)`` samples and the last ``N % W``
    samples are evaluated by no rank (none are padded). The synced mean is the mean over the kept
    samples only: lower than the single-process mean here, since the dropped ones have the largest
    values. Lightning does not warn about it.
    Source: data_connector.py ``_requires_distributed_sampler`` (``isinstance(dataloader.sampler,
    DistributedSampler)``); torch/utils/data/distributed.py ``DistributedSampler`` (``drop_last``)."""
    world = run_world(samplers.evaluate_with_sampler, world_size, n=n, batch_size=2, sampler="drop_last", logs=SYNCED)

    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    expected = [oracle.drop_last_shard(n, world_size, r) for r in range(world_size)]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    dropped = sorted(set(range(n)) - set(_flat(seen)))
    assert dropped == list(range(n - n % world_size, n)), f"never seen: {dropped}"
    kept = [(rec["sampler"], rec["drop_last"], rec["same_sampler"]) for rec in world.records]
    assert kept == [("DistributedSampler", True, True)] * world_size, oracle.side_by_side("sampler", kept)

    kept_mean = oracle.mean(oracle.values(_flat(expected)))
    single_process = oracle.mean(oracle.values(range(n)))
    padded = oracle.mean(oracle.values(oracle.padded_indices(n, world_size)))
    oracle.assert_distinct(kept=kept_mean, single_process=single_process, padded=padded)
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    assert got == pytest.approx([kept_mean] * world_size), (
        oracle.side_by_side("v", got) + f"  expected mean of kept samples {kept_mean}, single-process {single_process}"
    )
    replicate = [sum("DistributedSampler" in w["message"] for w in rec["warnings"]) for rec in world.records]
    assert replicate == [0] * world_size, oracle.side_by_side("DistributedSampler warnings", replicate)
    semantics.number("synced mean with drop_last", got[0], vs=("single-process mean", single_process))


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_use_distributed_sampler_keeps_a_user_unrepeated_sampler_so_ranks_run_different_batch_counts(
    run_world, semantics, world_size, n
):
    """A user-supplied ``UnrepeatedDistributedSampler`` (Lightning's own, the one predict uses) is a
    ``DistributedSampler`` subclass, so validate keeps it: rank r sees r, r+W, ... below N, every sample
    exactly once, and with batch size 1 the ranks run different numbers of batches (ceil or floor of N/W).
    Epoch-level syncing still works because it is one collective per key on every rank: a synced
    ``reduce_fx="sum"`` of the per-sample values is the dataset's sum.
    Source: data_connector.py ``_requires_distributed_sampler``; overrides/distributed.py
    ``UnrepeatedDistributedSampler``; result.py ``_ResultMetric.compute`` (one sync per key at epoch end)."""
    logs = [log_spec("s", sync_dist=True, reduce_fx="sum")]
    world = run_world(samplers.evaluate_with_sampler, world_size, n=n, batch_size=1, sampler="unrepeated", logs=logs)

    seen = [rec["seen_ids"] for rec in world.records]
    expected = [oracle.batches(oracle.unrepeated_shard(n, world_size, r), 1) for r in range(world_size)]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    assert len({len(s) for s in seen}) > 1, oracle.side_by_side("batches", [len(s) for s in seen])
    kept = [(rec["sampler"], rec["same_sampler"]) for rec in world.records]
    assert kept == [("UnrepeatedDistributedSampler", True)] * world_size, oracle.side_by_side("sampler", kept)

    dataset_sum = sum(oracle.values(range(n)))
    local_sums = [sum(oracle.values(oracle.unrepeated_shard(n, world_size, r))) for r in range(world_size)]
    oracle.assert_distinct(dataset=dataset_sum, **{f"rank{r}_local": s for r, s in enumerate(local_sums)})
    got = [rec["callback_metrics"]["s"] for rec in world.records]
    assert got == pytest.approx([dataset_sum] * world_size), (
        oracle.side_by_side("s", got) + f"  expected dataset sum {dataset_sum}"
    )
    semantics.number("batches per rank", str([len(s) for s in seen]))
    semantics.number("synced sum", got[0], vs=("dataset sum", dataset_sum))


@upstream.FLOORED_COUNT_BUG
@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_with_a_user_unrepeated_sampler_the_synced_mean_is_the_dataset_mean(run_world, semantics, world_size, n):
    """With an unrepeated sampler every sample is evaluated exactly once, so a synced
    ``reduce_fx="mean"`` should be the dataset's mean. But the ranks' sample counts sum to N, which does
    not divide by W, and Lightning averages the integer counts across ranks with a floor: the synced
    mean comes out as ``(sum / W) / floor(N / W)`` (7.5 instead of 6.0 for N=5, W=2; see
    ``test_with_a_user_unrepeated_sampler_the_synced_mean_is_inflated_by_the_floored_count``), the bug of
    the floored-count fact in test_log_reductions.py met through a sampler that does not pad.
    Source: result.py ``_ResultMetric.compute``; lightning_fabric/utilities/distributed.py ``_sync_ddp``."""
    world = run_world(samplers.evaluate_with_sampler, world_size, n=n, batch_size=1, sampler="unrepeated", logs=SYNCED)

    dataset_mean = oracle.mean(oracle.values(range(n)))
    floored = oracle.floored_sync_mean(
        [[(v, 1) for v in oracle.values(oracle.unrepeated_shard(n, world_size, r))] for r in range(world_size)]
    )
    oracle.assert_distinct(dataset=dataset_mean, floored=floored)
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced mean", got[0], vs=("dataset mean", dataset_mean))
    assert got == pytest.approx([dataset_mean] * world_size), (
        oracle.side_by_side("v", got) + f"  expected dataset mean {dataset_mean}; floored-count mean is {floored}"
    )


@upstream.FLOORED_COUNT_TODAY
@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_with_a_user_unrepeated_sampler_the_synced_mean_is_inflated_by_the_floored_count(
    run_world, semantics, world_size, n
):
    """What Lightning gives today for the same log: each rank saw its unrepeated shard once, with
    ``batch_size=1``, so the ranks' int64 batch-size counts add up to N; ``_ResultMetric.compute``
    mean-syncs them in integer arithmetic, and every rank gets ``(sum(v) / W) / floor(N / W)``: 7.5
    instead of 6.0 for N=5, W=2, and 15.17 instead of 13.0 for N=7, W=3. Upstream issue
    https://github.com/Lightning-AI/pytorch-lightning/issues/21859. Source: result.py
    ``_ResultMetric.compute``; lightning_fabric/utilities/distributed.py ``_sync_ddp``."""
    world = run_world(samplers.evaluate_with_sampler, world_size, n=n, batch_size=1, sampler="unrepeated", logs=SYNCED)

    shards = [oracle.unrepeated_shard(n, world_size, r) for r in range(world_size)]
    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    assert seen == shards, oracle.side_by_side("saw", seen) + f"  expected {shards}"
    assert n % world_size != 0, "the counts add up to N, which must not divide by W for the floor to bite"
    logged = [[(v, 1) for v in oracle.values(shard)] for shard in shards]
    floored = oracle.floored_sync_mean(logged)
    dataset_mean = oracle.mean(oracle.values(range(n)))
    mean_of_rank_means = oracle.mean(oracle.log_reduce("mean", rank) for rank in logged)
    oracle.assert_distinct(floored_count=floored, dataset=dataset_mean, mean_of_rank_means=mean_of_rank_means)
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    semantics.number("synced mean", got[0], vs=("dataset mean", dataset_mean))
    assert got == pytest.approx([floored] * world_size, rel=1e-6), (
        oracle.side_by_side("v", got) + f"  expected (floored count) {floored}; dataset mean {dataset_mean}; "
        f"mean of rank means {mean_of_rank_means}"
    )


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_trainer_test_pads_and_warns_like_validate_when_n_does_not_divide_by_world_size(
    run_world, semantics, world_size, n
):
    """``trainer.test`` gets the same treatment as ``trainer.validate``: a ``DistributedSampler``
    (shuffle off) that pads the N samples to ``ceil(N/W) * W`` by repeating the first ones, the same
    ``PossibleUserWarning`` on rank 0 (naming ``trainer.test()``), and a synced mean over the padded set:
    5.0 instead of 6.0 for N=5, W=2.
    Source: data_connector.py ``_resolve_sampler`` (``TrainerFn.TESTING`` next to ``VALIDATING``)."""
    world = run_world(samplers.evaluate_with_sampler, world_size, n=n, batch_size=2, stage="test", logs=SYNCED)

    seen = [_flat(rec["seen_ids"]) for rec in world.records]
    expected = [oracle.shard(n, world_size, r) for r in range(world_size)]
    assert seen == expected, oracle.side_by_side("saw", seen) + f"  expected {expected}"
    assert [rec["sampler"] for rec in world.records] == ["DistributedSampler"] * world_size
    padded = oracle.mean(oracle.values(oracle.padded_indices(n, world_size)))
    single_process = oracle.mean(oracle.values(range(n)))
    oracle.assert_distinct(padded=padded, single_process=single_process)
    got = [rec["callback_metrics"]["v"] for rec in world.records]
    assert got == pytest.approx([padded] * world_size), (
        oracle.side_by_side("v", got) + f"  expected padded mean {padded}, single-process {single_process}"
    )
    warned = [
        sum(
            "During `trainer.test()`" in w["message"] and "replicates some samples" in w["message"]
            for w in rec["warnings"]
        )
        for rec in world.records
    ]
    assert warned == [1] + [0] * (world_size - 1), oracle.side_by_side("trainer.test() warnings", warned)
    semantics.number("synced test mean", got[0], vs=("single-process mean", single_process))


#: Lightning's warning when every rank's loader is empty, a ``UserWarning`` (``rank_zero_warn``'s default) on
#: rank 0 (pytorch_lightning/utilities/data.py ``has_len_all_ranks``).
ZERO_LENGTH_WARNING = "Total length of `DataLoader` across ranks is zero. Please make sure this was your intention."


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
