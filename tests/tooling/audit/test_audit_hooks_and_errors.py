"""Which ranks ran each hook, and which error came first (ddpprobe/audit/evidence/_hooks.py,
``first_own_error`` in ddpprobe/audit/evidence/_sequences.py): a collective made in a hook some ranks never enter
names the hook, the ranks that entered it and the fact that shows who runs it, with the divergence and the errors
it caused under it; when ranks raise, the rank whose own code raised first, outside a collective, is the problem,
and its peers' errors while waiting for it are its consequences. Each rule is tested on hand-written traces and on
a module written for it (tests/support/contract_modules.py), with a module where it must stay silent."""

import pytest

from ddpprobe.audit.evidence._hooks import WHO_RUNS, collectives_in_hooks_some_ranks_skip
from ddpprobe.audit.evidence._sequences import first_own_error
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit's reading of hooks and errors, not a fact about DDP")

M = "tests.support.contract_modules"
#: Seconds each audited world may run; a module whose ranks hang by design gets the shorter one, its collective
#: released by the process-group timeout, half of it.
TIMEOUT, HANG_TIMEOUT = 30.0, 12.0


def _audit(model: str, timeout: float = TIMEOUT):
    return audited(f"{M}:{model}", f"{M}:make_data", world_size=2, stage="fit", timeout=timeout)


def _trace(hooks: dict, collectives=(), stage="end", error=None, t=None) -> dict:
    return {
        "hooks": {h: 1 for h in hooks},
        "hook_times": dict(hooks),
        "collectives": list(collectives),
        "stage": stage,
        "stage_error": error,
        "stage_error_t": t,
    }


GATHER = {"op": "all_reduce", "call_site": "m.py:3 in prepare_data", "running": "prepare_data", "status": "pending"}


def test_a_collective_in_a_hook_only_rank_0_entered_is_named_with_the_fact_of_who_runs_it():
    traces = [
        _trace({"prepare_data": 1.0, "setup": 2.0}, [GATHER], stage="raised"),
        _trace({"setup": 1.5}, stage="raised"),
    ]
    found = collectives_in_hooks_some_ranks_skip(traces)
    assert found == [
        {
            "hook": "prepare_data",
            "ranks": [0],
            "collectives": ["all_reduce at m.py:3 in prepare_data"],
            "runs_on": WHO_RUNS["prepare_data"][0],
            "fact": WHO_RUNS["prepare_data"][1],
        }
    ]


def test_a_hook_some_ranks_skip_without_a_collective_in_it_or_not_yet_reached_is_no_finding():
    quiet = [_trace({"prepare_data": 1.0, "setup": 2.0}), _trace({"setup": 1.5})]
    assert collectives_in_hooks_some_ranks_skip(quiet) == []
    stopped_before = [_trace({"prepare_data": 1.0}, [GATHER], stage="raised"), _trace({"setup": 0.5}, stage="raised")]
    assert collectives_in_hooks_some_ranks_skip(stopped_before) == []


def test_the_first_error_is_the_earliest_raised_outside_any_collective():
    waiting = {"op": "barrier", "status": "raised"}
    world = [
        _trace({}, [waiting], stage="raised", error="RuntimeError: Connection closed by peer", t=5.0),
        _trace({}, [{"op": "broadcast", "status": "done"}], stage="raised", error="ValueError: bad", t=4.0),
        _trace({}, [], stage="raised", error="KeyError: later", t=6.0),
    ]
    assert first_own_error(world) == {"rank": 1, "error": "ValueError: bad"}
    assert first_own_error(world[:1]) is None


@pytest.mark.waits_for_timeout
def test_a_collective_in_prepare_data_is_the_problem_and_the_divergence_and_errors_follow_it():
    result = _audit("make_gather_in_prepare_data", timeout=HANG_TIMEOUT)

    assert [(h["hook"], h["ranks"]) for h in result.skipped_hooks] == [("prepare_data", [0])]
    finding = result.findings[0]
    assert finding["problem"].startswith("a collective (all_reduce at contract_modules.py:")
    assert WHO_RUNS["prepare_data"][1] in finding["problem"]
    assert any(c.startswith("the ranks' collectives diverge") for c in finding["consequences"])
    assert len(result.findings) == 1, result.findings


def test_a_collective_in_setup_which_every_rank_runs_names_no_hook():
    result = _audit("make_gather_in_setup")
    assert result.skipped_hooks == [] and result.exit_code == 0, result.problems


def test_the_rank_whose_own_code_raised_is_the_problem_and_its_peers_errors_are_consequences():
    """``RaisesOnRankOne``: rank 1 raises ``ValueError`` in its own ``training_step``; rank 0, waiting in the step
    sync that rank 1 never joins, fails with gloo's connection error. The ValueError is the problem; the
    divergence and rank 0's RuntimeError are listed under it, in the report and in ``--json``."""
    result = _audit("make_raises_on_rank_one")

    assert result.trace["first_error"] == {"rank": 1, "error": "ValueError: target out of range in this shard"}
    finding = result.findings[0]
    assert finding["problem"] == "the fit stage raised ValueError (rank 1)"
    assert "the fit stage raised RuntimeError (rank 0)" in finding["consequences"]
    assert result.to_dict()["findings"][0]["problem"] == finding["problem"]
