"""The audit and the guard explain a hazard only with what a fact proves, and never contradict their evidence.

Each test runs a module of tests/support/audit_forms.py of one form in which the audit or the guard once
explained wrongly (a proven fact left unused, a report contradicting its own evidence, a fix that does not
apply, a fix for a guessed cause, a report a new user cannot act on), and checks the cause and the fix against
the registry entry (ddpprobe/hazards/) whose fact proves them, the numbers against the data
(tests/support/oracle.py), and the whole report against its own records (tests/support/audit_report.py).
"""

import inspect
import os

import pytest

from ddpprobe import RankFailed, _lightning, audit as ddp_audit, hazards
from ddpprobe.audit import audit
from tests.support import audit_forms, audit_modules, oracle
from tests.support.audit_report import contradictions, guarded_stage
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit's and the guard's explanations, not a fact about DDP")

FORMS, MODULES = "tests.support.audit_forms", "tests.support.audit_modules"
#: Seconds a world may run; a world expected to hang in a collective ends at half of it (the process group's).
TIMEOUT, HANG_TIMEOUT = 40.0, 12.0
#: The guarded runs: the process-group timeout above the guard's (half of it), the world's above both.
GUARD_LIMITS = {"pg_timeout": 10, "timeout": 30}


def _audit(model: str, data: str, stage: str = "validate", timeout: float = TIMEOUT):
    result = audited(model, data, world_size=2, stage=stage, timeout=timeout)
    assert contradictions(result) == [], result.format()
    return result


def _text(result) -> str:
    return " ".join(result.format().split())


def _line_of(cls, method: str, text: str, file: str = "audit_forms.py") -> str:
    lines, start = inspect.getsourcelines(getattr(cls, method))
    return f"{file}:{start + next(i for i, line in enumerate(lines) if text in line)} in {method}"


def _fix(name: str) -> str:
    return " ".join(hazards.fix_line(name).split())


def _guard_messages(failure) -> dict:
    """Each rank's ``CollectiveMismatch`` message (every rank must raise it, not gloo's error)."""
    err = failure.value
    assert {r: err.exc_types.get(r) for r in err.ranks} == {r: "CollectiveMismatch" for r in range(2)}, str(err)
    return {r: " ".join(err.rank_errors[r].split()) for r in range(2)}


# --- 1. a proven fact not used ------------------------------------------------------------------------------


def test_a_strategy_reduce_of_an_int64_count_is_named_as_the_truncation_the_fact_proves():
    """Rank 0 keeps 2 samples of value >= 9, rank 1 keeps 3 (``IdDataset(8)`` at W=2); their
    ``trainer.strategy.reduce`` of the int64 count is ``int(5 / 2) = 2``, not 2.5. The trace holds every rank's
    int64 all_reduce from the reduce at the user's line, so the cause is the registry's ``int64_reduce``
    (tests/facts/test_reductions_outside_log.py), with its fix, not "unknown"."""
    result = _audit(f"{FORMS}:make_int64_reduce_model", f"{MODULES}:make_ids_8")

    kept = [sum(1 for v in oracle.values(oracle.shard(8, 2, r)) if v >= audit_modules.BIG) for r in range(2)]
    oracle.assert_distinct(truncated=int(sum(kept) / 2), exact=sum(kept) / 2)
    row = result.row("val_kept")
    assert row.per_rank == [int(sum(kept) / 2)] * 2 and row.hazards == ["int64_reduce"], row
    assert row.fixes == ["int64_reduce"] and not row.cause.startswith("unknown"), row
    line = _line_of(audit_forms.Int64ReduceModule, "on_validation_epoch_end", "strategy.reduce")
    assert f"line {line} reduced an int64 tensor with trainer.strategy.reduce" in row.cause, row.cause
    assert _fix("int64_reduce") in _text(result)


# --- 2. a report contradicting its own evidence -----------------------------------------------------------


def test_samples_no_rank_ran_are_the_cause_when_the_recomputed_sync_is_the_measured_value_not_unknown():
    """``RankStrideSampler`` over 11 samples in batches of 2, wrapped by Lightning: 5 samples of W=1 run on no
    rank, and the single process's batches mix them with samples that ran, so recomputing W=1 without them is
    impossible; the synced mean recomputed from the ranks' own values and batch sizes is the measured one.
    The header's count of missing samples is the cause's, and no line says there were none."""
    result = _audit(f"{MODULES}:make_mean_model", f"{FORMS}:make_rank_stride_11_in_pairs")

    missing = result.counts["val"]["missing_vs_single"]
    assert missing == 11 - sum(result.counts["val"]["samples"]) and missing == 5, result.counts
    row = result.row("val_mean")
    assert row.hazards == ["missing_samples_synced_correctly"] and not row.cause.startswith("unknown"), row
    assert f"missing samples: {missing} sample(s) of W=1 ran on no rank" in row.cause, row.cause
    assert row.evidence["recomputed synced mean"] == pytest.approx(row.per_rank[0]), row.evidence
    assert f"{missing} sample(s) of W=1 ran on no rank" in _text(result)


def test_a_key_computed_from_the_tensor_leaves_all_gather_moved_is_equal_by_its_construction_not_by_chance():
    """``self.all_gather({"names": [...], "count": tensor})``: the strings come back unchanged, the count is
    gathered. ``val_count`` (the gathered counts' sum, 2 + 3) is equal on the ranks and to single-process
    because of that all_gather, which the report names ("equal by construction"); it never says no rank ran a
    collective there."""
    result = _audit(f"{FORMS}:make_gathered_count_model", f"{MODULES}:make_ids_8")

    kept = [sum(1 for v in oracle.values(oracle.shard(8, 2, r)) if v >= audit_modules.BIG) for r in range(2)]
    row = result.row("val_count")
    assert row.per_rank == [sum(kept)] * 2 and row.verdict == ddp_audit.SYNCED_EQUAL, row
    line = _line_of(audit_forms.GatheredCountModule, "on_validation_epoch_end", "self.all_gather")
    assert (
        "equal by construction: the module's own collectives in on_validation_epoch_end on every rank "
        f"(all_gather at {line}" in (" ".join(row.cause.split()))
    ), row.cause
    assert "equal by chance" not in row.cause and "no rank ran a collective" not in row.cause, row.cause


@pytest.mark.waits_for_timeout
def test_ranks_parting_on_shards_of_equal_length_are_not_told_the_count_follows_the_data():
    """A step-level synced key on every rank and, at its second batch, an all_gather on rank 1 alone; every
    rank's shard holds 2 batches (recorded). The culprit is rank 1's all_gather, made on rank 1 only, and its
    fix is the registry's for a collective some ranks skip: not "the count follows the data" nor an even
    batch count."""
    result = _audit(f"{FORMS}:make_step_sync_then_branch_gather_model", f"{MODULES}:make_ids_8", timeout=HANG_TIMEOUT)

    assert result.counts["val"]["batches"] == [len(oracle.batches(oracle.shard(8, 2, r), 2)) for r in range(2)]
    diagnosis = result.trace["first_divergence"]["diagnosis"]
    line = _line_of(audit_forms.StepSyncThenBranchGatherModule, "validation_step", "self.all_gather")
    assert diagnosis["culprit"]["entry"]["call_site"] == line and diagnosis["culprit"]["ranks"] == [1], diagnosis
    assert diagnosis["hazard"] == "collective_on_some_ranks", diagnosis
    text = _text(result)
    assert "follows the data" not in text and "same number of batches" not in text, text


# --- 3. fixes that do not apply: the guard at a hook boundary against Lightning's own collective ----------------


def _entry(rank: int, **fields) -> dict:
    base = {"op": None, "key": None, "metric": None, "source": None, "hook": None, "root": None}
    op = fields.get("op")
    return {"kind": "collective", "rank": rank, "id": ["collective", op, None, None], "fields": {**base, **fields}}


def _boundary(rank: int, hook: str) -> dict:
    return {"kind": "boundary", "rank": rank, "id": ["boundary", hook], "fields": {"hook": hook, "batch_idx": None}}


@pytest.mark.parametrize("op", ["barrier", "broadcast"])
def test_a_rank_at_a_hook_boundary_against_lightnings_own_barrier_or_broadcast_gets_no_fix(op):
    """Rank 0 is at ``on_validation_epoch_end``, rank 1 about to run Lightning's own ``{op}`` (no user line, no
    key, no metric): no registry entry's evidence holds, so the guard's fix lines say that no proven fix
    applies, and name neither ``compute()`` on every rank nor ``rank_zero_only``."""
    entries = [_boundary(0, "on_validation_epoch_end"), _entry(1, op=op, source="library", loop_step="Trainer._run")]

    lines = hazards.guard_fix_lines(entries)

    assert len(lines) == 1 and lines[0].startswith(hazards.NO_FIX), lines
    assert "compute()" not in lines[0] and "rank_zero_only" not in lines[0], lines


#: Rank 0's side of a collective rank 1 does not make, by the call that made it, and the entry it proves.
ALONE = {
    "metric_compute_on_some_ranks": {"op": "barrier", "source": "torchmetrics", "metric": "MeanMetric"},
    "rank0_only_synced_log": {"op": "barrier", "source": "self.log", "key": "k", "sync": "epoch"},
    "collective_on_some_ranks": {"op": "all_gather", "source": "user", "call_site": "m.py:3 in on_test_epoch_end"},
    "metrics_read_on_some_ranks": {
        "op": "barrier",
        "source": "self.log",
        "key": "k",
        "sync": "epoch",
        "hook": "training_step",
        "running": "on_train_epoch_end",
        "call_site": "m.py:9 in on_train_epoch_end",
        "call": "Trainer.callback_metrics",
    },
}


@pytest.mark.parametrize("expected", sorted(ALONE))
def test_a_collective_only_rank_0_makes_gets_the_fix_of_the_call_that_made_it(expected):
    """Rank 0 about to make a collective rank 1 (at a hook boundary) does not: the entry follows from the call
    that made it (a Metric's compute, a self.log sync, the user's own collective, a read of the logged
    metrics), and the fix printed is that entry's only."""
    entries = [_entry(0, **ALONE[expected]), _boundary(1, "on_validation_epoch_end")]

    assert hazards.guard_hazard(entries)[0] == expected
    assert hazards.guard_fix_lines(entries) == [hazards.fix_line(expected)]


# --- 4. a fix for a guessed cause ---------------------------------------------------------------------------


def test_a_read_of_callback_metrics_on_rank_0_only_gets_the_read_on_every_rank_fix_in_the_audit():
    """Rank 0 alone reads ``trainer.callback_metrics`` in ``on_train_epoch_end`` (running the epoch sync of
    ``train_v``), then every rank calls ``strategy.reduce``: rank 0's sync pairs with rank 1's reduce. The audit
    names the line, the property and the key, and gives the fact's fix (read on every rank, then branch), not
    ``rank_zero_only``; ``train_v``, whose sync was mispaired, is a consequence and gets no fix of its own."""
    result = _audit(f"{FORMS}:make_metrics_read_then_reduce_model", f"{MODULES}:make_fit_8", "fit")

    diagnosis = result.trace["first_divergence"]["diagnosis"]
    assert diagnosis["hazard"] == "metrics_read_on_some_ranks" and diagnosis["fixes"] == [diagnosis["hazard"]]
    line = _line_of(audit_forms.MetricsReadThenReduceModule, "on_train_epoch_end", "callback_metrics")
    text = _text(result)
    assert f"line {line} reads `Trainer.callback_metrics`, which runs the epoch sync of 'train_v'" in text, text
    assert _fix("metrics_read_on_some_ranks") in text and "rank_zero_only" not in text, text
    assert result.row("train_v").fixes == [] and "train_v" in result.consequence_keys, result.row("train_v")


def test_a_read_of_callback_metrics_on_rank_0_only_that_pairs_by_luck_is_named_with_the_same_fix():
    """The same read on rank 0 with no collective after it: it pairs with rank 1's own epoch-end sync of
    ``train_v``, so the ranks' collectives do not diverge and the value is right (by luck, as the fact says).
    The audit still names the read from its call chain (the ranks that made it, the line, the key) and gives the
    read-on-every-rank fix: the next collective the module makes there would pair with it instead."""
    result = _audit(f"{FORMS}:make_metrics_read_model", f"{MODULES}:make_fit_8", "fit")

    assert result.trace["first_divergence"] is None, result.format()
    (read,) = result.trace["lone_reads"]
    line = _line_of(audit_forms.MetricsReadModule, "on_train_epoch_end", "callback_metrics")
    assert (read["ranks"], read["key"], read["call_site"]) == ([0], "train_v", line), read
    text = _text(result)
    assert f"line {line} reads `Trainer.callback_metrics`, which runs the epoch sync of 'train_v'" in text, text
    assert _fix("metrics_read_on_some_ranks") in text and result.exit_code == 1, text


def test_a_read_of_callback_metrics_on_rank_0_only_gets_the_read_on_every_rank_fix_under_the_guard(run_world):
    """The same module under ``CollectiveGuard``: every rank raises ``CollectiveMismatch`` at the read, with the
    read-on-every-rank fix and neither the ``compute()`` nor the ``rank_zero_only`` fix."""
    with pytest.raises(RankFailed) as failure:
        run_world(
            guarded_stage,
            2,
            model_ref=f"{FORMS}:make_metrics_read_then_reduce_model",
            data_ref=f"{MODULES}:make_fit_8",
            stage="fit",
            **GUARD_LIMITS,
        )

    for message in _guard_messages(failure).values():
        assert _fix("metrics_read_on_some_ranks") in message, message
        assert "rank_zero_only" not in message and "metric.compute()" not in message, message


@pytest.mark.waits_for_timeout
def test_a_key_only_rank_1_logs_with_sync_dist_gets_the_same_keys_fix_in_validate():
    """``val_extra`` is logged with ``sync_dist=True`` on rank 1 only: under ``trainer.validate`` its epoch sync
    on rank 1 has no partner. The audit's cause (on the divergence, whose culprit the key's sync is: the row is
    its consequence) names rank 1 and the fix is the same keys on every rank; not
    ``rank_zero_only`` (rank 0 logs nothing of it) nor ``compute()`` (no metric is involved)."""
    result = _audit(f"{FORMS}:make_key_on_rank_one_model", f"{MODULES}:make_ids_8", timeout=HANG_TIMEOUT)

    row = result.row("val_extra")
    assert row.logged_on == [1] and "val_extra" in result.consequence_keys and row.fixes == [], row
    diagnosis = result.trace["first_divergence"]["diagnosis"]
    assert diagnosis["hazard"] == "key_on_some_ranks" and diagnosis["fixes"] == ["key_on_some_ranks"], diagnosis
    text = _text(result)
    assert text.count("Fix:") == 1 and _fix("key_on_some_ranks") in text, text
    assert "rank_zero_only" not in text and "compute()" not in text, text


def test_a_key_only_rank_1_logs_with_sync_dist_gets_the_same_keys_fix_under_the_guard(run_world):
    """The same module under ``CollectiveGuard`` in ``trainer.validate``: the fix is the same keys on every
    rank, and neither ``rank_zero_only`` nor ``compute()`` on every rank."""
    with pytest.raises(RankFailed) as failure:
        run_world(
            guarded_stage,
            2,
            model_ref=f"{FORMS}:make_key_on_rank_one_model",
            data_ref=f"{MODULES}:make_ids_8",
            **GUARD_LIMITS,
        )

    for message in _guard_messages(failure).values():
        assert _fix("key_on_some_ranks") in message, message
        assert "rank_zero_only" not in message and "metric.compute()" not in message, message


# --- 5. reports a new user can act on -----------------------------------------------------------------------


@pytest.mark.waits_for_timeout
def test_a_new_users_report_counts_one_root_cause_and_prints_no_fix_for_step_values_that_are_not_a_problem():
    """A module written from the README: ``val_loss`` and ``val_acc`` synced, ``val_step`` logged at each step
    without ``sync_dist`` (rank-local step values, not a problem), and ``self.all_gather`` under ``if
    self.global_rank == 0`` at epoch end. The report counts one problem (the divergence) with what it took
    down under it, prints one fix (the divergence's), none for the step values, and calls the correct keys
    correct."""
    result = _audit(f"{FORMS}:make_new_user_model", f"{MODULES}:make_ids_8", timeout=HANG_TIMEOUT)

    values = oracle.values(range(8))
    assert result.row("val_loss").single == pytest.approx(oracle.mean(values))
    assert [f["problem"].split(":")[0] for f in result.findings] == ["the ranks' collectives diverge"], result.findings
    steps = result.row("val_step", level="step")
    assert not steps.problem and steps.fixes == [] and steps.hazards == [], steps
    text = _text(result)
    assert "1 problem(s), exit code 1" in text and text.count("Fix:") == 1, text
    assert _fix("collective_on_some_ranks") in text, text


def test_an_error_in_the_users_code_is_shown_with_the_users_frames_and_in_full_in_json():
    """``validation_step`` reads an attribute the module never set: the report shows the ``AttributeError``
    once for the places that raised it, with the user's frame and its line of code, not Lightning's; the
    JSON holds the whole traceback."""
    import json

    result = _audit(f"{FORMS}:make_attribute_error_model", f"{MODULES}:make_ids_8")

    line = _line_of(audit_forms.AttributeErrorModule, "validation_step", "self.threshold")
    number = line.split(":")[1].split()[0]
    text = result.format()
    path = os.path.relpath(inspect.getsourcefile(audit_forms))  # shown relative to the working directory
    assert f'File "{path}", line {number}, in validation_step' in text, text
    lightning_path = _lightning.PACKAGES[_lightning.chosen()][0].replace(".", "/")  # the Lightning package run
    assert "return self.threshold * batch" in text and lightning_path not in text, text
    assert [f["problem"] for f in result.findings] == ["the validate stage raised AttributeError (W=1, rank 0, rank 1)"]
    full = "".join(json.loads(result.to_json())["raised"]["single"]["traceback"])
    assert lightning_path in full and "self.threshold" in full, full


def test_a_factory_that_raises_for_its_own_reason_is_shown_with_that_error_not_told_to_take_no_arguments():
    """A factory of no arguments that raises ``FileNotFoundError`` of its own: the refusal names that error and
    the factory's line, and does not say it must take no arguments."""
    with pytest.raises(ddp_audit.AuditInputError) as refused:
        audit(f"{FORMS}:make_model_from_a_missing_checkpoint", f"{MODULES}:make_ids_8")

    message = str(refused.value)
    assert f"raised FileNotFoundError: {audit_forms.MISSING_CHECKPOINT}" in message, message
    assert "in make_model_from_a_missing_checkpoint" in message and "no arguments" not in message, message
