# ruff: noqa: E501 - a fact test's name states the fact, and the entries cite them whole
"""The registry's entries: one :class:`Hazard` per way ranks go wrong that a fact of ``tests/facts/`` proves.

Each entry names the fact tests that prove its cause and its fix; ``tests/tooling/audit/test_audit_registry.py``
checks that every named test exists, that every entry is recognised by the audit (or the guard) on a module
that has the hazard, and that docs/audit.md's table of entries is current.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

F = "tests/facts/"


def _always(evidence: dict) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Hazard:
    """One hazard.

    Attributes:
        name: the entry's name (what reports and JSON call it).
        summary: the hazard in a few words (the table of docs/audit.md).
        facts: the fact tests (``path::name``) that prove the cause.
        template: the cause, with ``{field}`` places for this run's numbers (:meth:`cause`).
        evidence: the recorded quantities the cause is proven from (names of an evidence dict: ``"samples
            per rank"``, ``"duplicates"``, ``"ranks"`` ...), shown where no fix applies.
        fix: what to change, or None where no fact proves a fix.
        fix_fact: the fact test that shows the fix gives the right value (or no hang).
        requires: the fix's preconditions in words (printed where they do not hold).
        precondition: the same as a predicate over the run's evidence dict.
    """

    name: str
    summary: str
    facts: tuple
    template: str
    evidence: tuple = ()
    fix: Optional[str] = None
    fix_fact: Optional[str] = None
    requires: str = "nothing beyond the cause"
    precondition: Callable[[dict], bool] = _always

    def cause(self, **numbers) -> str:
        """The cause worded with ``numbers`` (every ``{field}`` of :attr:`template`). Raises ``KeyError``
        naming a missing field."""
        return self.template.format(**numbers)

    def applies(self, evidence: dict) -> bool:
        """The fix's preconditions hold in ``evidence`` (False for an entry without a fix)."""
        if self.fix is None:
            return False
        try:
            return bool(self.precondition(evidence))
        except (KeyError, TypeError):
            return False


def _iterable(evidence: dict) -> bool:
    """The loader's sampler is one Lightning cannot shard: an ``IterableDataset``'s (torch's
    ``_InfiniteConstantSampler``), not a map-style dataset run with ``use_distributed_sampler=False``."""
    return evidence.get("sampler") in (None, "_InfiniteConstantSampler")


def _tensor_sync_dist(evidence: dict) -> bool:
    return bool(evidence.get("sync_dist")) and not evidence.get("metric_object")


def _shards_differ(evidence: dict) -> bool:
    """The ranks' shards hold different numbers of batches (recorded, or every rank ran its loop to the end)."""
    shards = evidence.get("batches per shard")
    return bool(shards) and len(set(shards)) > 1


def _list_state(evidence: dict) -> bool:
    return any("list" in str(size) for size in (evidence.get("state sizes") or {}).values())


_ENTRIES = (
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
        ("fields per rank",),
    ),
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
        "self.log({key!r}) with sync_dist=True ran on rank 0 only (under a branch on the rank): its all_reduce "
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
        "a collective the user's code makes (not Lightning's own)",
        lambda ev: ev["source"] == "user",
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

#: Every entry by name, in the order above.
HAZARDS = {h.name: h for h in _ENTRIES}

#: Lightning 1.x hooks removed in 2.0, and what 2.x does with a module that still defines one.
#: Source: pytorch_lightning/trainer/configuration_validator.py (``*_epoch_end`` raise
#: ``NotImplementedError``; ``*_step_end`` are no longer looked up, so they are never called);
#: Lightning-AI/pytorch-lightning PR #16520 (epoch_end) and #16791 (step_end); the facts of
#: tests/facts/test_removed_hooks.py.
REMOVED_HOOKS = {
    "training_epoch_end": "raises NotImplementedError in fit; use on_train_epoch_end and keep outputs yourself",
    "validation_epoch_end": "raises NotImplementedError in fit/validate; use on_validation_epoch_end",
    "test_epoch_end": "raises NotImplementedError in test; use on_test_epoch_end",
    "training_step_end": "silently never called; move its code into training_step",
    "validation_step_end": "silently never called; move its code into validation_step",
    "test_step_end": "silently never called; move its code into test_step",
}
