"""Why a fact's verdict changes between Lightning releases: the Lightning change behind it, with its source.

The version matrix (:mod:`ddpprobe.card.matrix`) finds where each fact's verdict changes from one release to the
next; the reason is knowledge, kept here as data, one :class:`Change` per test function (every parametrised case
of it shares the reason). ``docs/matrix.md`` lists each fact that changes with the release where it changes and
this sentence; a fact that changes and has no entry is listed as not yet explained, so a new one shows.

Sources are Lightning's own: the CHANGELOG.md each release ships (``pytorch_lightning/CHANGELOG.md`` in the
wheel), with its pull-request or issue number, or the function whose code changed.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Change:
    """Why a fact's verdict changes between releases."""

    why: str  # the Lightning change, in a sentence
    source: str  # where it is recorded: a CHANGELOG entry and its PR/issue, or the changed function


_SAMPLER_2_0_3 = Change(
    "Up to 2.0.2 Lightning wraps every loader's sampler in a `DistributedSamplerWrapper`, which reorders what the "
    "user's sampler yields; from 2.0.3 a loader with a `RandomSampler` or `SequentialSampler` gets a plain "
    "`DistributedSampler` over the dataset (what the fact asserts), and only other samplers are wrapped.",
    "pytorch_lightning CHANGELOG 2.0.3, 'Fixed an edge case causing overlapping samples in DDP when no global seed "
    "is set' (#17713); `_get_distributed_sampler` in pytorch_lightning/trainer/connectors/data_connector.py",
)
_EPOCH_END_REMOVED = Change(
    "2.0.0 removed the `{training,validation,test}_epoch_end` hooks (defining one raises `NotImplementedError`): "
    "the 1.x fact applies up to 1.9, the 2.x one from 2.0.",
    "pytorch_lightning CHANGELOG 2.0.0, #16520",
)
_STEP_END_REMOVED = Change(
    "2.0.0 removed the `training_step_end`, `validation_step_end` and `test_step_end` hooks (a defined one is never "
    "called): the 1.x fact applies up to 1.9, the 2.x one from 2.0.",
    "pytorch_lightning CHANGELOG 2.0.0, #16791",
)
_FLOORED_COUNT = Change(
    "From 2.0.7 a mean sync over gloo divides in place (`result.copy_(result / world_size)`), so the int64 "
    "`cumulated_batch_size` that weights the epoch mean is floored when the ranks' count does not divide by the "
    "world size, inflating the mean (upstream issue #21859); 1.9.5 divided out of place into a float "
    "(`result / world_size`), so there the weighted mean is exact and the fact asserting the floor does not hold.",
    "lightning_fabric CHANGELOG 2.0.7, 'Fixed an issue with Fabric.all_reduce() not performing an inplace operation "
    "for all backends consistently' (#18235); `_sync_ddp` in lightning_fabric/utilities/distributed.py",
)
_PREDICT_DATALOADERS = Change(
    "The fact's probe reads the loader from `trainer.predict_dataloaders`, a list of loaders up to 1.9 "
    "(`AttributeError: 'list' object has no attribute 'batch_sampler'`) and what the user returned from 2.0.0: on "
    "1.9.5 the probe fails, not Lightning's prediction.",
    "pytorch_lightning CHANGELOG 2.0.0, 'The `trainer.*_dataloader` properties now return what the user returned in "
    "their `LightningModule.*_dataloader()` hook' (#16726, #16800)",
)
_USE_DISTRIBUTED_SAMPLER = Change(
    "2.0.0 renamed `Trainer(replace_sampler_ddp=...)` to `Trainer(use_distributed_sampler=...)`, which the fact's "
    "probe passes: 1.9.5's Trainer raises `TypeError: unexpected keyword argument 'use_distributed_sampler'`.",
    "pytorch_lightning CHANGELOG 2.0.0, #16829",
)
_SYNC_DIST_GROUP_PICKLE = Change(
    "On 1.9.5 with torch 2.x, `_ResultMetric.to` runs `apply_to_collection` over the module's own `__dict__`, which "
    "deep-copies the logged key's metadata, and a `sync_dist_group` process group cannot be pickled: the members' "
    "`self.log(..., sync_dist_group=group)` raises `TypeError: cannot pickle 'ProcessGroup' object`. 2.0.0 passes a "
    "plain copy of the `__dict__` (the workaround for pytorch/pytorch#96198).",
    "`_ResultMetric.to` in pytorch_lightning/trainer/connectors/logger_connector/result.py, 1.9.5 against 2.0.0",
)

_STATIC_GRAPH_2_6 = Change(
    "2.6.0 fixed manual optimization under `DDPStrategy(static_graph=True)`: before it no step's gradients were "
    "averaged, from it every step's are; each release runs the fact of its side.",
    "pytorch_lightning CHANGELOG 2.6.0, 'Fixed synchronization of gradients in manual optimization with "
    "`DDPStrategy(static_graph=True)`' (#21251)",
)
_METRIC_RESTORE_2_0 = Change(
    "Up to 1.9, loading a checkpoint reset every torchmetrics `Metric` on every rank but 0 "
    "(`_CheckpointConnector.restore_model`, for fault-tolerant training); 2.0.0 removed fault-tolerant training and "
    "that reset, so every rank restores the saved state; each release runs the fact of its side.",
    "pytorch_lightning CHANGELOG 2.0.0, 'Removed support for the experimental `PL_FAULT_TOLERANT_TRAINING` "
    "environment flag' (#16516, #16533); `restore_model` in 1.9.5's trainer/connectors/checkpoint_connector.py",
)
_CAST_BEFORE_SYNC_2_1 = Change(
    "From 2.1.0 `_ResultMetric.update` casts a logged value below float32 (bfloat16, float16) to float32 before the "
    "step sync and accumulates in float32; before it only integers were cast, after the sync; each release runs the "
    "fact of its side.",
    "pytorch_lightning CHANGELOG 2.1.0, 'Fixed numerical issues when reducing values in low precision with "
    "`self.log`' (#18686)",
)
_SIGTERM_2_5_2 = Change(
    "From 2.5.2 every training step starts with a broadcast of rank 0's SIGTERM flag, so a SIGTERM reaching one rank "
    "stops every rank at the same step; before it each rank's handler acted alone (from 2.0, `SIGTERMException`); "
    "each release runs the facts of its side.",
    "pytorch_lightning CHANGELOG 2.5.2, 'Fixed Synchronize SIGTERM Handling in DDP to Prevent Deadlocks' (#20825); "
    "2.0.0, 'Renamed the `GracefulExitException` to `SIGTERMException`' (#16501)",
)

_FILE_EXISTS_2_6 = Change(
    "Before 2.6.0 `ModelCheckpoint.file_exists` asks rank 0 with `strategy.broadcast` (an object broadcast); "
    "2.6.0 made it `strategy.reduce_boolean_decision` (a barrier, then an all_reduce), which is where the fact finds "
    "the ranks waiting. Before it, rank 0 waits in that broadcast instead, and a broadcast rank 0 makes alone (under "
    "`trainer.log_dir`) pairs with it, so that world does not fail at all.",
    "pytorch_lightning CHANGELOG 2.6.0, 'Fixed `ModelCheckpoint.file_exists` using broadcast in DDP, reducing memory "
    "usage when checking for existing checkpoints' (#19674)",
)
_NONE_STEP_2_3 = Change(
    "From 2.3.0 returning None from `training_step` in distributed training raises `RuntimeError` on that rank; "
    "before it the step was skipped silently, leaving the peers in the gradient all_reduce.",
    "pytorch_lightning CHANGELOG 2.3.0, 'It is no longer allowed to skip `training_step()` by returning `None` in "
    "distributed training' (#19918)",
)

_OPTIMIZER_IDX_2_0 = Change(
    "The fact's probe defines `on_before_optimizer_step(self, optimizer)`; up to 1.9 Lightning also passes "
    "`optimizer_idx` (`TypeError: ContractProbe.on_before_optimizer_step() takes 2 positional arguments but 3 were "
    "given`), and 2.0.0 removed that argument: on 1.9.5 the probe fails, not DDP.",
    "pytorch_lightning CHANGELOG 2.0.0, 'Removed `optimizer_idx` argument from "
    "`LightningModule.on_before_optimizer_step`' (#16539)",
)
_INPLACE_REDUCE_2_0_7 = Change(
    "From 2.0.7 `strategy.reduce` (`_sync_ddp`) divides a mean over gloo in place into the input tensor "
    "(`result.copy_(result / world_size)`): an int64 mean is truncated and stays int64, a bool mean is the `any` of "
    "the ranks, and the input tensor holds the result. 1.9.5 returned a new float tensor (`result / world_size`).",
    "lightning_fabric CHANGELOG 2.0.7, 'Fixed an issue with Fabric.all_reduce() not performing an inplace operation "
    "for all backends consistently' (#18235); `_sync_ddp` in lightning_fabric/utilities/distributed.py",
)
_RANK_ZERO_FIRST_2_1 = Change(
    "The fact's probe enters `Fabric.rank_zero_first`, which 2.1 added (absent from 2.0.9.post0's "
    "lightning_fabric/fabric.py, present in 2.1.4's): before it the probe fails with `AttributeError`.",
    "lightning_fabric/fabric.py, `Fabric.rank_zero_first` (2.1); its barrier lost the timeout in 2.3.0 (#19448)",
)
_CSV_LOG_DIR_2_1 = Change(
    "Before 2.1.0 `trainer.log_dir` with a `CSVLogger` returned the logger's `save_dir` ('.') instead of its "
    "versioned folder, which the fact compares across ranks.",
    "pytorch_lightning CHANGELOG 2.1.0, 'Fixed `Trainer.log_dir` not returning the correct directory for the "
    "`CSVLogger`' (#18548)",
)

#: ``{"tests/facts/<file>.py::<test function>": Change}``.
CHANGES: dict = {
    "tests/facts/test_sharding.py::test_each_rank_sees_a_disjoint_strided_shard_when_n_divides_by_world_size": (
        _SAMPLER_2_0_3
    ),
    "tests/facts/test_training_loop.py::test_the_training_sampler_shuffles_whatever_the_user_loader_says_and_"
    "reshuffles_every_epoch": _SAMPLER_2_0_3,
    "tests/facts/test_training_loop.py::test_validation_inside_fit_keeps_the_users_order_every_epoch": _SAMPLER_2_0_3,
    "tests/facts/test_removed_hooks.py::test_defining_validation_epoch_end_raises_not_implemented_error_on_"
    "every_rank": _EPOCH_END_REMOVED,
    "tests/facts/test_lightning_1x_hooks.py::test_validation_epoch_end_receives_only_the_ranks_own_outputs": (
        _EPOCH_END_REMOVED
    ),
    "tests/facts/test_removed_hooks.py::test_defining_validation_step_end_is_silently_never_called": _STEP_END_REMOVED,
    "tests/facts/test_lightning_1x_hooks.py::test_validation_step_end_receives_only_the_local_step_output": (
        _STEP_END_REMOVED
    ),
    "tests/facts/test_log_reductions.py::test_the_synced_epoch_mean_is_the_batch_size_weighted_mean_even_when_the_"
    "count_does_not_divide_by_world_size": _FLOORED_COUNT,
    "tests/facts/test_uneven_shards.py::test_uneven_shards_give_the_true_mean_with_an_epoch_level_synced_log": (
        _FLOORED_COUNT
    ),
    "tests/facts/test_uneven_shards.py::test_uneven_shards_floor_the_synced_count_so_the_epoch_level_synced_mean_is_"
    "inflated": _FLOORED_COUNT,
    "tests/facts/test_uneven_shards.py::test_uneven_shards_logged_through_a_torchmetrics_mean_metric_give_the_true_"
    "mean": Change(
        "The torchmetrics `MeanMetric` gives the true mean on every release; the fact also asserts the floored "
        "`self.log` value beside it, and that floor exists from 2.0.7 only: " + _FLOORED_COUNT.why,
        _FLOORED_COUNT.source,
    ),
    "tests/facts/test_user_samplers.py::test_with_a_user_unrepeated_sampler_the_synced_mean_is_the_dataset_mean": (
        Change(
            "On 1.9.5: "
            + _USE_DISTRIBUTED_SAMPLER.why
            + " From 2.0.9.post0 the synced mean is floored: "
            + _FLOORED_COUNT.why,
            _USE_DISTRIBUTED_SAMPLER.source + "; " + _FLOORED_COUNT.source,
        )
    ),
    "tests/facts/test_predict.py::test_predict_does_not_pad_so_ranks_run_different_numbers_of_batches": (
        _PREDICT_DATALOADERS
    ),
    "tests/facts/test_predict.py::test_predict_returns_only_the_rank_s_own_predictions_and_none_without_return_"
    "predictions": _PREDICT_DATALOADERS,
    "tests/facts/test_predict.py::test_predict_writer_gets_the_rank_s_batch_indices_but_at_epoch_end_nested_one_"
    "level_deeper_than_predictions": _PREDICT_DATALOADERS,
    "tests/facts/test_predict.py::test_predict_recipe_merging_every_rank_s_written_predictions_by_index_equals_"
    "single_process": _PREDICT_DATALOADERS,
    "tests/facts/test_user_samplers.py::test_use_distributed_sampler_false_makes_every_rank_see_the_whole_dataset": (
        _USE_DISTRIBUTED_SAMPLER
    ),
    "tests/facts/test_user_samplers.py::test_use_distributed_sampler_keeps_a_user_distributed_sampler_with_drop_"
    "last_so_the_last_samples_are_never_seen": _USE_DISTRIBUTED_SAMPLER,
    "tests/facts/test_user_samplers.py::test_use_distributed_sampler_keeps_a_user_unrepeated_sampler_so_ranks_run_"
    "different_batch_counts": _USE_DISTRIBUTED_SAMPLER,
    "tests/facts/test_user_samplers.py::test_trainer_test_pads_and_warns_like_validate_when_n_does_not_divide_by_"
    "world_size": _USE_DISTRIBUTED_SAMPLER,
    "tests/facts/test_log_reductions.py::test_sync_dist_group_averages_over_the_groups_ranks_only": (
        _SYNC_DIST_GROUP_PICKLE
    ),
    "tests/facts/test_log_reductions.py::test_a_rank_outside_sync_dist_group_that_passes_the_group_keeps_its_sum_"
    "but_its_mean_raises": _SYNC_DIST_GROUP_PICKLE,
    "tests/facts/test_log_reductions.py::test_python_floats_and_ints_are_synced_as_float32_and_only_an_integer_"
    "tensor_gets_the_cast_warning": Change(
        "2.1.0 reworded the warning for a non-floating logged tensor to '... needs to be floating to be reduced. "
        "Converting it to torch.float32.' (and keeps a logged value in float32 or wider); 1.9 and 2.0 warn '... needs "
        "to be floating point', which is not the warning the fact counts.",
        "pytorch_lightning CHANGELOG 2.1.0, 'Fixed numerical issues when reducing values in low precision with "
        "self.log' (#18686); `_ResultMetric.update` in trainer/connectors/logger_connector/result.py",
    ),
    "tests/facts/test_where_values_land.py::test_the_results_table_is_printed_by_rank_0_only_with_rank_0s_numbers": (
        Change(
            "Up to 2.0 the evaluation loop builds the table's header from the `RunningStage` enum "
            "(`f'{stage} Metric'.capitalize()`), which Python 3.11 prints as 'Runningstage.validating metric'; "
            "2.1.0 passes the stage's value, so the header reads 'Validate metric' as the fact expects.",
            "the `_print_results` call in pytorch_lightning/loops/evaluation_loop.py: `self.trainer.state.stage` "
            "in 2.0.9.post0, `self._stage.value` in 2.1.4",
        )
    ),
    "tests/facts/test_callbacks.py::test_only_the_ranks_whose_own_value_met_the_criterion_record_a_stopping_reason": (
        Change(
            "`EarlyStopping.stopping_reason` is new in 2.6.0; before it the fact has nothing to read and skips.",
            "pytorch_lightning CHANGELOG 2.6.0, 'Added attributes to access stopping reason in EarlyStopping "
            "callback' (#21188)",
        )
    ),
    "tests/facts/test_iterable_datasets.py::test_an_iterable_dataset_with_len_warns_on_rank_0_only_about_worker_"
    "duplicates_and_is_still_not_sharded": Change(
        "1.9.5 checks an evaluation loader's length from the data connector (`_reset_eval_dataloader`) and rank 0 "
        "warns twice there; from 2.0.0 the evaluation loop checks it once when it sets up its data.",
        "pytorch_lightning CHANGELOG 2.0.0, 'The top-level loops now own the data sources and combined "
        "dataloaders' (#16726); `has_len_all_ranks` callers in 1.9.5's data_connector.py and 2.0.0's "
        "loops/evaluation_loop.py",
    ),
    "tests/facts/test_manual_optimization_static_graph.py::test_manual_backward_with_static_graph_true_averages_"
    "every_steps_gradients_from_the_first_step": _STATIC_GRAPH_2_6,
    "tests/facts/test_manual_optimization_static_graph.py::test_before_2_6_manual_backward_with_static_graph_true_"
    "leaves_every_rank_its_own_gradients": _STATIC_GRAPH_2_6,
    "tests/facts/test_metric_checkpoints.py::test_a_persistent_metric_checkpointed_in_ddp_holds_rank_0s_state_and_a_"
    "new_run_computes_it_w_times": _METRIC_RESTORE_2_0,
    "tests/facts/test_metric_checkpoints.py::test_before_2_0_a_checkpointed_metric_is_restored_on_rank_0_only_so_"
    "compute_gives_rank_0s_state": _METRIC_RESTORE_2_0,
    "tests/facts/test_metric_precision_and_devices.py::test_a_bfloat16_value_logged_with_sync_dist_is_cast_to_"
    "float32_first_so_its_synced_sum_is_exact": _CAST_BEFORE_SYNC_2_1,
    "tests/facts/test_metric_precision_and_devices.py::test_before_2_1_a_bfloat16_value_logged_with_sync_dist_is_"
    "synced_in_bfloat16_at_step_level": _CAST_BEFORE_SYNC_2_1,
    "tests/facts/test_preemption.py::test_sigterm_to_rank_0_between_steps_makes_every_rank_raise_sigterm_exception_"
    "before_the_next_step": _SIGTERM_2_5_2,
    "tests/facts/test_preemption.py::test_sigterm_to_another_rank_between_steps_stops_that_rank_only_and_the_others_"
    "fail_in_the_next_step": _SIGTERM_2_5_2,
    "tests/facts/test_preemption.py::test_sigterm_during_a_training_step_blocks_every_rank_until_the_process_group_"
    "timeout": _SIGTERM_2_5_2,
    "tests/facts/test_preemption.py::test_every_training_step_starts_with_one_broadcast_of_the_sigterm_flag_when_w_"
    "is_above_1": _SIGTERM_2_5_2,
    "tests/facts/test_preemption.py::test_before_2_5_2_no_collective_runs_between_training_steps": _SIGTERM_2_5_2,
    "tests/facts/test_preemption.py::test_before_2_5_2_sigterm_to_rank_0_stops_rank_0_only_and_the_others_fail_in_"
    "the_next_step": _SIGTERM_2_5_2,
    "tests/facts/test_samplers_rewrapped.py::test_random_sampler_with_replacement_becomes_a_plain_distributed_"
    "sampler_that_draws_ceil_n_over_w_without_warning": _SAMPLER_2_0_3,
    "tests/facts/test_samplers_rewrapped.py::test_before_2_0_3_random_sampler_with_replacement_was_wrapped_so_each_"
    "rank_drew_ceil_k_over_w": _SAMPLER_2_0_3,
    "tests/facts/test_samplers_rewrapped.py::test_a_plain_shuffled_loader_partitions_the_data_without_seed_"
    "everything": _SAMPLER_2_0_3,
    "tests/facts/test_collective_hazards_callbacks.py::test_rank_0_left_in_reduce_boolean_decision_raises_at_the_"
    "process_group_timeout": _FILE_EXISTS_2_6,
    "tests/facts/test_collective_hazards_callbacks.py::test_a_callback_monitoring_a_key_only_rank_0_logs_raises_on_"
    "every_other_rank_and_leaves_rank_0_waiting": _FILE_EXISTS_2_6,
    "tests/facts/test_rank_state_log_dir.py::test_reading_trainer_log_dir_inside_a_rank_zero_only_function_fails_"
    "every_rank_at_the_process_group_timeout": _FILE_EXISTS_2_6,
    "tests/facts/test_training_step_returning_none.py::test_returning_none_from_training_step_on_one_rank_raises_"
    "there_while_its_peer_waits_in_backward": _NONE_STEP_2_3,
    "tests/facts/test_training_step_returning_none.py::test_returning_none_on_every_rank_at_the_same_batch_raises_on_"
    "every_rank": _NONE_STEP_2_3,
    "tests/facts/test_rank_state_rank_zero_only.py::test_setting_rank_zero_only_rank_from_the_launchers_variable_"
    "first_keeps_rank_zero_code_on_rank_0": Change(
        "Before 2.5.1 the `CSVLogger` wrote `hparams.yaml` at every save, empty or not, so rank 0 leaves "
        "`hparams.yaml` beside `metrics.csv`; from 2.5.1 only logging hyperparameters writes it, and rank 0 leaves "
        "`metrics.csv` alone, as the fact expects (what runs on which rank is the same on every release).",
        "pytorch_lightning CHANGELOG 2.5.1, 'Fixed CSVLogger logging hyperparameter at every write which increase "
        "latency' (#20594); `ExperimentWriter.save` in pytorch_lightning/loggers/csv_logs.py",
    ),
    "tests/facts/test_samplers_rewrapped.py::test_distributed_sampler_wrapper_forwards_set_epoch_to_the_users_"
    "sampler_in_training_and_validation": Change(
        "Before 2.6.1 `DistributedSamplerWrapper.set_epoch` did not reach the user's sampler inside it; 2.6.1 forwards "
        "it.",
        "lightning_fabric CHANGELOG 2.6.1, 'Fixed `DistributedSamplerWrapper` not forwarding `set_epoch` to the "
        "underlying sampler' (#21454)",
    ),
    "tests/facts/test_sharding.py::test_a_shuffling_validation_loader_keeps_shuffling_under_ddp_with_a_new_order_"
    "every_epoch": _SAMPLER_2_0_3,
    "tests/facts/test_samplers_rewrapped.py::test_a_custom_batch_sampler_is_rebuilt_as_its_own_class_around_a_"
    "distributed_sampler": _SAMPLER_2_0_3,
    "tests/facts/test_samplers_rewrapped.py::test_with_overfit_batches_the_training_sampler_does_not_shuffle_and_"
    "every_epoch_repeats_the_same_batches": _SAMPLER_2_0_3,
    "tests/facts/test_log_reductions.py::test_the_synced_epoch_mean_divides_by_the_floored_mean_of_the_integer_"
    "batch_size_counts": _FLOORED_COUNT,
    "tests/facts/test_hidden_collectives_half_precision.py::test_a_float16_value_logged_with_sync_dist_is_synced_"
    "in_float32_and_does_not_overflow": _CAST_BEFORE_SYNC_2_1,
    "tests/facts/test_what_ddp_keeps_equal.py::test_an_optimizer_setting_computed_from_a_rank_local_value_stays_"
    "rank_local_and_sets_the_weights_apart": _OPTIMIZER_IDX_2_0,
    "tests/facts/test_what_ddp_keeps_equal.py::test_an_lr_scheduler_setting_computed_from_a_rank_local_value_stays_"
    "rank_local": _OPTIMIZER_IDX_2_0,
    "tests/facts/test_what_ddp_keeps_equal.py::test_an_attribute_set_from_the_rank_before_training_stays_that_ranks_"
    "own": _OPTIMIZER_IDX_2_0,
    "tests/facts/test_what_ddp_keeps_equal.py::test_a_buffer_a_rank_updates_outside_forward_is_overwritten_by_rank_"
    "0s_at_the_next_forward": _OPTIMIZER_IDX_2_0,
    "tests/facts/test_what_ddp_keeps_equal.py::test_the_first_step_of_w_ranks_equals_one_process_on_all_their_"
    "samples_only_for_a_loss_averaged_over_the_batch": _OPTIMIZER_IDX_2_0,
    "tests/facts/test_callbacks.py::test_a_loss_spike_on_one_rank_stops_every_rank_at_that_batch": Change(
        "`SpikeDetection` is new in 2.1.0; before it the fact's probe fails with `AttributeError`.",
        "lightning_fabric CHANGELOG 2.1.0, 'Added a callback for spike-detection' (#18014)",
    ),
    "tests/facts/test_callbacks.py::test_with_two_early_stopping_callbacks_the_first_stop_any_rank_wants_stops_"
    "every_rank": Change(
        "Up to 1.9 the Trainer adds a `GradientAccumulationScheduler` to every run's callbacks "
        "(`_CallbackConnector`), and the fact's probe, reading `monitor` from the callbacks after its own, trips on it "
        "(`AttributeError`); 2.0.0 no longer adds it, having dropped schedules for `accumulate_grad_batches`.",
        "pytorch_lightning CHANGELOG 2.0.0, 'Removed support for passing a scheduling dictionary to "
        "`Trainer(accumulate_grad_batches=...)`' (#16729); trainer/connectors/callback_connector.py",
    ),
    "tests/facts/test_reductions_outside_log.py::test_strategy_reduce_mean_of_an_int64_tensor_is_truncated_toward_"
    "zero_and_stays_int64": _INPLACE_REDUCE_2_0_7,
    "tests/facts/test_reductions_outside_log.py::test_strategy_reduce_of_a_bool_tensor_is_any_for_mean_and_sum": (
        _INPLACE_REDUCE_2_0_7
    ),
    "tests/facts/test_reductions_outside_log.py::test_strategy_reduce_writes_the_result_into_the_input_tensor_and_a_"
    "clone_keeps_it": _INPLACE_REDUCE_2_0_7,
    "tests/facts/test_reductions_outside_log.py::test_fabric_all_reduce_turns_numbers_into_int32_float32_uint8_"
    "tensors_and_truncates_integer_means": Change(
        "`Fabric.all_reduce` is new in 2.0.0 (on 1.9.5 the probe fails with `AttributeError`), and it truncates an "
        "integer mean in place from 2.0.7: " + _INPLACE_REDUCE_2_0_7.why,
        "lightning_fabric CHANGELOG 2.0.0, 'Added `Fabric.all_reduce`' (#16459); 2.0.7 (#18235)",
    ),
    "tests/facts/test_reductions_outside_log.py::test_fabric_all_reduce_and_all_gather_walk_collections_and_leave_"
    "other_leaves_alone": _RANK_ZERO_FIRST_2_1,
    "tests/facts/test_fabric.py::test_fabric_rank_zero_first_runs_rank_0s_block_before_the_others_enter": (
        _RANK_ZERO_FIRST_2_1
    ),
    "tests/facts/test_fabric.py::test_fabric_no_backward_sync_leaves_each_ranks_own_gradient_and_the_default_"
    "averages_them": _RANK_ZERO_FIRST_2_1,
    "tests/facts/test_fabric.py::test_fabric_setup_dataloaders_keeps_shuffle_false_sets_the_epoch_itself_and_wraps_"
    "a_custom_sampler": _RANK_ZERO_FIRST_2_1,
    "tests/facts/test_rank_state_log_dir.py::test_a_csvlogger_without_version_gives_ranks_starting_after_rank_0_the_"
    "next_version_and_trainer_log_dir_rank_0s": _CSV_LOG_DIR_2_1,
    "tests/facts/test_rank_state_log_dir.py::test_a_csvlogger_with_an_explicit_version_gives_every_rank_the_same_"
    "log_dir": _CSV_LOG_DIR_2_1,
    "tests/facts/test_rank_state_log_dir.py::test_reading_trainer_log_dir_on_every_rank_and_passing_it_to_the_rank_"
    "zero_only_function_finishes": _CSV_LOG_DIR_2_1,
    "tests/facts/test_rank_state_rank_zero_only.py::test_without_rank_in_the_environment_rank_zero_only_code_runs_"
    "on_every_rank_until_the_trainer_is_built": Change(
        "From 2.2.0 the `CSVLogger` writes the columns of `metrics.csv` sorted by name, which the rows the fact "
        "compares follow; before it they came in the order logged.",
        "pytorch_lightning CHANGELOG 2.2.0, 'The columns in the `metrics.csv` file produced by `CSVLogger` are now "
        "sorted alphabetically' (#19159)",
    ),
    "tests/facts/test_user_samplers.py::test_with_a_user_unrepeated_sampler_the_synced_mean_is_inflated_by_the_"
    "floored_count": _USE_DISTRIBUTED_SAMPLER,
    "tests/facts/test_user_samplers.py::test_loader_lengths_are_summed_over_ranks_an_all_empty_world_warns_once_and_"
    "one_empty_rank_raises_alone": _USE_DISTRIBUTED_SAMPLER,
    "tests/facts/test_several_dataloaders.py::test_every_loader_of_a_combined_loader_gets_its_own_shuffling_"
    "distributed_sampler": Change(
        "The fact's probe takes `CombinedLoader` from `pytorch_lightning.utilities`, where 2.0.0 put it (moved from "
        "`trainer.supporters`): on 1.9.5 the probe fails with `AttributeError`.",
        "pytorch_lightning CHANGELOG 2.0.0, 'Moved the `CombinedLoader` class from "
        "`pytorch_lightning.trainer.supporters` to `pytorch_lightning.combined_loader`' (#16819)",
    ),
    "tests/facts/test_weights_in_validate_test_predict.py::test_validate_test_and_predict_broadcast_rank_0s_"
    "parameters_and_buffers_without_a_ddp_wrapper": Change(
        "From 2.0.2 validate, test and predict broadcast rank 0's parameters and buffers at setup "
        "(`DDPStrategy.setup`: `_sync_module_states` when not fitting); before it each rank ran with its own weights.",
        "pytorch_lightning CHANGELOG 2.0.2, 'Fixed Sync module states during non-fit' (#17370)",
    ),
    "tests/facts/test_unused_parameters.py::test_a_parameter_the_loss_does_not_use_fails_every_rank_at_the_second_"
    "step_with_lightnings_advice": Change(
        "From 2.0.0 Lightning replaces DDP's 'Expected to have finished reduction' error with its advice naming "
        "`strategy='ddp_find_unused_parameters_true'` (`DDPStrategy.on_exception`); 1.9.5 raises DDP's own words.",
        "pytorch_lightning CHANGELOG 2.0.0, 'Added suffix option to DDP strategy names to enable "
        "`find_unused_parameters=True`' and 'DDP's `find_unused_parameters` now defaults to `False`' (#16611)",
    ),
    "tests/facts/test_lr_find.py::test_lr_find_under_ddp_gives_every_rank_rank_0s_loss_curve_and_the_same_learning_"
    "rate": Change(
        "The fact's probe runs `pytorch_lightning.tuner.Tuner(trainer).lr_find()`, the API of 2.0.0 (which removed "
        "`Trainer.tune()` and `auto_lr_find`): 1.9.5 has no `Tuner` there and the probe fails with `AttributeError`.",
        "pytorch_lightning CHANGELOG 2.0.0, 'Removed `Trainer.tune()` in favor of "
        "`Tuner(trainer).{lr_find,scale_batch_size}`' (#16462)",
    ),
    "tests/facts/test_rank_state_seeds.py::test_reseeding_with_the_global_rank_in_on_train_start_gives_each_rank_its_"
    "own_stream_and_equal_weights": Change(
        "Up to 2.0 the fit loop creates the training DataLoader's iterator after `on_train_start` "
        "(`_TrainingEpochLoop.on_run_start`: `iter(data_fetcher)`), and torch's `_BaseDataLoaderIter.__init__` draws "
        "the workers' `base_seed` (one int64, as much as two `torch.rand` floats) from the rank's default generator: "
        "the probe's draws after `manual_seed(7 + rank)` start two numbers into that stream (the ranks still differ, "
        "the exact replay fails). From 2.1.0 `FitLoop.setup_data` creates the iterator before `on_train_start`, so "
        "the reseed there comes after that draw.",
        "`FitLoop.setup_data` in pytorch_lightning/loops/fit_loop.py (2.1.4: `iter(self._data_fetcher)  # creates the "
        "iterator inside the fetcher`) and `_TrainingEpochLoop.on_run_start` in loops/training_epoch_loop.py "
        "(2.0.9.post0: `iter(data_fetcher)`; 2.1.4: only when `current_epoch > 0`), moved by 'Set limits for "
        "`fetcher.done`' (#18441, whose CHANGELOG 2.1.0 line names only `Trainer.num_val_batches`); `_base_seed` in "
        "torch/utils/data/dataloader.py `_BaseDataLoaderIter.__init__`",
    ),
}


def change_of(nodeid: str):
    """The :class:`Change` of a test case's nodeid (its parametrisation dropped), None when not written yet."""
    return CHANGES.get(nodeid.split("[", 1)[0])
