# ruff: noqa: E501 - a fact test's name states the fact, and the entries cite them whole
"""The registry's entries about collectives the ranks do not make alike: keys, syncs on some ranks only, reads of
the logged metrics, a Metric's list state, uneven batch counts, shapes."""

from __future__ import annotations

from ddpprobe.hazards._hazard import F, Hazard, OtherFix, _always, _list_state, _shards_differ


def _under_rank_branch(evidence: dict) -> bool:
    """The user's own collective made under a branch on the rank: its frames read the rank (``rank branch``, which
    the guard records; where it is not recorded, as in the audit's trace, assumed), not in ``prepare_data`` (which
    Lightning runs on some ranks only whatever the code reads)."""
    return evidence["source"] == "user" and evidence.get("rank branch") is not False and not _in_prepare_data(evidence)


def _in_prepare_data(evidence: dict) -> bool:
    """The collective was made in a ``prepare_data`` hook (the module's, the hook running; a datamodule's, its call
    site's function)."""
    return evidence.get("running hook") == "prepare_data" or str(evidence.get("call site")).endswith(" in prepare_data")


COLLECTIVES = (
    # --- collectives the ranks do not make alike --------------------------------------------------------
    Hazard(
        "keys_differ",
        "ranks log different keys (or the same keys in another order) with sync_dist=True",
        (
            F
            + "test_collective_hazards_keys.py::test_the_same_keys_logged_in_a_different_order_finish_without_error_with_values_swapped_between_keys",
            F
            + "test_collective_hazards_keys.py::test_a_key_named_after_the_rank_holds_the_all_rank_mean_not_the_ranks_own_value",
        ),
        "the same {op} carries different keys on the ranks ({keys}), so each rank's value is reduced with another "
        "key's",
        ("keys per rank",),
        "log the same keys in the same order on every rank (put the rank in the value, not in the key)",
        F
        + "test_collective_hazards_keys.py::test_every_rank_logging_the_same_keys_in_the_same_order_gives_each_key_its_all_rank_mean",
    ),
    Hazard(
        "key_on_some_ranks",
        "a key logged with sync_dist=True on some ranks only",
        (
            F
            + "test_collective_hazards_keys.py::test_a_key_only_some_ranks_log_crashes_those_ranks_and_leaves_a_wrong_value_on_the_others",
        ),
        "self.log({key!r}) with sync_dist=True ran on {ranks} only: its all_reduce waits for ranks that never join "
        "it (a hang, or a mismatch with their next collective)",
        ("ranks", "key", "sync_dist"),
        "log the same keys in the same order on every rank (put the rank in the value, not in the key)",
        F
        + "test_collective_hazards_keys.py::test_every_rank_logging_the_same_keys_in_the_same_order_gives_each_key_its_all_rank_mean",
        "a key some rank logs with sync_dist=True",
        lambda ev: bool(ev.get("sync_dist")),
    ),
    Hazard(
        "rank0_only_synced_log",
        "a value only rank 0 computes, logged with sync_dist=True",
        (
            F
            + "test_collectives.py::test_sync_dist_logging_under_if_global_rank_0_leaves_rank_0_alone_in_the_all_reduce",
        ),
        "self.log({key!r}) with sync_dist=True ran on rank 0 only (the condition around it held there alone): its all_reduce "
        "has no partner on the other ranks",
        ("ranks", "key", "sync_dist"),
        "log a value that only rank 0 computes with rank_zero_only=True (no collective), or compute and log it on "
        "every rank",
        F
        + "test_collectives.py::test_rank_zero_only_logging_under_if_global_rank_0_completes_and_only_rank_0_holds_the_value",
        "rank 0 alone makes the sync",
        lambda ev: ev["ranks"] == [0],
    ),
    Hazard(
        "unsynced_key_on_some_ranks",
        "a key without sync_dist logged on some ranks only",
        (
            F
            + "test_collective_hazards_callbacks.py::test_a_callback_monitoring_a_key_only_rank_0_logs_raises_on_every_other_rank_and_leaves_rank_0_waiting",
            F
            + "test_collective_hazards_callbacks.py::test_rank_0_left_in_reduce_boolean_decision_raises_at_the_process_group_timeout",
        ),
        "self.log({key!r}) ran on {ranks} only, never on {others}; callbacks monitoring it fail on the ranks "
        "without it, and the logger has it only when rank 0 logs it",
        ("ranks", "key"),
        "log the monitored key on every rank, so every rank's callbacks decide together",
        F
        + "test_collective_hazards_callbacks.py::test_every_rank_logging_the_monitored_key_lets_checkpoint_and_early_stopping_decide_together",
        "a callback monitoring the key",
        lambda ev: bool(ev.get("monitored")),
    ),
    Hazard(
        "metric_compute_on_some_ranks",
        "metric.compute() (a state sync) on some ranks only",
        (
            F
            + "test_collective_hazards_torchmetrics.py::test_metric_compute_under_if_global_rank_0_leaves_rank_0_alone_in_the_metric_state_sync",
        ),
        "{metric}.compute() syncs its state on {ranks} only{where}",
        ("ranks", "metric"),
        "call metric.compute() (and any collective) on every rank; print or use the result on rank 0 only",
        F
        + "test_collective_hazards_torchmetrics.py::test_metric_compute_on_every_rank_gives_every_rank_the_whole_set_value_and_self_print_prints_once",
        "a torchmetrics Metric's compute()",
        lambda ev: bool(ev.get("metric")),
    ),
    Hazard(
        "metrics_read_on_some_ranks",
        "reading trainer.callback_metrics (a metrics property) at epoch end on some ranks only",
        (
            F
            + "test_hidden_collectives_metrics_properties.py::test_a_read_on_global_rank_0_only_pairs_with_the_other_ranks_own_epoch_end_sync_and_gives_the_right_value",
            F
            + "test_hidden_collectives_metrics_properties.py::test_a_read_on_global_rank_0_only_then_strategy_reduce_swaps_the_two_sums_without_an_error",
            F
            + "test_hidden_collectives_metrics_properties.py::test_a_read_on_global_rank_0_only_then_a_metric_compute_leaves_every_rank_stuck_until_the_timeout",
        ),
        "{where} reads {call}, which runs the epoch sync of {key!r} ({op}) on {ranks} only",
        ("ranks", "call", "key", "running hook"),
        "read trainer.callback_metrics on every rank (metrics = dict(trainer.callback_metrics)), then branch on "
        "the rank for what only rank 0 does with it",
        F
        + "test_hidden_collectives_metrics_properties.py::test_reading_on_every_rank_then_branching_keeps_every_collective_paired",
        "the read runs a sync (in on_train_epoch_end, or of a key logged in the same epoch-end hook)",
        _always,
    ),
    Hazard(
        "collective_on_some_ranks",
        "the user's own collective (all_gather, strategy.reduce, barrier) on some ranks only",
        (
            F
            + "test_hidden_collectives_progress_bar.py::test_with_the_progress_bar_a_metric_compute_or_all_gather_in_on_train_epoch_end_sticks_until_the_timeout",
        ),
        "{what} at {call_site} ran on {ranks} only{where}",
        ("ranks", "op", "call site"),
        "make the collective on every rank (outside the branch on the rank) and branch on its result: every rank "
        "then holds every rank's data",
        F + "test_collectives.py::test_all_gather_stacks_every_ranks_tensor_along_a_new_first_dimension_in_rank_order",
        "a collective the user's code makes (not Lightning's own) under a branch on the rank (the user's frames of "
        "the call read the rank, where that is recorded), not in prepare_data",
        _under_rank_branch,
        (
            OtherFix(
                "move the collective out of prepare_data (Lightning runs it on local rank 0 only while the other "
                "ranks wait in its own barrier, which pairs with no collective of yours): make it in setup, which "
                "every rank runs",
                F
                + "test_multinode.py::test_prepare_data_runs_on_local_rank_zero_of_every_node_or_on_global_rank_zero_only",
                "a collective the user's code makes in prepare_data",
                lambda ev: ev["source"] == "user" and _in_prepare_data(ev),
            ),
            OtherFix(
                "the condition around the collective holds on some ranks only without reading the rank (a clock, the "
                "rank's own data): give every rank the same decision first, decided on one rank and broadcast (go = "
                "self.trainer.strategy.broadcast(go, src=0)) or combined over the ranks (go = self.trainer.strategy."
                "reduce_boolean_decision(go, all=False)), then make the collective on every rank where it holds",
                F
                + "test_collectives.py::test_strategy_broadcast_returns_rank_0s_object_everywhere_and_leaves_each_ranks_input_as_it_was; "
                + F
                + "test_callbacks.py::test_reduce_boolean_decision_is_all_by_default_and_any_with_all_false",
                "a collective the user's code makes where its frames read no rank",
                lambda ev: ev["source"] == "user" and ev.get("rank branch") is False,
            ),
        ),
    ),
    Hazard(
        "list_state_element_sync",
        "a Metric list state without dist_reduce_fx synced one element at a time",
        (
            F
            + "test_hidden_collectives_torchmetrics_list_states.py::test_a_list_state_without_dist_reduce_fx_and_different_counts_drops_entries_on_the_fewest_and_fails_the_rest",
        ),
        "{metric}'s list state is synced one element at a time (no dist_reduce_fx='cat'): {sizes}",
        ("state sizes", "collectives per call"),
        "give the list state dist_reduce_fx='cat' (add_state(name, default=[], dist_reduce_fx='cat')): it is "
        "concatenated before one gather, whatever each rank's count",
        F
        + "test_hidden_collectives_torchmetrics_list_states.py::test_a_cat_list_state_is_concatenated_before_the_gather_so_every_rank_gets_every_entry_whatever_its_count",
        "a list state of a Metric class the module defines",
        _list_state,
    ),
    Hazard(
        "list_state_dtypes_differ",
        "a Metric list state gathered with a float32 placeholder from a rank that never added an entry",
        (
            F
            + "test_hidden_collectives_torchmetrics_list_states.py::test_a_rank_that_never_updated_sends_a_float32_placeholder_and_is_aborted_when_the_others_hold_int64",
            F
            + "test_hidden_collectives_torchmetrics_list_states.py::test_a_rank_that_never_updated_reads_the_others_int32_entries_as_float32_bit_patterns",
        ),
        "{metric}'s state sync gathers tensors of different dtypes ({dtypes}): the list state of {empty} holds no "
        "entry, so torchmetrics sends its float32 placeholder{effect}",
        ("dtypes per rank", "ranks with an empty list state", "metric"),
        "on a rank with nothing to add, update the list state with an empty tensor of the entries' dtype "
        "(torch.empty(0, dtype=torch.long)), so it holds that dtype instead of the float32 placeholder",
        F
        + "test_hidden_collectives_torchmetrics_list_states.py::test_an_empty_update_of_the_right_dtype_on_a_rank_with_nothing_to_add_lets_every_rank_compute",
        "the float32 ranks' list states recorded empty (their state sizes)",
        lambda ev: bool(ev["ranks with an empty list state"]) and len(set(ev["dtypes per rank"])) > 1,
    ),
    Hazard(
        "uneven_batches",
        "ranks run different numbers of batches, so a per-batch collective has no partner",
        (
            F
            + "test_uneven_shards.py::test_uneven_shards_with_a_step_only_synced_log_fail_the_ranks_with_more_batches_and_the_others_finish",
            F
            + "test_uneven_shards.py::test_uneven_fit_without_logging_finishes_the_ranks_with_fewer_batches_and_fails_the_others_in_a_ddp_collective",
        ),
        "the ranks' shards hold {shards} batches: a collective made once per batch has no partner on the ranks "
        "that ran out",
        ("batches per shard", "loop"),
        "give every rank the same number of batches (Lightning's DistributedSampler pads a map-style dataset; cut "
        "an IterableDataset's shards to equal batch counts)",
        F
        + "test_uneven_shards.py::test_uneven_shards_cut_to_equal_batch_counts_let_fit_with_a_synced_epoch_log_finish",
    ),
    Hazard(
        "uneven_batches_step_sync",
        "ranks run different numbers of batches with a step-level sync_dist",
        (
            F
            + "test_uneven_shards.py::test_uneven_shards_with_a_step_only_synced_log_fail_the_ranks_with_more_batches_and_the_others_finish",
            F
            + "test_uneven_shards.py::test_uneven_shards_with_a_step_and_epoch_synced_log_pair_an_extra_step_with_the_epoch_sync_and_gloo_aborts_a_rank",
        ),
        "the ranks' shards hold {shards} {loop} batches: the step sync of {key!r} made once per batch has no partner "
        "on the ranks that ran out",
        ("batches per shard", "loop", "key"),
        "give every rank the same number of batches (cut the shards to equal batch counts) before logging on_step "
        "with sync_dist=True",
        F + "test_uneven_shards.py::test_uneven_shards_cut_to_equal_batch_counts_let_a_step_level_synced_log_finish",
        "shards of different batch counts",
        _shards_differ,
    ),
    Hazard(
        "uneven_batches_fit",
        "ranks train on different numbers of batches (DDP's gradient all_reduce per step)",
        (
            F
            + "test_uneven_shards.py::test_uneven_fit_without_logging_finishes_the_ranks_with_fewer_batches_and_fails_the_others_in_a_ddp_collective",
            F
            + "test_uneven_shards.py::test_uneven_fit_with_a_synced_epoch_log_hangs_every_rank_until_the_process_group_timeout",
        ),
        "the ranks' shards hold {shards} training batches: DDP all-reduces the gradients at every step, so the "
        "ranks with more batches wait for a partner",
        ("batches per shard", "loop"),
        "give every rank the same number of training batches (cut the shards to equal batch counts): DDP "
        "all-reduces gradients at every step",
        F
        + "test_uneven_shards.py::test_uneven_shards_cut_to_equal_batch_counts_let_fit_with_a_synced_epoch_log_finish",
        "shards of different batch counts",
        _shards_differ,
    ),
    Hazard(
        "predict_collective",
        "a collective in predict_step, whose shards are not padded",
        (F + "test_predict.py::test_predict_does_not_pad_so_ranks_run_different_numbers_of_batches",),
        "the ranks' predict shards hold {shards} batches (predict does not pad): the collective made once per "
        "batch has no partner on the ranks that ran out",
        ("batches per shard",),
        "keep collectives out of predict_step: write each rank's predictions with their batch indices (a "
        "BasePredictionWriter) and merge them by index",
        F
        + "test_predict.py::test_predict_recipe_merging_every_rank_s_written_predictions_by_index_equals_single_process",
        "shards of different batch counts",
        _shards_differ,
    ),
    Hazard(
        "gather_shapes_differ",
        "all_gather of tensors whose first dimension differs between ranks",
        (
            F
            + "test_collectives.py::test_all_gather_of_different_first_dimensions_fails_with_gloo_and_is_reported_not_hung",
        ),
        "the ranks gather tensors of different shapes ({shapes})",
        ("shapes per rank", "dtype"),
        "pad each rank's tensor to one shape before all_gather, gather the true sizes too, and trim",
        F + "test_collectives.py::test_pad_gather_trim_returns_every_ranks_rows_for_uneven_first_dimensions",
        "an all_gather of one dtype whose shapes differ",
        lambda ev: ev["op"] == "all_gather" and ev.get("same dtype", True),
    ),
)
