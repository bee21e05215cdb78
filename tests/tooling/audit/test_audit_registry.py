# ruff: noqa: E501 - the tables below hold whole fact-test names and one scenario per line
"""The hazard registry's self-test: every entry is proven by a fact, recognised where this file says it is, and
listed in docs/audit.md.

For every entry with a module that has its hazard (the facts' own scenario written as a user would, in
examples/ or tests/support/), the audit of that module must name the entry, print its fix (or, where the fix's
preconditions do not hold, that no proven fix applies), and name no other entry than the scenario's; under
``CollectiveGuard`` the same module must raise ``CollectiveMismatch`` on every rank with the fix line of the
entry the guard's evidence proves. Every fact test an entry names exists; every test of the hazard fact files
is an entry's fact, or is listed with the reason it is not a hazard (a fix's fact, a mechanism) or why it has
no entry yet. docs/audit.md's table of entries is generated from this file (``python -m
tests.tooling.audit.test_audit_registry --write`` rewrites it) and must be current.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

from ddpprobe import RankFailed, hazards
from tests.support import generated_docs

pytestmark = pytest.mark.not_a_fact("tests the hazard registry, not a fact about DDP")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOC = os.path.join(REPO, "docs", "audit.md")

EX, AM, AF = "examples.reported_cases", "tests.support.audit_modules", "tests.support.audit_forms"
NC = "tests.support.newcomer_modules"
SEED = ("examples.seed_f1_module:make_model", "examples.seed_f1_module:make_data")

#: ``entry: (model, data, stage, hangs, the entries the audit names)``: a module with the entry's hazard.
SCENARIOS = {
    "repeated_samples": (f"{AM}:make_unsynced_mean_model", f"{AM}:make_ids_9", "validate", False, {"repeated_samples", "step_mean_rank_local"}),
    "step_mean_rank_local": (f"{AM}:make_unsynced_mean_model", f"{AM}:make_ids_9", "validate", False, {"repeated_samples", "step_mean_rank_local"}),
    "epoch_end_rank_local": (f"{NC}:make_model", f"{NC}:make_data", "validate", False, {"repeated_samples", "step_mean_rank_local", "epoch_end_rank_local", "print_every_rank"}),
    "unsharded_data": (f"{EX}:make_synced_sum_model", f"{EX}:make_unsharded_iterable_8", "validate", False, {"unsharded_data"}),
    "missing_samples": (f"{AM}:make_mean_model", f"{AM}:make_rank_stride_11", "validate", False, {"missing_samples"}),
    "missing_samples_synced_correctly": (f"{AM}:make_mean_model", f"{AF}:make_rank_stride_11_in_pairs", "validate", False, {"missing_samples_synced_correctly"}),
    "floored_count": (f"{EX}:make_unpadded_mean_model", f"{EX}:make_unpadded_11", "validate", False, {"floored_count"}),
    "non_decomposable": (*SEED, "validate", False, {"non_decomposable", "rank_local_metric", "experiment_rank_local", "print_every_rank"}),
    "int64_reduce": (f"{AF}:make_int64_reduce_model", f"{AM}:make_ids_8", "validate", False, {"int64_reduce"}),
    "rank_local_mean": (f"{AM}:make_unsynced_mean_model", f"{AM}:make_ids_8", "validate", False, {"rank_local_mean"}),
    "rank_local_metric": (*SEED, "validate", False, {"non_decomposable", "rank_local_metric", "experiment_rank_local", "print_every_rank"}),
    "experiment_rank_local": (*SEED, "validate", False, {"non_decomposable", "rank_local_metric", "experiment_rank_local", "print_every_rank"}),
    "metric_step_local": (f"{EX}:make_step_and_epoch_accuracy_model", f"{EX}:make_right_wrong_8", "validate", False, {"metric_step_local"}),
    "unmoved_leaves": (f"{AM}:make_gathered_names_model", f"{AM}:make_ids_8", "validate", False, {"rank_local_metric", "unmoved_leaves", "experiment_rank_local"}),
    "print_every_rank": (*SEED, "validate", False, {"non_decomposable", "rank_local_metric", "experiment_rank_local", "print_every_rank"}),
    "callbacks_rank_local": (f"{AM}:make_monitored_model", f"{AM}:make_fit_8", "fit", False, None),
    "keys_differ": (f"{EX}:make_key_per_rank_model", f"{EX}:make_ids_12", "validate", False, None),
    "key_on_some_ranks": (f"{AF}:make_key_on_rank_one_model", f"{AM}:make_ids_8", "validate", True, {"key_on_some_ranks"}),
    "rank0_only_synced_log": (f"{AF}:make_rank_zero_synced_key_model", f"{AM}:make_ids_8", "validate", True, {"rank0_only_synced_log"}),
    "unsynced_key_on_some_ranks": (f"{AF}:make_rank_zero_monitored_key_model", f"{AM}:make_fit_8", "fit", True, {"unsynced_key_on_some_ranks"}),
    "metric_compute_on_some_ranks": (f"{EX}:make_compute_on_rank_zero_model", f"{EX}:make_ids_12", "validate", True, {"metric_compute_on_some_ranks"}),
    "metrics_read_on_some_ranks": (f"{AF}:make_metrics_read_then_reduce_model", f"{AM}:make_fit_8", "fit", False, {"metrics_read_on_some_ranks"}),
    "collective_on_some_ranks": (f"{AM}:make_rank_branch_gather_model", f"{AM}:make_ids_8", "validate", True, {"collective_on_some_ranks"}),
    "list_state_element_sync": (f"{AM}:make_list_state_model", f"{AM}:make_ids_8", "validate", True, {"list_state_element_sync"}),
    "uneven_batches_step_sync": (f"{EX}:make_step_synced_model", f"{EX}:make_sharded_iterable_5", "validate", True, None),
    "uneven_batches_fit": (f"{EX}:make_train_loss_model", f"{EX}:make_sharded_iterable_5_fit", "fit", True, None),
    "predict_collective": (f"{EX}:make_predict_gather_model", f"{EX}:make_ids_5", "predict", True, {"predict_collective"}),
    "bool_reduce": (f"{AF}:make_bool_reduce_model", f"{AM}:make_ids_8", "validate", False, {"bool_reduce"}),
    "list_state_dtypes_differ": (f"{AF}:make_odd_ids_model", f"{AM}:make_ids_8", "validate", True, {"list_state_dtypes_differ"}),
    "metric_sync_on_compute_false": (f"{AF}:make_unsynced_mean_metric_model", f"{AM}:make_ids_8", "validate", False, {"metric_sync_on_compute_false"}),
    "unweighted_rank_mean": (f"{AF}:make_epoch_end_mean_model", f"{EX}:make_unpadded_11", "validate", False, {"unweighted_rank_mean"}),
    "rank_local_weighted": (f"{AM}:make_unsynced_mean_model", f"{EX}:make_unpadded_11", "validate", False, {"rank_local_weighted"}),
    "uneven_batches": (f"{AF}:make_per_batch_gather_model", f"{EX}:make_sharded_iterable_5", "validate", True, {"uneven_batches"}),
    "gather_shapes_differ": (f"{AF}:make_gather_outputs_model", f"{EX}:make_unpadded_11", "validate", True, {"gather_shapes_differ"}),
    "one_path_every_rank": (f"{AF}:make_one_path_file_model", f"{AM}:make_ids_8", "validate", False, {"one_path_every_rank"}),
}  # fmt: skip

#: ``entry: the entry the guard names`` for the scenarios the guard stops (a collective the ranks make apart).
GUARDED = {
    "keys_differ": "keys_differ",
    "key_on_some_ranks": "key_on_some_ranks",
    "rank0_only_synced_log": "rank0_only_synced_log",
    "metric_compute_on_some_ranks": "metric_compute_on_some_ranks",
    "metrics_read_on_some_ranks": "metrics_read_on_some_ranks",
    "collective_on_some_ranks": "collective_on_some_ranks",
    "uneven_batches_step_sync": "uneven_batches",
    "uneven_batches": "uneven_batches",
    "gather_shapes_differ": "gather_shapes_differ",
    "list_state_dtypes_differ": "list_state_dtypes_differ",
}

#: ``entry: why``: the guard names the entry, but its evidence lacks what the fix's preconditions need, so it prints
#: that no proven fix applies (naming the entry) instead of the fix line.
#: (None since the guard's entries carry each Metric's state sizes: ``list_state_dtypes_differ`` gets its fix.)
GUARD_NO_FIX: dict = {}

#: Entries no module of the self-test shows yet, and why.
NOT_SHOWN: dict = {}

#: The fact files whose tests are hazards (a wrong value, a crash or a hang) or their fixes.
HAZARD_FILES = (
    "test_collective_hazards_keys.py",
    "test_collective_hazards_torchmetrics.py",
    "test_collective_hazards_callbacks.py",
    "test_hidden_collectives_metrics_properties.py",
    "test_hidden_collectives_torchmetrics_list_states.py",
    "test_hidden_collectives_all_gather_leaves.py",
    "test_uneven_shards.py",
    "test_reductions_outside_log.py",
)

#: Tests of the hazard files that are no entry's fact, and why (a mechanism, or a hazard with no entry yet).
UNLISTED = {
    "test_hidden_collectives_metrics_properties.py::test_reading_a_metrics_property_in_on_train_epoch_end_runs_the_epoch_sync_and_reads_the_whole_set_value": "the mechanism (a read on every rank is right)",
    "test_hidden_collectives_metrics_properties.py::test_reading_callback_metrics_mid_epoch_runs_no_collective_and_holds_no_epoch_value_yet": "the mechanism (mid-epoch reads run none)",
    "test_hidden_collectives_metrics_properties.py::test_in_on_validation_epoch_end_a_read_syncs_only_the_keys_logged_in_that_hook": "the mechanism (validation epoch end)",
    "test_hidden_collectives_torchmetrics_list_states.py::test_a_list_state_without_dist_reduce_fx_is_gathered_entry_by_entry_and_flattened_entry_major": "the mechanism (equal counts gather right)",
    "test_hidden_collectives_torchmetrics_list_states.py::test_cat_metric_casts_integer_ids_to_float32_so_a_rank_that_never_updated_is_harmless": "a fix (CatMetric)",
    "test_uneven_shards.py::test_uneven_shards_give_the_true_mean_with_an_epoch_level_synced_log": "no hazard (the mean is right)",
    "test_reductions_outside_log.py::test_strategy_reduce_writes_the_result_into_the_input_tensor_and_a_clone_keeps_it": "no entry: the trace records the all_reduce, not that the module keeps the tensor it passed and so lost its own value",
    "test_reductions_outside_log.py::test_strategy_reduce_returns_a_python_number_unreduced": "no entry: a Python number makes no collective, so the trace holds no evidence of the call",
    "test_reductions_outside_log.py::test_fabric_all_reduce_turns_numbers_into_int32_float32_uint8_tensors_and_truncates_integer_means": "Fabric, not the Trainer: the audit runs LightningModules under a Trainer",
    "test_reductions_outside_log.py::test_fabric_all_reduce_and_all_gather_walk_collections_and_leave_other_leaves_alone": "Fabric, not the Trainer: the audit runs LightningModules under a Trainer",
}  # fmt: skip

MODULES_TIMEOUT, HANG_TIMEOUT = 40.0, 12.0


def _defined_tests(path: str) -> set:
    with open(os.path.join(REPO, path), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def _named_facts() -> set:
    return {f for h in hazards.HAZARDS.values() for f in (*h.facts, h.fix_fact) if f}


@pytest.mark.parametrize("fact", sorted(_named_facts()))
def test_every_fact_an_entry_names_is_a_test_of_tests_facts(fact):
    """Each ``path::name`` an entry gives for its cause or its fix is a test defined in that file of tests/facts/."""
    path, _, name = fact.partition("::")
    assert path.startswith("tests/facts/"), fact
    assert name in _defined_tests(path), f"{name} is not defined in {path}"


def test_every_test_of_the_hazard_fact_files_is_an_entrys_fact_or_is_listed_with_its_reason():
    """A hazard fact that lands in one of the hazard files without an entry (or a reason) fails here."""
    named = {f.removeprefix("tests/facts/") for f in _named_facts()}
    every = {f"{file}::{name}" for file in HAZARD_FILES for name in _defined_tests(f"tests/facts/{file}")}
    assert sorted(every - named - set(UNLISTED)) == [], "hazard facts with no entry and no reason"
    assert sorted(set(UNLISTED) - every) == [], "listed tests that do not exist"


def test_every_entry_has_a_scenario_or_a_reason_and_every_entry_words_its_cause():
    """Each entry is shown by a module of the self-test or listed in ``NOT_SHOWN``; each has facts, a summary
    and a cause template, and a fix only with the fact that shows it."""
    assert sorted(set(hazards.HAZARDS) - set(SCENARIOS) - set(NOT_SHOWN)) == []
    for name, h in hazards.HAZARDS.items():
        assert h.facts and h.summary and h.template, name
        assert (h.fix is None) == (h.fix_fact is None), name


def _audit(model: str, data: str, stage: str, hangs: bool):
    from tests.support.audit_runs import audited

    return audited(model, data, world_size=2, stage=stage, timeout=HANG_TIMEOUT if hangs else MODULES_TIMEOUT)


@pytest.mark.parametrize("entry", sorted(SCENARIOS))
def test_the_audit_names_the_entry_and_its_fix_and_no_other_cause(entry):
    """The audit of the entry's module names the entry (and only the scenario's entries), prints its fix line
    where its preconditions hold and otherwise that no proven fix applies, and contradicts none of its records."""
    from tests.support.audit_report import contradictions

    model, data, stage, hangs, expected = SCENARIOS[entry]
    result = _audit(model, data, stage, hangs)

    named = result.hazards
    assert entry in named, (named, result.format())
    if expected is not None:
        assert set(named) == expected, (named, result.format())
    text = " ".join(result.format().split())
    fixed = " ".join(hazards.fix_line(entry).split()) if hazards.HAZARDS[entry].fix else None
    assert (fixed is not None and fixed in text) or hazards.NO_FIX in text, text
    assert contradictions(result) == [], result.format()


@pytest.mark.parametrize("entry", sorted(GUARDED))
def test_the_guard_names_the_same_hazard_with_its_fix_on_every_rank(run_world, entry):
    """The entry's module under ``CollectiveGuard``: every rank raises ``CollectiveMismatch``, and its message
    holds the fix line of the entry the guard's evidence proves (``GUARDED``), or, for an entry of
    ``GUARD_NO_FIX``, that no proven fix applies with the entry's name."""
    from tests.support.audit_report import guarded_stage

    model, data, stage, _, _ = SCENARIOS[entry]
    with pytest.raises(RankFailed) as failure:
        run_world(guarded_stage, 2, model_ref=model, data_ref=data, stage=stage, pg_timeout=10, timeout=30)

    err = failure.value
    assert {r: err.exc_types.get(r) for r in err.ranks} == {0: "CollectiveMismatch", 1: "CollectiveMismatch"}, str(err)
    name = GUARDED[entry]
    expected = f"{hazards.NO_FIX} (the fix of {name!r} needs" if name in GUARD_NO_FIX else hazards.fix_line(name)
    expected = " ".join(expected.split())
    for r in range(2):
        assert expected in " ".join(err.rank_errors[r].split()), err.rank_errors[r]


# --- the table of docs/audit.md ------------------------------------------------------------------------------


def _short(fact: str) -> str:
    path, _, name = fact.partition("::")
    return f"`{os.path.basename(path)}::{name}`"


def table() -> str:
    """The markdown table of every entry: its summary, the facts of its cause and fix, and whether the audit and
    the guard recognise it (from ``SCENARIOS`` and ``GUARDED``, which the tests above check)."""
    guard_names = set(GUARDED.values())
    lines = [
        "| entry | hazard | proven by | fix proven by | audit | guard |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, h in hazards.HAZARDS.items():
        audit_cell = "yes" if name in SCENARIOS else "no"
        guard_cell = ("yes, without the fix" if name in GUARD_NO_FIX else "yes") if name in guard_names else "no"
        lines.append(
            f"| `{name}` | {h.summary} | {'<br>'.join(_short(f) for f in h.facts)} | "
            f"{_short(h.fix_fact) if h.fix_fact else 'no proven fix'} | {audit_cell} | {guard_cell} |"
        )
    return "\n".join(lines)


def test_the_table_of_entries_in_docs_audit_md_is_current():
    """docs/audit.md holds the table :func:`table` generates, between ``<!-- hazards -->`` markers (rewrite it
    with ``python -m tests.tooling.audit.test_audit_registry --write``)."""
    assert generated_docs.block(DOC, "hazards") == table(), "docs/audit.md's table of hazards is stale: run --write"


if __name__ == "__main__":
    if "--write" in sys.argv:
        generated_docs.write_block(DOC, "hazards", table())
    else:
        print(table())
