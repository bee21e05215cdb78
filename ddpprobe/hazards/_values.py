# ruff: noqa: E501 - a fact test's name states the fact, and the entries cite them whole
"""The registry's entries about values: the samples the ranks ran, how a logged value is reduced, and values each
rank keeps for itself."""

from __future__ import annotations

from ddpprobe.hazards._hazard import F, Hazard, _iterable, _tensor_sync_dist

VALUES = (
    # --- the samples the ranks ran ---------------------------------------------------------------------
    Hazard(
        "repeated_samples",
        "DistributedSampler pads each rank's shard with repeated samples",
        (
            F + "test_sharding.py::test_distributed_sampler_pads_by_repeating_the_first_samples_when_n_does_not_divide",
            F
            + "test_logging_sync_dist.py::test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset",
        ),
        "repeated samples: the ranks ran {total} samples, {duplicates} of them repeats ({repeated}); {sampler} pads "
        "each rank to the same length",
        ("samples per rank", "duplicates", "sampler"),
        "drop the repeated samples: all_gather the sample ids with the outputs and keep each id once, or use a set "
        "whose size divides by the world size",
        F + "test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",
        "samples the ranks really repeated",
        lambda ev: isinstance(ev["duplicates"], int) and ev["duplicates"] > 0,
    ),
    Hazard(
        "unsharded_data",
        "every rank runs every sample (the data is not sharded)",
        (
            F
            + "test_iterable_datasets.py::test_an_iterable_dataset_is_not_sharded_so_every_rank_validates_every_sample_and_nothing_warns",
            F + "test_user_samplers.py::test_use_distributed_sampler_false_makes_every_rank_see_the_whole_dataset",
        ),
        "unsharded data: every rank ran all {samples} samples of the {loop} set (identified by {by}), so each sample "
        "counts {world_size} times",
        ("samples per rank", "sampler"),
        "shard the IterableDataset by rank (and DataLoader worker): each rank yields the samples i with "
        "i % world_size == rank",
        F
        + "test_iterable_datasets.py::test_an_iterable_dataset_sharded_by_rank_and_worker_is_validated_once_per_sample",
        "an IterableDataset (a map-style set is sharded by Lightning's DistributedSampler)",
        _iterable,
    ),
    Hazard(
        "missing_samples",
        "samples of the set run on no rank (a sampler the ranks shard again, or drop_last)",
        (
            F
            + "test_user_samplers.py::test_use_distributed_sampler_keeps_a_user_distributed_sampler_with_drop_last_so_the_last_samples_are_never_seen",
        ),
        "missing samples: {missing} sample(s) of W=1 ran on no rank ({labels}); the single-process value recomputed "
        "without them is {without}, the measured value",
        ("samples per rank", "missing samples", "sampler"),
    ),
    Hazard(
        "missing_samples_synced_correctly",
        "samples of the set run on no rank; the synced mean is right for the samples that ran",
        (
            F
            + "test_user_samplers.py::test_use_distributed_sampler_keeps_a_user_distributed_sampler_with_drop_last_so_the_last_samples_are_never_seen",
        ),
        "missing samples: {missing} sample(s) of W=1 ran on no rank ({labels}); the synced mean recomputed from the "
        "ranks' logged values and batch sizes is {recomputed}, the measured value: the sync is right for the samples "
        "that ran, and the difference from single-process is the samples that did not",
        ("samples per rank", "missing samples", "recomputed synced mean", "sampler"),
    ),
    # --- how a logged value is reduced -----------------------------------------------------------------
    Hazard(
        "floored_count",
        "the synced epoch mean divides by a floored int64 count (upstream #21859)",
        (
            F
            + "test_log_reductions.py::test_the_synced_epoch_mean_divides_by_the_floored_mean_of_the_integer_batch_size_counts",
            F
            + "test_uneven_shards.py::test_uneven_shards_floor_the_synced_count_so_the_epoch_level_synced_mean_is_inflated",
        ),
        "the upstream floored-count bug ({issue}): the ranks' batch-size totals {totals} sum to {count}, which does "
        "not divide by W={w}; Lightning averages the int64 count in integers (floor({count}/{w}) = {floored_count}), "
        "so every rank gets {floored} instead of the recomputed {correct}",
        ("batch-size totals per rank", "recomputed synced mean", "with floored count"),
        "log a torchmetrics MeanMetric updated with each batch (its weighted sum and weight are summed over ranks as "
        "floats, so no integer count is averaged)",
        F + "test_uneven_shards.py::test_uneven_shards_logged_through_a_torchmetrics_mean_metric_give_the_true_mean",
        "a tensor logged with sync_dist=True (not a Metric object)",
        _tensor_sync_dist,
    ),
    Hazard(
        "non_decomposable",
        "a synced average of per-batch values of a metric that is not a per-sample mean (F1, AUC)",
        (F + "test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",),
        "non-decomposable: {shown}: {why}",
        ("measured", "single-process", "recomputed synced mean"),
        "log a torchmetrics Metric object (self.log(key, metric)); its state (counts) is summed over ranks at "
        "compute(), so F1-like scores are those of the whole set",
        F + "test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",
    ),
    Hazard(
        "unweighted_rank_mean",
        "a value logged once per rank, averaged over ranks without their sample counts",
        (
            F
            + "test_log_reductions.py::test_the_step_value_is_the_unweighted_mean_over_ranks_and_the_epoch_value_is_batch_size_weighted",
        ),
        "an unweighted mean over ranks of per-rank values, with unequal sample counts {samples}: weighting each rank "
        "by its samples gives single-process",
        ("per-rank values", "samples per rank", "sample-weighted mean of per-rank values"),
        "log a torchmetrics MeanMetric updated with each batch (its weighted sum and weight are summed over ranks as "
        "floats, so no integer count is averaged)",
        F + "test_uneven_shards.py::test_uneven_shards_logged_through_a_torchmetrics_mean_metric_give_the_true_mean",
    ),
    Hazard(
        "int64_reduce",
        "trainer.strategy.reduce of an int64 tensor truncates the mean toward zero",
        (
            F
            + "test_reductions_outside_log.py::test_strategy_reduce_mean_of_an_int64_tensor_is_truncated_toward_zero_and_stays_int64",
        ),
        "{where} reduced an int64 tensor with trainer.strategy.reduce ({op} int64 on every rank): the mean of "
        "integers is truncated toward zero and stays int64",
        ("call site", "op", "dtype"),
        "reduce a float64 tensor (x.double()), whose mean is exact, and cast back where an integer is needed",
        F
        + "test_reductions_outside_log.py::test_strategy_reduce_of_an_integer_count_as_a_float64_tensor_is_the_exact_mean",
        "a reduce_op='mean' (the default) of an integer tensor",
        lambda ev: ev["dtype"] in ("int64", "int32", "int16", "int8", "uint8"),
    ),
    Hazard(
        "bool_reduce",
        "trainer.strategy.reduce of a bool tensor is any() over ranks, for mean and sum",
        (F + "test_reductions_outside_log.py::test_strategy_reduce_of_a_bool_tensor_is_any_for_mean_and_sum",),
        "{where} reduced a bool tensor of shape {shape} with trainer.strategy.reduce ({op} bool on every rank): "
        "the sum and the mean of bools over ranks are any() per element (True where one rank holds True), not "
        "a count nor a fraction of the ranks' values",
        ("call site", "op", "dtype"),
        "reduce a float tensor (x.float()), whose sum and mean over ranks are exact, and compare afterwards",
        F
        + "test_reductions_outside_log.py::test_strategy_reduce_of_a_float_tensor_is_the_exact_mean_or_sum_in_float32",
        "a bool tensor reduced",
        lambda ev: ev["dtype"] == "bool",
    ),
    # --- values each rank keeps for itself -------------------------------------------------------------
    Hazard(
        "rank_local_mean",
        "a per-sample mean logged without sync_dist: each rank keeps its shard's value",
        (
            F
            + "test_logging_sync_dist.py::test_without_sync_dist_each_rank_keeps_its_own_value_and_only_rank_0s_reaches_the_log_file",
        ),
        "each rank keeps its own shard's value; the logger writes rank 0's value only; the mean of the ranks' values "
        "equals single-process, so sync_dist=True gives it",
        ("per-rank values", "mean of the ranks' values", "single-process"),
        "sync_dist=True for a per-sample mean (each batch's mean, logged with its batch_size)",
        F
        + "test_logging_sync_dist.py::test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset",
        "a tensor logged without sync_dist, not a Metric object",
        lambda ev: not ev.get("metric_object"),
    ),
    Hazard(
        "rank_local_weighted",
        "per-rank values that average to single-process only weighted by each rank's samples",
        (
            F
            + "test_logging_sync_dist.py::test_without_sync_dist_each_rank_keeps_its_own_value_and_only_rank_0s_reaches_the_log_file",
            F
            + "test_log_reductions.py::test_the_step_value_is_the_unweighted_mean_over_ranks_and_the_epoch_value_is_batch_size_weighted",
        ),
        "each rank keeps its own shard's value; the logger writes rank 0's value only; the ranks' values weighted by "
        "their sample counts {samples} average to single-process, an unweighted mean over ranks does not",
        ("per-rank values", "samples per rank", "single-process"),
        "log a torchmetrics MeanMetric updated with each batch (its weighted sum and weight are summed over ranks as "
        "floats, so no integer count is averaged)",
        F + "test_uneven_shards.py::test_uneven_shards_logged_through_a_torchmetrics_mean_metric_give_the_true_mean",
    ),
    Hazard(
        "rank_local_metric",
        "a whole-set metric computed from each rank's own outputs",
        (
            F + "test_epoch_end_outputs.py::test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end",
            F + "test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",
        ),
        "each rank keeps its own shard's value; the logger writes rank 0's value only; {shown}, although the ranks "
        "ran exactly the single process's samples: not a per-sample mean, so sync_dist=True cannot fix it",
        ("per-rank values", "mean of the ranks' values", "single-process"),
        "log a torchmetrics Metric object (self.log(key, metric)); its state (counts) is summed over ranks at "
        "compute(), so F1-like scores are those of the whole set",
        F + "test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",
    ),
    Hazard(
        "epoch_end_rank_local",
        "a value computed in an epoch-end hook from each rank's own outputs, with no collective in the hook",
        (F + "test_epoch_end_outputs.py::test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end",),
        "{key!r} is computed in {hook} from each rank's own outputs: no rank ran a collective in {hook} and it is "
        "neither a Metric object nor logged with sync_dist=True, so each rank logs its own shard's value",
        ("per-rank values", "hook", "collectives in the hook"),
        "log a torchmetrics Metric object (self.log(key, metric)); its state (counts) is summed over ranks at "
        "compute(), so F1-like scores are those of the samples every rank ran",
        F + "test_f1_over_whole_set.py::test_f1_over_the_whole_validation_set_five_ways",
        "a value logged from an epoch-end hook in which no rank ran a collective, not a Metric object",
        lambda ev: ev["collectives in the hook"] == 0 and not ev.get("metric_object"),
    ),
    Hazard(
        "step_mean_rank_local",
        "a mean logged from a step hook without sync_dist, with no collective in the hook",
        (
            F
            + "test_logging_sync_dist.py::test_without_sync_dist_each_rank_keeps_its_own_value_and_only_rank_0s_reaches_the_log_file",
        ),
        "{key!r} is logged from {hook} with sync_dist=False and no rank ran a collective in {hook}: each rank's epoch "
        "value is the mean over its own shard",
        ("per-rank values", "hook", "collectives in the hook"),
        "sync_dist=True for a per-sample mean (each batch's mean, logged with its batch_size): every rank then gets "
        "the mean over every rank's samples (with repeated samples, over the padded set)",
        F
        + "test_logging_sync_dist.py::test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset",
        "a tensor or number logged with reduce_fx='mean' from a step hook in which no rank ran a collective",
        lambda ev: ev["collectives in the hook"] == 0 and not ev.get("metric_object") and ev.get("reduce_fx") == "mean",
    ),
    Hazard(
        "experiment_rank_local",
        "values written to self.logger.experiment from each rank's own outputs (the logger keeps rank 0's)",
        (
            F
            + "test_printing_and_loggers.py::test_logger_experiment_on_other_ranks_is_a_no_op_so_the_file_holds_rank_0s_local_value",
            F + "test_epoch_end_outputs.py::test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end",
        ),
        "each rank computed {tag!r} in {hook} and wrote its own value ({values}); logger.experiment is a no-op on "
        "every rank but 0, so the logger has rank 0's value only",
        ("per-rank values", "hook", "collectives in the hook"),
        "all_gather the scores, labels and sample ids in on_validation_epoch_end, drop the repeated ids, and compute "
        "the metric (and choose any threshold) on that whole set, on every rank",
        F
        + "test_multilabel_best_threshold_f1.py::test_c_all_gather_and_d_a_synced_curve_metric_choose_the_threshold_on_the_padded_set_and_e_dropping_duplicates_gives_the_single_process_numbers",
        "a value written from on_validation_epoch_end with no all_gather there that returned leaves unchanged",
        lambda ev: ev["hook"] == "on_validation_epoch_end" and not ev.get("unmoved"),
    ),
    Hazard(
        "metric_sync_on_compute_false",
        "a Metric built with sync_on_compute=False: each rank computes it from its own state",
        (
            F
            + "test_collective_hazards_torchmetrics.py::test_sync_on_compute_false_leaves_a_metric_and_a_metric_collection_logged_with_log_dict_rank_local",
        ),
        "{key!r} is a logged Metric object and the module's {metrics} has sync_on_compute=False: no rank made a "
        "torchmetrics state sync, so each rank's value is computed from its own shard's state (no error, no "
        "warning), and the logger writes rank 0's",
        ("per-rank values", "metrics with sync_on_compute=False", "torchmetrics collectives"),
        "build the Metric with sync_on_compute=True (the default): compute() then syncs its state over every "
        "rank, so every rank holds the whole set's value",
        F
        + "test_collective_hazards_torchmetrics.py::test_sync_on_compute_false_leaves_a_metric_and_a_metric_collection_logged_with_log_dict_rank_local",
    ),
    Hazard(
        "metric_step_local",
        "a Metric object logged on_step: each rank's step value is its own batch's",
        (
            F
            + "test_collective_hazards_torchmetrics.py::test_a_metric_logged_on_step_with_sync_dist_logs_the_ranks_own_batch_value_at_step_level",
        ),
        "at step {step} the ranks logged {values}: each rank's step value is its own batch's, and Lightning's logger "
        "writes rank 0's (a Metric object's step value is its forward() on the rank's batch; sync_dist does not "
        "apply)",
        ("step values per rank",),
        "build the Metric with dist_sync_on_step=True so each step's value covers every rank's batch (one collective "
        "per step: every rank must call it at every step)",
        F
        + "test_collective_hazards_torchmetrics.py::test_dist_sync_on_step_makes_the_step_value_the_sum_over_every_ranks_batch_at_that_step",
        "a torchmetrics Metric logged on_step",
        lambda ev: bool(ev.get("metric_object")),
    ),
    Hazard(
        "unmoved_leaves",
        "self.all_gather returns strings and other non-tensors unchanged, rank-local",
        (
            F
            + "test_hidden_collectives_all_gather_leaves.py::test_all_gather_stacks_tensors_numbers_and_numpy_arrays_and_returns_strings_unchanged_and_rank_local",
        ),
        "self.all_gather at {call_site} returned {leaves} unchanged on rank(s) {ranks}: all_gather moves tensors "
        "only, so anything computed from those leaves is each rank's own",
        ("call site", "leaves", "ranks"),
        "gather the non-tensor values with torch.distributed.all_gather_object, which gives every rank every "
        "rank's objects",
        F
        + "test_hidden_collectives_all_gather_leaves.py::test_all_gather_object_gives_every_rank_every_ranks_strings_and_arrays_with_their_types",
    ),
    Hazard(
        "print_every_rank",
        "print runs once per rank",
        (
            F
            + "test_printing_and_loggers.py::test_plain_print_appears_once_per_rank_while_self_print_and_rank_zero_only_print_once",
        ),
        "every rank prints: W=1 printed {single} line(s), the ranks {per_rank}",
        ("stdout lines per rank",),
        "use self.print(...) or @rank_zero_only to print once",
        F
        + "test_printing_and_loggers.py::test_plain_print_appears_once_per_rank_while_self_print_and_rank_zero_only_print_once",
    ),
    Hazard(
        "callbacks_rank_local",
        "ModelCheckpoint / EarlyStopping keep each rank's own score of an unsynced key",
        (
            F
            + "test_callbacks.py::test_model_checkpoint_saves_only_when_every_rank_improves_and_keeps_a_rank_local_best_score",
            F + "test_callbacks.py::test_only_the_ranks_whose_own_value_met_the_criterion_record_a_stopping_reason",
        ),
        "{callback}(monitor={monitor!r}) ended with different {fields} on the ranks: it decides from each rank's own "
        "value of {monitor!r}",
        ("fields that differ",),
    ),
    Hazard(
        "one_path_every_rank",
        "every rank writes its own share to one file path",
        (
            F
            + "test_what_ddp_keeps_equal.py::test_every_rank_writing_one_path_leaves_the_file_with_one_ranks_shard_not_the_whole_set",
        ),
        "every rank wrote its own content to {key} ({where}: {per_rank}), where one process writes {single}; ranks "
        "launched together share that path, so each open truncates or appends to the others' file, which ends "
        "with the last writer's share, not what one process writes",
        ("ranks", "contents per rank", "single process's content", "contents differ"),
        "write one file per rank, its name holding self.global_rank, and merge the files where all can be read, "
        "keeping each sample id once (DistributedSampler pads the shards with repeated samples)",
        F
        + "test_what_ddp_keeps_equal.py::test_one_file_per_rank_named_by_global_rank_holds_every_sample_once_plus_the_padding_duplicates",
        "ranks that each wrote their own content (their shards' outputs)",
        lambda ev: bool(ev["contents differ"]),
    ),
)
