"""The original question's own metric: per-label F1, precision and recall at the threshold that gives the
best F1, chosen on the validation set, under DDP.

The threshold is *chosen on the data*, so every recipe chooses it on some part of the data: the rank's shard
(the original code, from rank-local outputs in ``on_validation_epoch_end``), each batch (averaging per-batch
values with ``sync_dist=True``, the usual advice), or the whole set (``all_gather`` of scores and labels, or a
torchmetrics curve metric whose states are synced). Only the whole-set recipes can give the single-process
numbers, and only after ``DistributedSampler``'s padding duplicates are dropped: a duplicated sample counts
twice and can move the chosen threshold. A fixed threshold grid (constant memory) can only choose one of its
points. Expected values: scikit-learn's ``precision_recall_curve`` on the sample ids each recipe sees
(tests/support/oracle.py). Sources: torchmetrics/classification/precision_recall_curve.py
``MultilabelPrecisionRecallCurve``; pytorch_lightning/core/module.py ``LightningModule.all_gather``; the probe
is ddpprobe/probes/multilabel.py. Memory per recipe: benchmarks/memory.md.
"""

import pytest

from ddpprobe.probes import multilabel
from tests.support import oracle

NAMES = ("f1", "precision", "recall", "threshold")
CASES = [(2, 11, 3), (3, 16, 4)]


def _assert_recipe(world, recipe: str, expected_per_rank: list) -> None:
    """Every rank's ``{recipe}_{name}_{label}`` equals ``expected_per_rank[rank][label][name]``."""
    for rank in world:
        got = rank.record["callback_metrics"]
        for label in range(multilabel.NUM_LABELS):
            for name in NAMES:
                key = f"{recipe}_{name}_{label}"
                expected = expected_per_rank[rank.rank][label][name]
                assert got[key] == pytest.approx(expected, abs=1e-6), (
                    oracle.side_by_side(key, [r.record["callback_metrics"][key] for r in world])
                    + f"  expected on rank {rank.rank}: {expected}"
                )


@pytest.mark.parametrize("world_size, n, batch_size", CASES)
def test_a_best_threshold_chosen_on_rank_local_outputs_is_each_ranks_own_threshold_and_scores(
    run_world, semantics, world_size, n, batch_size
):
    """The original code: in ``on_validation_epoch_end`` each rank searches the best threshold on the outputs
    it collected, i.e. on its own shard. Each rank gets scikit-learn's best-threshold F1/precision/recall on its
    shard, not on the whole set; logged without ``sync_dist``, the logger writes rank 0's."""
    world = run_world(multilabel.best_threshold_recipes, world_size, n=n, batch_size=batch_size)

    per_rank = [
        [oracle.best_threshold_scores(oracle.shard(n, world_size, r), k) for k in range(multilabel.NUM_LABELS)]
        for r in range(world_size)
    ]
    single = [oracle.best_threshold_scores(range(n), k) for k in range(multilabel.NUM_LABELS)]
    for k in range(multilabel.NUM_LABELS):
        assert per_rank[0][k]["ties"] == 1 and single[k]["ties"] == 1, "data must have one best threshold"
        oracle.assert_distinct(rank0_f1=per_rank[0][k]["f1"], single_process_f1=single[k]["f1"])
    semantics.number(
        "rank 0's best-threshold F1 (label 0)",
        world[0].record["callback_metrics"]["a_f1_0"],
        vs=("single-process", single[0]["f1"]),
    )
    _assert_recipe(world, "a", per_rank)


@pytest.mark.parametrize("world_size, n, batch_size", CASES)
def test_b_averaging_per_batch_best_threshold_f1_gives_neither_the_whole_set_f1_nor_one_threshold(
    run_world, semantics, world_size, n, batch_size
):
    """The usual advice, "compute it per batch and log with ``sync_dist=True``": each batch chooses its own
    threshold, and Lightning averages the batches' numbers (batch-size weighted) over batches and ranks. The
    result is the same on every rank but is no F1 at any one threshold: it differs from the whole-set value,
    and the logged "threshold" is a mean of thresholds."""
    world = run_world(multilabel.best_threshold_recipes, world_size, n=n, batch_size=batch_size)

    expected = [
        {name: oracle.best_threshold_per_batch_mean(n, world_size, batch_size, k, name) for name in NAMES}
        for k in range(multilabel.NUM_LABELS)
    ]
    single = [oracle.best_threshold_scores(range(n), k) for k in range(multilabel.NUM_LABELS)]
    padded = [
        oracle.best_threshold_scores(oracle.padded_indices(n, world_size), k) for k in range(multilabel.NUM_LABELS)
    ]
    for k in range(multilabel.NUM_LABELS):
        oracle.assert_distinct(
            mean_of_batches_f1=expected[k]["f1"], single_process_f1=single[k]["f1"], padded_set_f1=padded[k]["f1"]
        )
    semantics.number(
        "mean of per-batch best F1 (label 0)",
        world[0].record["callback_metrics"]["b_f1_0"],
        vs=("single-process", single[0]["f1"]),
    )
    _assert_recipe(world, "b", [expected] * world_size)


@pytest.mark.parametrize("world_size, n, batch_size", CASES)
def test_c_all_gather_and_d_a_synced_curve_metric_choose_the_threshold_on_the_padded_set_and_e_dropping_duplicates_gives_the_single_process_numbers(  # noqa: E501 (the name states the fact; the audit and the card cite it)
    run_world, semantics, world_size, n, batch_size
):
    """Whole-set recipes: (c) ``self.all_gather`` of scores and labels and (d) torchmetrics
    ``MultilabelPrecisionRecallCurve(thresholds=None)`` (list states gathered at ``compute()``) both choose the
    threshold on the padded set the ranks evaluated, identical on every rank. ``DistributedSampler`` repeats
    ``ceil(N/W)*W - N`` samples, which changes the chosen threshold of at least one label here. (e) gathering
    the sample ids too and keeping each sample once gives scikit-learn's single-process numbers exactly."""
    world = run_world(multilabel.best_threshold_recipes, world_size, n=n, batch_size=batch_size)

    padded = [
        oracle.best_threshold_scores(oracle.padded_indices(n, world_size), k) for k in range(multilabel.NUM_LABELS)
    ]
    single = [oracle.best_threshold_scores(range(n), k) for k in range(multilabel.NUM_LABELS)]
    for k in range(multilabel.NUM_LABELS):
        assert padded[k]["ties"] == 1 and single[k]["ties"] == 1, "data must have one best threshold"
        oracle.assert_distinct(padded_set_f1=padded[k]["f1"], single_process_f1=single[k]["f1"])
    moved = [k for k in range(multilabel.NUM_LABELS) if padded[k]["threshold"] != single[k]["threshold"]]
    assert moved, "the data must show padding moving a chosen threshold"
    got = world[0].record["callback_metrics"]
    semantics.number(
        f"threshold chosen on the padded set (label {moved[0]})",
        got[f"c_threshold_{moved[0]}"],
        vs=("single-process threshold", single[moved[0]]["threshold"]),
    )
    semantics.number("deduplicated best-threshold F1 (label 0)", got["e_f1_0"], vs=("single-process", single[0]["f1"]))
    _assert_recipe(world, "c", [padded] * world_size)
    _assert_recipe(world, "d", [padded] * world_size)
    _assert_recipe(world, "e", [single] * world_size)


@pytest.mark.parametrize("world_size, n, batch_size", CASES)
def test_g_a_fixed_threshold_grid_metric_chooses_only_grid_thresholds_and_is_approximate(
    run_world, semantics, world_size, n, batch_size
):
    """``MultilabelPrecisionRecallCurve(thresholds=GRID)`` keeps a confusion matrix per grid point (constant
    memory, summed over ranks at ``compute()``), so its best threshold is the best *grid* point on the padded
    set: an approximation whose F1 is at most the exact best. The gap is computed here per label."""
    world = run_world(multilabel.best_threshold_recipes, world_size, n=n, batch_size=batch_size)

    grid = [i / (multilabel.GRID - 1) for i in range(multilabel.GRID)]
    padded_ids = oracle.padded_indices(n, world_size)
    on_grid = [oracle.best_threshold_on_grid(padded_ids, k, grid) for k in range(multilabel.NUM_LABELS)]
    exact = [oracle.best_threshold_scores(padded_ids, k) for k in range(multilabel.NUM_LABELS)]
    gaps = [exact[k]["f1"] - on_grid[k]["f1"] for k in range(multilabel.NUM_LABELS)]
    single_grid = oracle.best_threshold_on_grid(range(n), 0, grid)
    rank0_grid = oracle.best_threshold_on_grid(oracle.shard(n, world_size, 0), 0, grid)
    oracle.assert_distinct(
        padded_set_grid_f1=on_grid[0]["f1"],
        single_process_grid_f1=single_grid["f1"],
        rank0_shard_grid_f1=rank0_grid["f1"],
    )
    assert all(gap > -1e-9 for gap in gaps) and any(gap > 1e-6 for gap in gaps), f"grid gaps {gaps}"
    semantics.number("largest F1 lost to the grid", max(gaps), vs=("exact best F1", exact[gaps.index(max(gaps))]["f1"]))
    _assert_recipe(world, "g", [on_grid] * world_size)
