"""``CollectiveGuard`` names the line to change and a fix that fits it.

**The line.** A state field that breaks (``StateDiverged``) is named with the user's line that last set it where the
guard sees the set (a module attribute, an optimizer's param-group key: ddpprobe/guard/_writers.py), else with the
hooks each rank ran between the last check where it was equal and the check where it differs. The line an uncaught
guard error is "raised under" is the user's line that parted the ranks, never the script's ``trainer.fit`` where
this rank's own frame is only Lightning's (a state check in the guard's hook, Lightning's own barrier).

**The fix.** The registry's preconditions are evaluated on what the guard saw, in the sanity check as in the loop:
a ``compute()`` on rank 0 only of a Metric that is also logged gets its entry's cause and fix where it first shows,
in Lightning's default sanity check. ``collective_on_some_ranks``'s fix "outside the branch on the rank" is given
only where the user's frames of the call read the rank; a collective under a condition of the rank's own data or
its own clock gets "give every rank the same decision first" (decided on one rank and broadcast, or combined), one
in ``prepare_data`` "move the collective out of prepare_data".

Every expected line number comes from the module's source (``_at``), every expected value from the module's data.
Two gloo ranks; the guard's timeout 5 s, the process group's 10 s, so a hazard the guard missed ends in seconds.

Recorded worlds (the fixture ``failed_world``, tests/support/guard_recordings.py): what each rank posted at the check
that differed (its state record with where each field was last set and the hooks it ran, or its collective with the
frames that read the rank) and the user's line each rank raised under, stored under tests/recordings/guard/ by one
live run; the errors, their lines, fixes and printed reports (``_errors.printed``) are computed from it here. The
runs that pass are live claims, in the integration run.
"""

import inspect

import pytest

from ddpprobe.guard import _writers
from ddpprobe.hazards import HAZARDS, NO_FIX, advice, fix_line
from tests.support.guard_forms import (
    _plain,
    attribute_from_rank,
    compute_on_rank_one,
    data_dependent_collective,
    datamodule_setup_collective,
    logged_metric_compute_on_rank_zero,
    lr_halved_on_rank_zero,
    prepare_data_collective,
    scheduled_lr,
    stop_on_rank_zero,
    timer_collective,
)
from tests.tooling.guard.test_guard_forms import _at
from tests.tooling.guard.test_guard_hazards import _guard_errors, _line

LIMITS = {"pg_timeout": 10, "timeout": 60}
#: The wording of collective_on_some_ranks's fix that assumes a branch on the rank.
BRANCH_FIX = "outside the branch on the rank"
#: The entry's other fixes (ddpprobe/hazards/_collectives.py), in order: prepare_data, then a rank-local condition.
PREPARE_DATA_FIX, CONDITION_FIX = HAZARDS["collective_on_some_ranks"].other_fixes


def _reports(failed_world, module, **params) -> dict:
    """``{rank: {"type", "message", "report"}}``: the guard error each rank raised in the recorded world of
    ``module.train`` and what it would print uncaught (``_errors.printed`` under the line the rank raised under)."""
    return failed_world(module.train, 2, **params, **LIMITS).reports


def _mismatch(failed_world, module, **params) -> dict:
    """Each rank's ``CollectiveMismatch`` text, from the recorded world of ``module.train`` at W = 2."""
    failure = failed_world(module.train, 2, **params, **LIMITS)
    return _guard_errors(failure, "CollectiveMismatch", [0, 1])


def _function_line(function, text: str) -> str:
    """``"file.py:N in function"`` of the line of a module-level ``function`` holding ``text``."""
    lines, start = inspect.getsourcelines(function)
    offset = next(i for i, line in enumerate(lines) if text in line)
    module = inspect.getmodule(function).__name__.rsplit(".", 1)[-1]
    return f"{module}.py:{start + offset} in {function.__name__}"


def _label(cls, hook: str) -> str:
    """How the guard names a hook of the user's code: ``"TimeBudget.on_train_batch_end (stop_on_rank_zero.py:18)"``."""
    function = vars(cls)[hook]
    module = inspect.getmodule(function).__name__.rsplit(".", 1)[-1]
    return f"{cls.__name__}.{hook} ({module}.py:{function.__code__.co_firstlineno})"


# --- the line ------------------------------------------------------------------------------------------------------


def test_a_rate_halved_on_rank_zero_names_the_line_that_halved_it_and_is_raised_under_it(failed_world):
    """``group["lr"] /= 2`` in a ``@rank_zero_only`` helper called from ``on_train_epoch_start``: the param group's
    set is seen on rank 0, none on rank 1 (its rate was set when the optimizer was made, before the guard watched it).
    The report is raised under that line, not under the script's ``trainer.fit``."""
    reports = _reports(failed_world, lr_halved_on_rank_zero)
    site = _function_line(lr_halved_on_rank_zero.halve, 'group["lr"] /= 2')
    for rank in (0, 1):
        assert reports[rank]["type"] == "StateDiverged", reports
        message = reports[rank]["message"]
        assert "  optimizer[0].group[0].lr: rank 0 0.05, rank 1 0.1\n" in message, message
        expected = f"    last set: rank 0 at {site} (in on_train_epoch_start), rank 1 not by code the guard saw"
        assert expected in message.splitlines(), message
    printed = reports[0]["report"]
    assert f"  raised under rank 0's {site} (in on_train_epoch_start), the line that last set " in printed, printed
    assert "lr_halved_on_rank_zero.py" in printed.splitlines()[-2] and "in train" not in printed.splitlines()[-2]


def test_an_attribute_set_from_the_rank_names_the_line_that_set_it_on_every_rank(failed_world):
    """``self.noise_std = 0.1 * (self.global_rank + 1)`` in the module's ``setup``: the same line set it on each
    rank (the audit's writer records, ddpprobe/trace/_writers.py)."""
    reports = _reports(failed_world, attribute_from_rank)
    site = _at(attribute_from_rank, "setup", "self.noise_std =")
    for rank in (0, 1):
        assert reports[rank]["type"] == "StateDiverged", reports
        assert f"    last set at {site} on every rank" in reports[rank]["message"].splitlines(), reports[rank]
    assert f"  raised under rank 0's {site}, the line that last set module.attr.noise_std" in reports[0]["report"]


def test_a_field_no_watched_line_set_names_the_hooks_the_ranks_ran_since_it_was_equal(failed_world):
    """``trainer.should_stop = True`` on rank 0 in a callback's ``on_train_batch_end`` at batch 1: the Trainer's
    attributes are not watched, so the guard names what ran between the last check where the flag was equal (the
    first optimizer step's state check, step 1) and the differing one: the module's ``training_step`` and the
    callback's hook, on both ranks."""
    reports = _reports(failed_world, stop_on_rank_zero)
    ran = [_label(_plain.LitClassifier, "training_step"), _label(stop_on_rank_zero.TimeBudget, "on_train_batch_end")]
    for rank in (0, 1):
        assert reports[rank]["type"] == "StateDiverged", reports
        message = reports[rank]["message"]
        assert "  trainer.should_stop: rank 0 True, rank 1 False\n" in message, message
        hooks = [line for line in message.splitlines() if line.startswith("    no set of it by your code seen; ")]
        assert len(hooks) == 1, message
        assert "on_train_batch_end (epoch 0, step 1) the ranks ran: " + ", ".join(ran) in hooks[0], message
    printed = reports[0]["report"]
    assert ", at the guard's state check (what ran since the field was equal: above)\n" in printed, printed


def test_a_collective_only_another_rank_makes_is_raised_under_that_ranks_line(failed_world):
    """``compute()`` on rank 1 only: rank 0, which prints the report, waits in Lightning's own barrier, under the
    script's ``trainer.fit`` alone; its report names rank 1's ``compute()`` line instead."""
    reports = _reports(failed_world, compute_on_rank_one)
    assert [reports[r]["type"] for r in (0, 1)] == ["CollectiveMismatch"] * 2, reports
    site = _at(compute_on_rank_one, "on_validation_epoch_end", ".compute()")
    expected = f"  raised under rank 1's {site}, the collective the other ranks do not make"
    assert expected in reports[0]["report"].splitlines(), reports[0]["report"]


def test_the_lines_of_a_state_break_are_a_function_of_the_ranks_records():
    """The words, on records as the ranks annotate them: a line seen on some ranks, the same line on every rank, and
    hooks run on every rank and on some only (``prepare_data``, which Lightning runs on local rank 0 only)."""
    field = "module.attr.scale"
    seen = [{"written_at": {field: "m.py:4 in setup"}}, {"written_at": {field: None}}]
    assert _writers.lines(field, seen) == ["    last set: rank 0 at m.py:4 in setup, rank 1 not by code the guard saw"]
    both = [{"written_at": {field: "m.py:4 in setup"}}] * 2
    assert _writers.lines(field, both) == ["    last set at m.py:4 in setup on every rank"]
    at = [3, 1, "check #3, on_fit_start (epoch 0, step 0)"]
    hooks = [
        {"equal_at": {field: at}, "hooks": [["M.prepare_data (m.py:2)", 2], ["M.setup (m.py:4)", 3]]},
        {"equal_at": {field: [3, 1, at[2]]}, "hooks": [["M.setup (m.py:4)", 2]]},
    ]
    assert _writers.lines(field, hooks) == [
        "    no set of it by your code seen; since it was equal at check #3, on_fit_start (epoch 0, step 0) the "
        "ranks ran: M.setup (m.py:4); only rank(s) [0] ran M.prepare_data (m.py:2)"
    ]
    assert _writers.lines(field, [{}, {}]) == []


# --- fixes that fit ------------------------------------------------------------------------------------------------


def test_a_logged_metrics_compute_on_rank_0_in_the_default_sanity_check_gets_its_cause_and_fix(failed_world):
    """Rank 0's ``compute()`` meets the other rank's epoch sync of the same logged Metric, made by Lightning's loop,
    in the sanity check Lightning runs by default: the user's call is the one the others never make, so the entry is
    ``metric_compute_on_some_ranks`` with its cause and fix (before: "No proven fix applies")."""
    assert "num_sanity_val_steps" not in inspect.getsource(logged_metric_compute_on_rank_zero.train)
    site = _at(logged_metric_compute_on_rank_zero, "on_validation_epoch_end", ".compute()")
    for message in _mismatch(failed_world, logged_metric_compute_on_rank_zero).values():
        _line(0, f"at {site}, run by `MulticlassAccuracy.compute()`", message)
        _line(1, "logged as 'val_acc'", message)
        assert (
            "\nCause (metric_compute_on_some_ranks): MulticlassAccuracy.compute() syncs its state on rank(s) [0] only"
            in message
        )
        assert fix_line("metric_compute_on_some_ranks") in message and NO_FIX not in message, message


def test_a_collective_under_a_condition_of_the_ranks_data_gets_the_broadcast_fix_not_the_branch_fix(failed_world):
    """``if x.abs().max() > 10: dist.all_reduce(...)``: no line reads the rank, so the fix is to give every rank the
    same decision first (broadcast or combined), never "outside the branch on the rank"."""
    site = _at(data_dependent_collective, "training_step", "dist.all_reduce(outliers)")
    alone = data_dependent_collective.outlier_rank(2)
    for message in _mismatch(failed_world, data_dependent_collective).values():
        _line(alone, f"is about to all_reduce int64 [1] (your code) at {site}", message)
        assert f"ran on rank(s) [{alone}] only in training_step" in message, message
        assert "\nCause (collective_on_some_ranks): " in message, message
        assert f"Fix: {CONDITION_FIX.fix} (shown by {CONDITION_FIX.fix_fact})" in message, message
        assert BRANCH_FIX not in message, message


def test_a_collective_fired_by_a_clock_gets_the_broadcast_fix_not_the_branch_fix(failed_world):
    """``if time.monotonic() - self._synced_at > EVERY_S: dist.all_reduce(...)``, one rank's first batch slow to
    read: that rank alone is past the interval at its first step. No line reads the rank: the fix is to give every
    rank the same decision first."""
    alone = timer_collective.slow_rank(2)
    site = _at(timer_collective, "training_step", "dist.all_reduce(self._count)")
    failure = failed_world(timer_collective.train, 2, pg_timeout=40, timeout=90)
    for message in _guard_errors(failure, "CollectiveMismatch", [0, 1]).values():
        _line(alone, f"is about to all_reduce float32 [1] (your code) at {site}", message)
        assert f"Fix: {CONDITION_FIX.fix} (shown by {CONDITION_FIX.fix_fact})" in message, message
        assert BRANCH_FIX not in message, message


@pytest.mark.integration
def test_the_broadcast_fix_of_the_data_condition_runs_to_the_end_under_the_guard(run_world):
    """The same script with the ranks' decisions combined first (``reduce_boolean_decision(found, all=False)``): every
    rank makes the all_reduce, the guard stays silent, and every rank counts the data's one outlier."""
    x = data_dependent_collective.loader().dataset.tensors[0]
    outliers = int((x.abs() > 10).sum())
    records = run_world(data_dependent_collective.train, 2, fixed=True, **LIMITS).records
    assert [r["outliers_seen"] for r in records] == [outliers, outliers], records


def test_a_collective_in_prepare_data_gets_the_prepare_data_fix_not_the_branch_fix(failed_world):
    """``dist.barrier()`` in ``prepare_data``, which reads no rank: Lightning runs the hook on local rank 0 only, so
    the fix is to move the collective out of it."""
    failure = failed_world(prepare_data_collective.train, 2, guard_timeout=5.0, **LIMITS)
    for message in _guard_errors(failure, "CollectiveMismatch", [0, 1]).values():
        assert f"Fix: {PREPARE_DATA_FIX.fix} (shown by {PREPARE_DATA_FIX.fix_fact})" in message, message
        assert BRANCH_FIX not in message, message


def test_a_collective_under_is_global_zero_keeps_the_branch_fix(failed_world):
    """``if self.trainer.is_global_zero: dist.all_reduce(...)`` in a datamodule's ``setup`` reads the rank: the branch
    fix is the one that fits."""
    for message in _mismatch(failed_world, datamodule_setup_collective).values():
        assert fix_line("collective_on_some_ranks") in message and BRANCH_FIX in message, message


def test_the_fix_of_a_collective_on_some_ranks_follows_the_evidence_of_a_branch_on_the_rank():
    """The registry's preconditions on the evidence alone: a branch on the rank recorded (or not recorded, as in
    the audit's trace) gives the branch fix; none recorded, the broadcast fix; in prepare_data, the prepare_data
    fix whatever the code reads."""
    base = {"source": "user", "ranks": [0], "op": "all_reduce", "call site": "m.py:9 in training_step"}
    assert advice("collective_on_some_ranks", base) == [fix_line("collective_on_some_ranks")]
    assert advice("collective_on_some_ranks", dict(base, **{"rank branch": True})) == [
        fix_line("collective_on_some_ranks")
    ]
    broadcast = [f"Fix: {CONDITION_FIX.fix} (shown by {CONDITION_FIX.fix_fact})"]
    assert advice("collective_on_some_ranks", dict(base, **{"rank branch": False})) == broadcast
    prepare = [f"Fix: {PREPARE_DATA_FIX.fix} (shown by {PREPARE_DATA_FIX.fix_fact})"]
    for read in (True, False):
        evidence = dict(base, **{"rank branch": read, "running hook": "prepare_data"})
        assert advice("collective_on_some_ranks", evidence) == prepare


# --- the watch stays silent on a correct run ----------------------------------------------------------------------


@pytest.mark.integration
def test_a_schedule_every_rank_steps_and_a_resumed_checkpoint_give_the_same_rates_with_the_guard_as_without(
    run_world,
):
    """StepLR halves the rate at each epoch's end, through the param groups the guard watches; ModelCheckpoint writes
    the optimizer's state and a second fit resumes from it (its groups replaced by ``load_state_dict``). No error, and
    the rates are the schedule's: ``LR * GAMMA**epochs`` after each fit, as without the guard."""
    m = scheduled_lr
    expected = [m.LR * m.GAMMA**m.EPOCHS, m.LR * m.GAMMA ** (m.EPOCHS + 1)]
    guarded = run_world(m.train, 2, **LIMITS).records
    plain = run_world(m.train, 2, guard=False, **LIMITS).records
    for rank in (0, 1):
        assert guarded[rank]["rates"] == pytest.approx(expected), (guarded, expected)
        assert guarded[rank]["rates"] == plain[rank]["rates"], (guarded, plain)
