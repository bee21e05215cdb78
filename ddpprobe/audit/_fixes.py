"""The advice the audit prints: each fix with the fact test that proves it, and what Lightning 2.x does with a
removed 1.x hook. Pure Python. (Which fix fits a divergence of the ranks' collectives is decided from the
evidence in ddpprobe/audit/_evidence.py ``diagnose``.)"""

from __future__ import annotations

#: Each fix the audit prints, with the fact test that shows the fix gives the right value. A test of the
#: audit (tests/tooling/audit/test_audit_fixes.py) checks that every named test exists.
FIXES = {
    "metric_object": (
        "log a torchmetrics Metric object (self.log(key, metric)); its state (counts) is summed over ranks "
        "at compute(), so F1-like scores are those of the whole set",
        "tests/facts/test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",
    ),
    "sync_dist": (
        "sync_dist=True for a per-sample mean (each batch's mean, logged with its batch_size)",
        "tests/facts/test_logging_sync_dist.py::test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset",
    ),
    "mean_metric": (
        "log a torchmetrics MeanMetric updated with each batch (its weighted sum and weight are summed over "
        "ranks as floats, so no integer count is averaged)",
        "tests/facts/test_uneven_shards.py::test_uneven_shards_logged_through_a_torchmetrics_mean_metric_give_the_true_mean",
    ),
    "dedupe": (
        "drop the repeated samples: all_gather the sample ids with the outputs and keep each id once, or use "
        "a set whose size divides by the world size",
        "tests/facts/test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",
    ),
    "gather_dedupe": (
        "all_gather the scores, labels and sample ids in on_validation_epoch_end, drop the repeated ids, and "
        "compute the metric (and choose any threshold) on that whole set, on every rank",
        "tests/facts/test_multilabel_best_threshold_f1.py::test_c_all_gather_and_d_a_synced_curve_metric_choose_the_threshold_on_the_padded_set_and_e_dropping_duplicates_gives_the_single_process_numbers",
    ),
    "rank_zero_only": (
        "log a value that only rank 0 computes with rank_zero_only=True (no collective), or compute and log "
        "it on every rank",
        "tests/facts/test_collectives.py::test_rank_zero_only_logging_under_if_global_rank_0_completes_and_only_rank_0_holds_the_value",
    ),
    "step_sync": (
        "a tensor logged with sync_dist=True gives every rank the mean over the ranks at each step",
        "tests/facts/test_log_reductions.py::test_the_step_value_is_the_unweighted_mean_over_ranks_and_the_epoch_value_is_batch_size_weighted",
    ),
    "metric_step_sync": (
        "build the Metric with dist_sync_on_step=True so each step's value covers every rank's batch (one "
        "collective per step: every rank must call it at every step)",
        "tests/facts/test_collective_hazards_torchmetrics.py::test_dist_sync_on_step_makes_the_step_value_the_sum_over_every_ranks_batch_at_that_step",
    ),
    "shard_iterable": (
        "shard the IterableDataset by rank (and DataLoader worker): each rank yields the samples i with "
        "i % world_size == rank",
        "tests/facts/test_iterable_datasets.py::test_an_iterable_dataset_sharded_by_rank_and_worker_is_validated_once_per_sample",
    ),
    "even_batches_step": (
        "give every rank the same number of batches (cut the shards to equal batch counts) before logging "
        "on_step with sync_dist=True",
        "tests/facts/test_uneven_shards.py::test_uneven_shards_cut_to_equal_batch_counts_let_a_step_level_synced_log_finish",
    ),
    "even_batches_fit": (
        "give every rank the same number of training batches (cut the shards to equal batch counts): DDP "
        "all-reduces gradients at every step",
        "tests/facts/test_uneven_shards.py::test_uneven_shards_cut_to_equal_batch_counts_let_fit_with_a_synced_epoch_log_finish",
    ),
    "even_batches": (
        "give every rank the same number of batches (Lightning's DistributedSampler pads a map-style dataset; "
        "cut an IterableDataset's shards to equal batch counts)",
        "tests/facts/test_uneven_shards.py::test_uneven_shards_cut_to_equal_batch_counts_let_fit_with_a_synced_epoch_log_finish",
    ),
    "pad_gather": (
        "pad each rank's tensor to one shape before all_gather, gather the true sizes too, and trim",
        "tests/facts/test_collectives.py::test_pad_gather_trim_returns_every_ranks_rows_for_uneven_first_dimensions",
    ),
    "compute_everywhere": (
        "call metric.compute() (and any collective) on every rank; print or use the result on rank 0 only",
        "tests/facts/test_collective_hazards_torchmetrics.py::test_metric_compute_on_every_rank_gives_every_rank_the_whole_set_value_and_self_print_prints_once",
    ),
    "collective_everywhere": (
        "make the collective on every rank (outside the branch on the rank) and branch on its result: "
        "every rank then holds every rank's data",
        "tests/facts/test_collectives.py::test_all_gather_stacks_every_ranks_tensor_along_a_new_first_dimension_in_rank_order",
    ),
    "same_keys": (
        "log the same keys in the same order on every rank (put the rank in the value, not in the key)",
        "tests/facts/test_collective_hazards_keys.py::test_every_rank_logging_the_same_keys_in_the_same_order_gives_each_key_its_all_rank_mean",
    ),
    "predict_writer": (
        "keep collectives out of predict_step: write each rank's predictions with their batch indices (a "
        "BasePredictionWriter) and merge them by index",
        "tests/facts/test_predict.py::test_predict_recipe_merging_every_rank_s_written_predictions_by_index_equals_single_process",
    ),
}


def fix_line(name: str) -> str:
    """``"Fix: <what> (shown by <test>)"`` for a :data:`FIXES` entry."""
    text, test = FIXES[name]
    return f"Fix: {text}" + (f" (shown by {test})" if test else "")


#: Lightning 1.x hooks removed in 2.0, and what 2.x does with a module that still defines one.
#: Source: pytorch_lightning/trainer/configuration_validator.py (``*_epoch_end`` raise
#: ``NotImplementedError``; ``*_step_end`` are no longer looked up, so they are never called);
#: Lightning-AI/pytorch-lightning PR #16520 (epoch_end) and #16791 (step_end).
REMOVED_HOOKS = {
    "training_epoch_end": "raises NotImplementedError in fit; use on_train_epoch_end and keep outputs yourself",
    "validation_epoch_end": "raises NotImplementedError in fit/validate; use on_validation_epoch_end",
    "test_epoch_end": "raises NotImplementedError in test; use on_test_epoch_end",
    "training_step_end": "silently never called; move its code into training_step",
    "validation_step_end": "silently never called; move its code into validation_step",
    "test_step_end": "silently never called; move its code into test_step",
}
