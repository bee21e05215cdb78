# ruff: noqa: E501 - a fact test's name states the fact, and the rows cite them whole
"""The DDP contract as data: for each recorded field (ddpprobe/contract/_state.py), whether it must be equal on
every rank, and at which boundaries, or whether it may differ, and the fact that shows what DDP and Lightning do
with it (sync it, broadcast it, or leave it to the user).

A row matches field paths by ``fnmatch`` pattern; the first row that matches a path is that field's row
(:func:`row_for`). A path no row matches is not part of the contract and is never reported.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Optional

from ddpprobe.contract._state import BOUNDARIES

F = "tests/facts/"

#: The rule of a row: the field must be equal on every rank at the row's boundaries.
EQUAL = "equal on every rank"
#: The rule of a row: the field may differ between ranks (it says why).
MAY_DIFFER = "may differ"

#: Every boundary of a record (ddpprobe/contract/_state.py ``BOUNDARIES``) but ``setup``, which comes before
#: DDP wraps the module and broadcasts rank 0's parameters and buffers.
AFTER_WRAP = tuple(b for b in BOUNDARIES if b != "setup")


@dataclasses.dataclass(frozen=True)
class ContractRow:
    """One row of the contract.

    Attributes:
        name: the row's name (what reports and JSON call it).
        pattern: the field paths it covers (``fnmatch``: ``"param.*"``), or a tuple of such patterns.
        rule: :data:`EQUAL` or :data:`MAY_DIFFER`.
        boundaries: where :data:`EQUAL` holds (the field may differ at any other boundary).
        keeps_it: what DDP and Lightning do with the field, in a sentence (``"DDP broadcasts rank 0's ..."`` or
            ``"left to your code: ..."``).
        facts: the fact tests (``path::name``) that show it.
    """

    name: str
    pattern: str
    rule: str
    boundaries: tuple
    keeps_it: str
    facts: tuple

    def shown(self) -> str:
        """``"The contract (<name>): <keeps_it> (shown by <facts>)"``: the row in a report's words."""
        return f"The contract ({self.name}): {self.keeps_it} (shown by {'; '.join(self.facts)})"

    def must_be_equal(self, boundary: str) -> bool:
        return self.rule == EQUAL and boundary in self.boundaries

    def matches(self, path: str) -> bool:
        patterns = (self.pattern,) if isinstance(self.pattern, str) else self.pattern
        return any(fnmatch.fnmatchcase(path, p) for p in patterns)


_ROWS = (
    ContractRow(
        "parameters",
        "param.*",
        EQUAL,
        AFTER_WRAP,
        "DDP broadcasts rank 0's parameters when it wraps the module (different initial weights become rank 0's) "
        "and averages the gradients at every backward, so equal optimizer steps keep them equal; nothing re-syncs "
        "parameters that a rank changed otherwise (an optimizer setting of its own, a load or copy on some ranks "
        "only)",
        (
            F
            + "test_rank_state_seeds.py::test_without_a_seed_ranks_draw_as_fresh_interpreters_do_and_ddp_broadcasts_rank_0s_initial_weights",
            F
            + "test_training_loop.py::test_gradients_are_averaged_over_ranks_so_every_rank_holds_the_same_parameters_after_each_step",
            F
            + "test_what_ddp_keeps_equal.py::test_an_optimizer_setting_computed_from_a_rank_local_value_stays_rank_local_and_sets_the_weights_apart",
        ),
    ),
    ContractRow(
        "normalisation statistics",
        ("buffer.*.running_mean", "buffer.*.running_var", "buffer.*.num_batches_tracked"),
        EQUAL,
        ("start",),
        "DDP broadcasts rank 0's buffers when it wraps the module and before every training forward; each rank's "
        "forward then updates its own BatchNorm running statistics, so after a batch they differ, and the other "
        "ranks' updates are replaced by rank 0's at the next forward",
        (
            F
            + "test_training_loop.py::test_batchnorm_running_stats_are_broadcast_from_rank_0_before_each_forward_then_updated_with_the_ranks_own_batch",
        ),
    ),
    ContractRow(
        "buffers",
        "buffer.*",
        EQUAL,
        AFTER_WRAP,
        "DDP broadcasts rank 0's buffers when it wraps the module and before every training forward, so a buffer a "
        "rank changes differs from rank 0's until the next forward overwrites it: what the other ranks wrote there "
        "is lost",
        (
            F
            + "test_what_ddp_keeps_equal.py::test_a_buffer_a_rank_updates_outside_forward_is_overwritten_by_rank_0s_at_the_next_forward",
        ),
    ),
    ContractRow(
        "optimizer settings",
        "optimizer*",
        EQUAL,
        AFTER_WRAP + ("setup",),
        "left to your code: neither DDP nor Lightning syncs an optimizer's hyperparameters or which parameters it "
        "steps; a value computed from a rank's own data or rank number stays that rank's",
        (
            F
            + "test_what_ddp_keeps_equal.py::test_an_optimizer_setting_computed_from_a_rank_local_value_stays_rank_local_and_sets_the_weights_apart",
        ),
    ),
    ContractRow(
        "LR schedulers",
        "scheduler*",
        EQUAL,
        AFTER_WRAP + ("setup",),
        "left to your code: Lightning steps each rank's scheduler the same number of times and syncs none of its "
        "settings; a schedule built from a rank's own count stays that rank's",
        (
            F
            + "test_what_ddp_keeps_equal.py::test_an_lr_scheduler_setting_computed_from_a_rank_local_value_stays_rank_local",
        ),
    ),
    ContractRow(
        "evaluation batch counts",
        ("trainer.num_val_batches", "trainer.num_test_batches", "trainer.num_predict_batches"),
        MAY_DIFFER,
        (),
        "ranks may run different numbers of validation or test batches (use_distributed_sampler=False, an exact "
        "evaluation): an epoch-level synced log still completes, but Lightning floors its synced count (upstream "
        "issue #21859), so its mean is not the true one, and a collective made inside the batches loses its partner",
        (
            F
            + "test_uneven_shards.py::test_uneven_shards_floor_the_synced_count_so_the_epoch_level_synced_mean_is_inflated",
            F
            + "test_uneven_shards.py::test_uneven_shards_with_a_step_only_synced_log_fail_the_ranks_with_more_batches_and_the_others_finish",
        ),
    ),
    ContractRow(
        "Trainer counters",
        "trainer.*",
        EQUAL,
        AFTER_WRAP,
        "Lightning runs the same loop on every rank; ranks whose shards hold different numbers of batches step "
        "apart, and the next collective of one is paired with another's or waits",
        (
            F
            + "test_uneven_shards.py::test_uneven_fit_without_logging_finishes_the_ranks_with_fewer_batches_and_fails_the_others_in_a_ddp_collective",
            F + "test_callbacks.py::test_early_stopping_stops_every_rank_at_the_first_epoch_any_rank_wants_to_stop",
        ),
    ),
    ContractRow(
        "the best checkpoint's path",
        "callback.ModelCheckpoint*.best_model_path",
        EQUAL,
        ("end",),
        "left to the checkpoint's filename: ModelCheckpoint formats it on every rank from that rank's values, and "
        "trainer.test(ckpt_path='best') loads each rank's own best_model_path",
        (
            F
            + "test_rank_state_checkpoint_filename.py::test_test_with_ckpt_path_best_fails_on_every_rank_when_the_filename_holds_a_rank_local_metric",
        ),
    ),
    ContractRow(
        "callback state",
        "callback.*",
        MAY_DIFFER,
        (),
        "a callback's own counters follow the values it monitors, which may be rank-local; Lightning reduces the "
        "decisions it acts on (stop, save) across ranks",
        (
            F
            + "test_callbacks.py::test_model_checkpoint_saves_only_when_every_rank_improves_and_keeps_a_rank_local_best_score",
        ),
    ),
    ContractRow(
        "module attributes",
        "module.attr.*",
        EQUAL,
        ("setup", "start", "train_start", "eval_start"),
        "left to your code: Lightning syncs no attribute you set; before the first training step every rank ran "
        "the same code on the same inputs, so a difference then comes from the rank number, the rank's own data or "
        "its random draws (once batches ran, a list or dict attribute may hold rank-local outputs and is not "
        "compared)",
        (
            F
            + "test_what_ddp_keeps_equal.py::test_an_attribute_set_from_the_rank_before_training_stays_that_ranks_own",
            F + "test_epoch_end_outputs.py::test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end",
        ),
    ),
    ContractRow(
        "datamodule attributes",
        "datamodule.attr.*",
        EQUAL,
        ("setup", "start", "train_start", "eval_start"),
        "left to your code: Lightning runs the datamodule's setup on every rank and syncs nothing it sets",
        (F + "test_what_ddp_keeps_equal.py::test_ranks_that_build_their_dataset_apart_shard_different_datasets",),
    ),
    ContractRow(
        "datasets",
        "loader.*.dataset",
        EQUAL,
        AFTER_WRAP,
        "left to your code: DistributedSampler gives each rank the indices of its shard of the dataset the rank "
        "holds; the shards partition one dataset only if every rank holds the same one",
        (F + "test_what_ddp_keeps_equal.py::test_ranks_that_build_their_dataset_apart_shard_different_datasets",),
    ),
)

#: The contract, by row name.
CONTRACT = {row.name: row for row in _ROWS}


def row_for(path: str) -> Optional[ContractRow]:
    """The first row whose pattern matches ``path``, or None (the field is not part of the contract)."""
    for row in _ROWS:
        if row.matches(path):
            return row
    return None


#: What the first optimizer step must equal: one process stepping on the samples every rank ran, with the same
#: initial weights (ddpprobe/contract/_single.py compares them).
SINGLE_PROCESS_STEP = ContractRow(
    "the first step equals one process",
    "grad.*",
    EQUAL,
    ("first_step",),
    "DDP averages the ranks' gradients: with W ranks of batch b and a loss averaged over the batch, the first "
    "step's gradient is that of one process on the W*b samples; a loss summed over the batch gives 1/W of it",
    (
        F
        + "test_what_ddp_keeps_equal.py::test_the_first_step_of_w_ranks_equals_one_process_on_all_their_samples_only_for_a_loss_averaged_over_the_batch",
    ),
)


#: What an LR schedule must keep: its planned length against the optimizer steps taken, as in one process
#: (ddpprobe/audit/causes/_contract.py compares the two runs' last records).
SINGLE_PROCESS_SCHEDULE = ContractRow(
    "a schedule's length against the steps taken equals one process's",
    "scheduler*",
    EQUAL,
    ("end",),
    "each rank runs 1/W of the batches, and trainer.num_training_batches and estimated_stepping_batches count the "
    "rank's shard, so a schedule sized by them ends where one process's ends; one sized "
    "by a loader the module builds itself (its own train_dataloader(), the dataset's length) plans W times the "
    "steps the ranks take, and a setting computed from the world size departs from one process's by design",
    (
        F
        + "test_what_ddp_keeps_equal.py::test_the_trainer_counts_the_ranks_shard_so_a_schedule_sized_by_the_modules_own_loader_stops_part_way",
    ),
)


#: What a file the module's own code writes must hold: what one process writes there (ddpprobe/audit/causes/_files.py
#: compares the two runs' files, ddpprobe/trace/_files.py records them).
SINGLE_PROCESS_FILES = ContractRow(
    "a file the run writes holds what one process writes there",
    "file.*",
    EQUAL,
    ("end",),
    "left to your code: Lightning runs your hooks on every rank, each with the outputs of its own shard, and writes "
    "its own checkpoints and logs on global rank 0 only; ranks that write one path overwrite each other's file, and "
    "a file one rank writes holds that rank's share",
    (
        F
        + "test_what_ddp_keeps_equal.py::test_every_rank_writing_one_path_leaves_the_file_with_one_ranks_shard_not_the_whole_set",
        F + "test_epoch_end_outputs.py::test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end",
    ),
)
