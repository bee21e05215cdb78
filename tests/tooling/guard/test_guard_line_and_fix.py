"""``CollectiveGuard`` names the line to change and a fix that fits it.

**The line.** A state field that breaks (``StateDiverged``) is named with the user's line that last set it where the
guard sees the set (a module attribute, an optimizer's param-group key: ddpprobe/guard/_writers.py), else with the
hooks each rank ran between the last check where it was equal and the check where it differs. The line an uncaught
guard error is "raised under" is the user's line that parted the ranks, never the script's ``trainer.fit`` where
this rank's own frame is only Lightning's (a state check in the guard's hook, Lightning's own barrier).

**The fix.** The registry's preconditions are evaluated on what the guard saw, in the sanity check as in the loop:
a ``compute()`` on rank 0 only of a Metric that is also logged gets its entry's cause and fix where it first shows,
in Lightning's default sanity check. ``collective_on_some_ranks``'s fix "outside the branch on the rank" is given
only where the user's frames of the call read the rank; a collective under a condition of the rank's own data gets
"decide it on one rank and broadcast", one in ``prepare_data`` "move the collective out of prepare_data".

Every expected line number comes from the module's source (``_at``), every expected value from the module's data.
Two gloo ranks; the guard's timeout 5 s, the process group's 10 s, so a hazard the guard missed ends in seconds.
"""

import inspect

import pytest

from ddpprobe import RankFailed
from ddpprobe.hazards import HAZARDS, NO_FIX, advice, fix_line
from tests.support.guard_forms import (
    data_dependent_collective,
    datamodule_setup_collective,
    logged_metric_compute_on_rank_zero,
    prepare_data_collective,
)
from tests.tooling.guard.test_guard_forms import _at
from tests.tooling.guard.test_guard_hazards import _guard_errors, _line

LIMITS = {"pg_timeout": 10, "timeout": 60}
#: The wording of collective_on_some_ranks's fix that assumes a branch on the rank.
BRANCH_FIX = "outside the branch on the rank"
#: The entry's other fixes (ddpprobe/hazards/_collectives.py), in order: prepare_data, then a rank-local condition.
PREPARE_DATA_FIX, CONDITION_FIX = HAZARDS["collective_on_some_ranks"].other_fixes


def _mismatch(run_world, module, **params) -> dict:
    with pytest.raises(RankFailed) as failure:
        run_world(module.train, 2, **params, **LIMITS)
    return _guard_errors(failure.value, "CollectiveMismatch", [0, 1])


# --- fixes that fit ------------------------------------------------------------------------------------------------


def test_a_logged_metrics_compute_on_rank_0_in_the_default_sanity_check_gets_its_cause_and_fix(run_world):
    """Rank 0's ``compute()`` meets the other rank's epoch sync of the same logged Metric, made by Lightning's loop,
    in the sanity check Lightning runs by default: the user's call is the one the others never make, so the entry is
    ``metric_compute_on_some_ranks`` with its cause and fix (before: "No proven fix applies")."""
    assert "num_sanity_val_steps" not in inspect.getsource(logged_metric_compute_on_rank_zero.train)
    site = _at(logged_metric_compute_on_rank_zero, "on_validation_epoch_end", ".compute()")
    for message in _mismatch(run_world, logged_metric_compute_on_rank_zero).values():
        _line(0, f"at {site}, run by `MulticlassAccuracy.compute()`", message)
        _line(1, "logged as 'val_acc'", message)
        assert (
            "\nCause (metric_compute_on_some_ranks): MulticlassAccuracy.compute() syncs its state on rank(s) [0] only"
            in message
        )
        assert fix_line("metric_compute_on_some_ranks") in message and NO_FIX not in message, message


def test_a_collective_under_a_condition_of_the_ranks_data_gets_the_broadcast_fix_not_the_branch_fix(run_world):
    """``if x.abs().max() > 10: dist.all_reduce(...)``: no line reads the rank, so the fix is to give every rank the
    same decision first (broadcast or combined), never "outside the branch on the rank"."""
    site = _at(data_dependent_collective, "training_step", "dist.all_reduce(outliers)")
    alone = data_dependent_collective.outlier_rank(2)
    for message in _mismatch(run_world, data_dependent_collective).values():
        _line(alone, f"is about to all_reduce int64 [1] (your code) at {site}", message)
        assert f"ran on rank(s) [{alone}] only in training_step" in message, message
        assert "\nCause (collective_on_some_ranks): " in message, message
        assert f"Fix: {CONDITION_FIX.fix} (shown by {CONDITION_FIX.fix_fact})" in message, message
        assert BRANCH_FIX not in message, message


def test_the_broadcast_fix_of_the_data_condition_runs_to_the_end_under_the_guard(run_world):
    """The same script with the ranks' decisions combined first (``reduce_boolean_decision(found, all=False)``): every
    rank makes the all_reduce, the guard stays silent, and every rank counts the data's one outlier."""
    x = data_dependent_collective.loader().dataset.tensors[0]
    outliers = int((x.abs() > 10).sum())
    records = run_world(data_dependent_collective.train, 2, fixed=True, **LIMITS).records
    assert [r["outliers_seen"] for r in records] == [outliers, outliers], records


def test_a_collective_in_prepare_data_gets_the_prepare_data_fix_not_the_branch_fix(run_world):
    """``dist.barrier()`` in ``prepare_data``, which reads no rank: Lightning runs the hook on local rank 0 only, so
    the fix is to move the collective out of it."""
    with pytest.raises(RankFailed) as failure:
        run_world(prepare_data_collective.train, 2, guard_timeout=5.0, **LIMITS)
    for message in _guard_errors(failure.value, "CollectiveMismatch", [0, 1]).values():
        assert f"Fix: {PREPARE_DATA_FIX.fix} (shown by {PREPARE_DATA_FIX.fix_fact})" in message, message
        assert BRANCH_FIX not in message, message


def test_a_collective_under_is_global_zero_keeps_the_branch_fix(run_world):
    """``if self.trainer.is_global_zero: dist.all_reduce(...)`` in a datamodule's ``setup`` reads the rank: the branch
    fix is the one that fits."""
    for message in _mismatch(run_world, datamodule_setup_collective).values():
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
