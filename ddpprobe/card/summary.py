"""What the card says first: the seed question's answers with this run's numbers, and the order of sections.

The project started from one question: *validating on 2 GPUs, every print shows twice; does
on_validation_epoch_end see the outputs of all GPUs or only its own, and if only its own, how do you log
F1, precision and recall over the entire validation set?* :data:`SEED_QUESTIONS` splits it into parts,
each answered by facts of the suite. :func:`seed_answers` reads a card: a part's answer is given only
when every case of its facts holds in this run, and with the numbers those facts recorded with
``semantics.number``; otherwise it says which verdicts the run got instead.

Sections follow :data:`TOPIC_ORDER`, the fact modules from the seed question outwards (the README's
"What the tests answer" table lists them in the same order, which tests/tooling/card/test_card_layout.py
checks); test modules not in it come after, alphabetically by path (:func:`order_topics`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

SEED_QUESTION = (
    "validating on 2 GPUs, every `print` shows twice; does `on_validation_epoch_end` see the outputs of all "
    "GPUs or only its own, and if only its own, how do you log F1, precision and recall over the entire "
    "validation set?"
)


@dataclasses.dataclass(frozen=True)
class Question:
    """One part of the seed question, the answer its facts prove, and those facts as ``(module, function)``."""

    question: str
    answer: str
    facts: tuple


SEED_QUESTIONS = (
    Question(
        "Does `on_validation_epoch_end` see the outputs of all ranks or only its own?",
        "Only its own. Outputs a rank collects in `validation_step` stay in that rank's process; nothing "
        "gathers them, so each rank's `on_validation_epoch_end` holds its own shard (padding duplicates "
        "included), and only the union over ranks is the whole set.",
        (("test_epoch_end_outputs", "test_outputs_collected_in_validation_step_are_rank_local_at_epoch_end"),),
    ),
    Question(
        "Why does every `print` show twice?",
        "Every rank runs every hook, so a plain `print` writes once per rank. `self.print` and a "
        "`@rank_zero_only` function write on rank 0 only; `self.logger.experiment` is a no-op on every other "
        "rank, so a logger file holds rank 0's local value only.",
        (
            (
                "test_printing_and_loggers",
                "test_plain_print_appears_once_per_rank_while_self_print_and_rank_zero_only_print_once",
            ),
            (
                "test_printing_and_loggers",
                "test_logger_experiment_on_other_ranks_is_a_no_op_so_the_file_holds_rank_0s_local_value",
            ),
        ),
    ),
    Question(
        "How do you log F1, precision and recall over the entire validation set?",
        "Not by averaging: a per-batch F1 logged with `sync_dist=True` is a mean of batch F1s. Log torchmetrics "
        "objects (`BinaryF1Score`, `BinaryPrecision`, `BinaryRecall`; no `sync_dist` needed), or `all_gather` "
        "predictions and targets, or all-reduce the TP/FP/FN counts: each equals scikit-learn on the samples the "
        "ranks evaluated. Those include `DistributedSampler`'s padding duplicates; gather the sample ids too and "
        "drop duplicates for the single-process value.",
        (
            ("test_f1_over_whole_set", "test_f1_over_the_whole_validation_set_five_ways"),
            ("test_f1_over_whole_set", "test_metric_objects_need_no_sync_dist_and_trigger_no_sync_dist_warning"),
        ),
    ),
    Question(
        "And what does `self.log` give without and with `sync_dist`?",
        "Without `sync_dist` each rank keeps the mean over its own shard and the logger writes rank 0's; with "
        "`sync_dist=True` every rank gets the mean over all samples the ranks evaluated, padding duplicates "
        "included, which differs from the single-process mean when N does not divide by the world size.",
        (
            (
                "test_logging_sync_dist",
                "test_without_sync_dist_each_rank_keeps_its_own_value_and_only_rank_0s_reaches_the_log_file",
            ),
            (
                "test_logging_sync_dist",
                "test_with_sync_dist_every_rank_gets_the_mean_over_the_padded_set_not_the_dataset",
            ),
        ),
    ),
    Question(
        "And per label, F1, precision and recall at the threshold that gives the best F1 (the original code's metric)?",
        "Only a recipe that sees every score can choose that threshold: chosen on a rank's outputs or on each "
        "batch it is a different threshold. `self.all_gather` of scores and labels, or a synced "
        "`MultilabelPrecisionRecallCurve(thresholds=None)`, choose it on the padded set the ranks evaluated; "
        "gathering the sample ids too and dropping duplicates gives the single-process numbers; a fixed "
        "threshold grid keeps memory constant but can only choose a grid point (benchmarks/memory.md).",
        (
            (
                "test_multilabel_best_threshold_f1",
                "test_a_best_threshold_chosen_on_rank_local_outputs_is_each_ranks_own_threshold_and_scores",
            ),
            (
                "test_multilabel_best_threshold_f1",
                "test_b_averaging_per_batch_best_threshold_f1_gives_neither_the_whole_set_f1_nor_one_threshold",
            ),
            (
                "test_multilabel_best_threshold_f1",
                "test_c_all_gather_and_d_a_synced_curve_metric_choose_the_threshold_on_the_padded_set_and_e_dropping_duplicates_gives_the_single_process_numbers",
            ),
            (
                "test_multilabel_best_threshold_f1",
                "test_g_a_fixed_threshold_grid_metric_chooses_only_grid_thresholds_and_is_approximate",
            ),
        ),
    ),
)


#: The card's pointers beyond the seed question: each pattern page of docs/ with the fact modules that prove
#: it. The summary links the sections of those modules that are in the run (``further_reading``).
FURTHER_READING = (
    (
        "Collective hazards: ranks that do not make the same collective calls",
        "docs/collective-hazards.md",
        (
            "test_collective_hazards_keys",
            "test_collective_hazards_torchmetrics",
            "test_collective_hazards_callbacks",
            "test_collective_hazards_nccl",
        ),
    ),
    (
        "Collectives you don't see: code that looks local and runs a collective",
        "docs/collectives-you-dont-see.md",
        (
            "test_hidden_collectives_metrics_properties",
            "test_hidden_collectives_progress_bar",
            "test_hidden_collectives_torchmetrics_list_states",
            "test_hidden_collectives_all_gather_leaves",
            "test_hidden_collectives_half_precision",
        ),
    ),
    (
        "State that differs between ranks: reductions outside self.log, checkpoint names, seeds, log dirs",
        "docs/state-between-ranks.md",
        (
            "test_reductions_outside_log",
            "test_rank_state_checkpoint_filename",
            "test_rank_state_seeds",
            "test_rank_state_accumulation",
            "test_rank_state_log_dir",
            "test_rank_state_rank_zero_only",
        ),
    ),
)


def further_reading(card: dict, pointers: Optional[tuple] = None) -> list:
    """The pointers of ``pointers`` (default :data:`FURTHER_READING`, read at call time) whose fact modules are
    in the run.

    Returns:
        ``[{"title", "page", "modules": [the modules of the run, in the pointer's order]}]``; a pointer none
        of whose modules ran is left out.
    """
    ran = {topic["module"] for topic in card["topics"]}
    out = []
    for title, page, modules in FURTHER_READING if pointers is None else pointers:
        present = [m for m in modules if m in ran]
        if present:
            out.append({"title": title, "page": page, "modules": present})
    return out


def anchor(module: str) -> str:
    """The Markdown anchor of a section headed ``## <module>`` (GitHub's rule: lower case, spaces to ``-``)."""
    return re.sub(r"[^a-z0-9_\- ]", "", module.lower()).replace(" ", "-")


def seed_answers(card: dict, questions=SEED_QUESTIONS) -> list:
    """Each part of the seed question with its answer as this run establishes it.

    Returns:
        ``[{"question", "answer" (None unless every case of its facts holds), "facts": [{"module",
        "function", "fact", "cases", "holds", "verdicts", "numbers" (the recorded texts of the first
        case that recorded any), "case" (that case's parameters)}]}]``; a fact not in the run has
        ``cases == 0``.
    """
    by_function: dict = {}
    for topic in card["topics"]:
        for fact in topic["facts"]:
            by_function.setdefault((topic["module"], fact["function"]), []).append(fact)
    answers = []
    for q in questions:
        facts = []
        for module, function in q.facts:
            cases = by_function.get((module, function), [])
            with_numbers = next((c for c in cases if c["numbers"]), None)
            facts.append(
                {
                    "module": module,
                    "function": function,
                    "fact": cases[0]["fact"] if cases else function,
                    "cases": len(cases),
                    "holds": sum(c["outcome"] == "holds" for c in cases),
                    "verdicts": sorted({c["verdict"] for c in cases if c["outcome"] != "holds"}),
                    "numbers": [n["text"] for n in with_numbers["numbers"]] if with_numbers else [],
                    "case": (
                        ", ".join(f"{k}={v}" for k, v in with_numbers["params"].items()) if with_numbers else None
                    ),
                }
            )
        established = all(f["cases"] and f["holds"] == f["cases"] for f in facts)
        answers.append({"question": q.question, "answer": q.answer if established else None, "facts": facts})
    return answers


#: The card's sections, in order: fact modules by path relative to the rootdir, from the seed question
#: (sharding, what the epoch end sees, sync_dist, printing, the whole-set F1) outwards. A fact module not
#: listed still gets its section, after these, alphabetically by path; to give it its place, add its path
#: here and its row at the same place in the "What the tests answer" tables of README.md and docs/tests.md
#: (tests/tooling/card/test_card_layout.py checks that both list exactly these, in this order).
TOPIC_ORDER = (
    "tests/facts/test_sharding.py",
    "tests/facts/test_epoch_end_outputs.py",
    "tests/facts/test_logging_sync_dist.py",
    "tests/facts/test_printing_and_loggers.py",
    "tests/facts/test_f1_over_whole_set.py",
    "tests/facts/test_multilabel_best_threshold_f1.py",
    "tests/facts/test_removed_hooks.py",
    "tests/facts/test_lightning_1x_hooks.py",
    "tests/facts/test_log_reductions.py",
    "tests/facts/test_where_values_land.py",
    "tests/facts/test_collectives.py",
    "tests/facts/test_collective_hazards_keys.py",
    "tests/facts/test_collective_hazards_torchmetrics.py",
    "tests/facts/test_collective_hazards_callbacks.py",
    "tests/facts/test_collective_hazards_nccl.py",
    "tests/facts/test_hidden_collectives_metrics_properties.py",
    "tests/facts/test_hidden_collectives_progress_bar.py",
    "tests/facts/test_hidden_collectives_torchmetrics_list_states.py",
    "tests/facts/test_hidden_collectives_all_gather_leaves.py",
    "tests/facts/test_hidden_collectives_half_precision.py",
    "tests/facts/test_what_ddp_keeps_equal.py",
    "tests/facts/test_training_loop.py",
    "tests/facts/test_callbacks.py",
    "tests/facts/test_reductions_outside_log.py",
    "tests/facts/test_rank_state_checkpoint_filename.py",
    "tests/facts/test_rank_state_seeds.py",
    "tests/facts/test_rank_state_accumulation.py",
    "tests/facts/test_rank_state_log_dir.py",
    "tests/facts/test_rank_state_rank_zero_only.py",
    "tests/facts/test_nccl.py",
    "tests/facts/test_multinode.py",
    "tests/facts/test_predict.py",
    "tests/facts/test_iterable_datasets.py",
    "tests/facts/test_uneven_shards.py",
    "tests/facts/test_user_samplers.py",
    "tests/facts/test_samplers_rewrapped.py",
    "tests/facts/test_preemption.py",
    "tests/facts/test_manual_optimization_static_graph.py",
    "tests/facts/test_metric_wrappers.py",
    "tests/facts/test_metric_checkpoints.py",
    "tests/facts/test_metric_precision_and_devices.py",
    "tests/facts/test_several_dataloaders.py",
    "tests/facts/test_weights_in_validate_test_predict.py",
    "tests/facts/test_unused_parameters.py",
    "tests/facts/test_training_step_returning_none.py",
    "tests/facts/test_estimated_stepping_batches.py",
    "tests/facts/test_lr_find.py",
    "tests/facts/test_profiler_files.py",
    "tests/facts/test_fabric.py",
    "tests/facts/test_ddp_spawn.py",
    "tests/facts/test_process_group_timeout.py",
)


def order_topics(topics: list, order: Optional[tuple] = None) -> list:
    """``topics`` (card topics, each a dict with ``path`` relative to the rootdir) sorted by ``order``
    (default :data:`TOPIC_ORDER`, read at call time); paths not in it come after, alphabetically by path.
    Returns a new list; ``topics`` is not changed."""
    index = {path: i for i, path in enumerate(TOPIC_ORDER if order is None else order)}
    return sorted(topics, key=lambda t: (index.get(t["path"], len(index)), t["path"]))
