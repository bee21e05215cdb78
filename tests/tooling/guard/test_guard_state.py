"""``CollectiveGuard`` checks the DDP contract's state: a field the contract table says must be equal on every
rank (ddpprobe/contract/_table.py) that differs between the ranks is a ``StateDiverged`` on every rank, at the
first state check where it differs, naming the field, each rank's value, the boundary, the contract row and the
fact behind it, then "No proven fix applies" (the registry holds no entry for a state field).

The scripts (tests/support/guard_forms/) are a new user's, written from the README: a learning rate computed
from ``self.global_rank`` (the linear scaling rule with the wrong attribute), an input-noise level set from the
rank in ``setup``, and the learning-rate script fixed. No collective differs in any of them, so without the state
checks each trains to the end with its ranks apart. Two gloo ranks; the guard's timeout 5 s, the process group's
10 s, so a check that never closes fails the test in seconds. Sources: ddpprobe/guard/_state.py (the checks),
ddpprobe/contract/_compare.py (``breaks``, the comparison the audit uses too).

The divergences read recorded worlds (the fixture ``failed_world``, tests/support/guard_recordings.py): each rank's
state record at the check that differed, stored under tests/recordings/guard/ by one live run, and the
``StateDiverged`` computed from them here by the contract's comparison, as the live guard computes it. Live: the
correct run with and without the state checks (they add no collective), and the rate halved on rank 0, named at the
next optimizer step (the small fields riding on a batch's end check of a real run).
"""

import pickle
import re

import pytest

from ddpprobe.contract import CONTRACT
from ddpprobe.guard import CollectiveGuard, _state
from ddpprobe.hazards import NO_FIX
from tests.support import oracle
from tests.support.guard_forms import attribute_from_rank, lr_from_rank
from tests.tooling.guard.test_guard_hazards import _guard_errors

LIMITS = {"pg_timeout": 10, "timeout": 60}
LR = "optimizer[0].group[0].lr"


def _diverged(failed_world, module, live: bool = False, **params) -> dict:
    """Each rank's ``StateDiverged`` text, from the recorded world of ``module.train`` at W = 2 (``live``: the world
    run now)."""
    failure = failed_world(module.train, 2, live=live, **params, **LIMITS)
    return _guard_errors(failure, "StateDiverged", [0, 1])


def _where(message: str) -> tuple:
    """``(boundary, hook, epoch, step)`` of the message's first line: where the state was first seen differing."""
    found = re.search(r"differs, first at (\w+) \((\w+), epoch (\d+), step (\d+)\):", message.splitlines()[0])
    assert found, message
    return found.group(1), found.group(2), int(found.group(3)), int(found.group(4))


def _fields(message: str) -> dict:
    """``{field: {rank: value as shown}}`` from the message's lines ``"  <field>: rank 0 <v>, rank 1 <v>"``."""
    out = {}
    for line in message.splitlines():
        found = re.match(r"  (\S+): (rank 0 .*)$", line)
        if found:
            pairs = re.findall(r"rank (\d+) (.+?)(?=, rank \d+ |$)", found.group(2))
            out[found.group(1)] = {int(r): v for r, v in pairs}
    return out


def _contract_and_no_fix(message: str, row: str, fields: list) -> None:
    """The message names the contract row with its first fact, and says no proven fix applies to ``fields``."""
    assert f"The contract ({row}): " in message and CONTRACT[row].facts[0] in message, message
    assert f"{NO_FIX}: no registry entry's evidence holds for {', '.join(fields)}" in message, message


def test_a_learning_rate_from_the_rank_raises_state_diverged_on_every_rank_at_the_start_naming_both_rates(
    failed_world,
):
    """``lr = 0.01 * (self.global_rank + 1)``: the optimizer exists at ``on_fit_start`` (the first state check,
    after DDP's wrap), where the contract says its settings must be equal. Both ranks raise there, before any
    batch, naming the learning rate and nothing else (the weights are still rank 0's on both). Recorded: the ranks'
    state records at ``on_fit_start``."""
    for message in _diverged(failed_world, lr_from_rank).values():
        assert _where(message) == ("start", "on_fit_start", 0, 0), message
        assert _fields(message) == {LR: {0: "0.01", 1: "0.02"}}, message
        _contract_and_no_fix(message, "optimizer settings", [LR])


def test_a_module_attribute_set_from_the_rank_in_setup_raises_state_diverged_at_the_start_naming_it(failed_world):
    """``self.noise_std = 0.1 * (self.global_rank + 1)`` in the module's ``setup``: a module attribute must be
    equal before any batch ran (it differs then only by the rank, the rank's data or its random draws). Recorded:
    the ranks' state records at ``on_fit_start``."""
    field = "module.attr.noise_std"
    for message in _diverged(failed_world, attribute_from_rank).values():
        assert _where(message) == ("start", "on_fit_start", 0, 0), message
        assert _fields(message) == {field: {0: "0.1", 1: "0.2"}}, message
        _contract_and_no_fix(message, "module attributes", [field])


@pytest.mark.integration
def test_state_false_lets_the_learning_rate_module_train_to_the_end_with_its_weights_apart(run_world):
    """``CollectiveGuard(state=False)``: no state check, and no collective differs, so the run finishes its 8
    steps on both ranks, each with its own rate and, from the first step, its own weights."""
    records = run_world(lr_from_rank.train, 2, state=False, **LIMITS).records
    assert [r["global_step"] for r in records] == [8, 8], oracle.side_by_side("global_step", records)
    assert [r["lr"] for r in records] == [0.01, 0.02], oracle.side_by_side("lr", [r["lr"] for r in records])
    assert records[0]["weight"] != records[1]["weight"], oracle.side_by_side("weight", [r["weight"] for r in records])


def test_state_narrowed_to_the_parameters_catches_the_learning_rate_module_after_its_first_optimizer_step(
    failed_world,
):
    """``state=("param.",)`` leaves the learning rate out. At ``on_fit_start`` the parameters are equal (DDP
    broadcast rank 0's at its wrap); DDP averages the first batch's gradients, then each rank steps with its own
    rate, so the parameters differ at the first check after that step: ``train_batch_end`` of batch 0, step 1.
    Both parameters are named, with each rank's values; the learning rate is not. Recorded: the ranks' state
    records at that check."""
    for message in _diverged(failed_world, lr_from_rank, state=("param.",)).values():
        assert _where(message) == ("train_batch_end", "on_train_batch_end", 0, 1), message
        fields = _fields(message)
        assert sorted(fields) == ["param.net.bias", "param.net.weight"], message
        assert all(values[0] != values[1] for values in fields.values()), message
        _contract_and_no_fix(message, "parameters", ["param.net.bias", "param.net.weight"])


def test_state_checks_add_no_collective_and_change_nothing_in_a_correct_run(run_world):
    """The fixed script (``lr = 0.01 * self.trainer.world_size``) with and without the state checks: the same
    rates, weights and steps, and the default process group ran as many collectives (``pg_seq``); the guard
    passed 6 checks more, one per state boundary: ``start``, ``train_start`` (the first training batch's start,
    after the module's own ``on_train_start``), the first step's ``train_batch_end``, two ``train_epoch_end`` and
    ``end``."""
    on = run_world(lr_from_rank.train, 2, state=True, fixed=True, **LIMITS).records
    off = run_world(lr_from_rank.train, 2, state=False, fixed=True, **LIMITS).records
    assert [r["lr"] for r in on] == [0.02, 0.02] and on[0]["weight"] == on[1]["weight"], on
    assert [{k: v for k, v in r.items() if k != "checks"} for r in on] == [
        {k: v for k, v in r.items() if k != "checks"} for r in off
    ], oracle.side_by_side("state on", on) + "\n" + oracle.side_by_side("state off", off)
    assert all(isinstance(r["pg_seq"], int) and r["pg_seq"] > 0 for r in off), off
    assert [a["checks"] - b["checks"] for a, b in zip(on, off)] == [6, 6], oracle.side_by_side(
        "checks on - off", [a["checks"] - b["checks"] for a, b in zip(on, off)]
    )


# --- the option and the comparison, without a world ---------------------------------------------------------


@pytest.mark.parametrize("state", ["yes", (), ("",), ("param.", 3), None])
def test_a_state_option_that_is_not_true_false_or_field_prefixes_is_refused_naming_it(state):
    with pytest.raises(ValueError, match=re.escape(f"CollectiveGuard(state={state!r})")):
        CollectiveGuard(state=state)


def test_a_guard_crosses_a_pickle_with_its_state_option():
    copy = pickle.loads(pickle.dumps(CollectiveGuard(timeout=7, state=("optimizer",))))
    assert (copy.state, copy._state_fields) == (("optimizer",), ("optimizer",))


def _record(fields: dict) -> dict:
    return {"boundary": "train_epoch_end", "hook": "on_train_epoch_end", "step": 4, "epoch": 0, "fields": fields}


def test_digests_that_differ_only_by_a_field_one_rank_lacks_are_no_divergence():
    """The ranks' digests differ, but the contract's comparison counts a field missing on a rank as no
    difference (ddpprobe/contract/_compare.py ``differs``): the check passes (``diverged`` gives None)."""
    entries = [
        _state.entry(3, 0, _record({"optimizer[0].group[0].lr": 0.1, "module.attr.x": 1})),
        _state.entry(3, 1, _record({"optimizer[0].group[0].lr": 0.1})),
    ]
    assert entries[0]["id"] != entries[1]["id"], entries
    assert _state.same_check(entries) and _state.diverged("head", 3, entries) is None


def test_only_the_fields_that_must_be_equal_at_the_boundary_are_compared_there():
    """A module attribute must be equal at the start, not after batches ran (it may hold rank-local outputs); a
    callback's counters may always differ; the optimizer's settings must be equal everywhere."""
    state = {"module.attr.outputs": {"type": "list", "len": 3}, LR: 0.1, "callback.EarlyStopping.wait_count": 2}
    assert _state.must_be_equal(state, "train_epoch_end") == {LR: 0.1}
    assert _state.must_be_equal(state, "start") == {"module.attr.outputs": {"type": "list", "len": 3}, LR: 0.1}


# --- the small fields at every step ------------------------------------------------------------------------------


def test_a_learning_rate_halved_on_rank_0_at_an_epochs_start_is_named_at_the_next_optimizer_step(failed_world):
    """A ``@rank_zero_only`` helper halves rank 0's rate in ``on_train_epoch_start`` of epoch 1 (4 batches a rank
    and epoch). The optimizer's settings ride on every training batch's end check, so both ranks raise at the end
    of epoch 1's first batch, its optimizer step being step 4 + 1 = 5, naming the two rates, not at the epoch's
    end (step 8) after 4 steps apart. Live: the world run now."""
    from tests.support.guard_forms import lr_halved_on_rank_zero

    steps_per_epoch = 32 // 4 // 2
    for message in _diverged(failed_world, lr_halved_on_rank_zero, live=True).values():
        assert _where(message) == ("train_batch_end", "on_train_batch_end", 1, steps_per_epoch + 1), message
        assert _fields(message) == {LR: {0: "0.05", 1: "0.1"}}, message
        _contract_and_no_fix(message, "optimizer settings", [LR])


@pytest.mark.parametrize(
    "state, step",
    [
        (True, _state.STEP_FIELDS),
        (("optimizer",), ("optimizer",)),
        (("optimizer[0].group[0].lr",), ("optimizer[0].group[0].lr",)),
        (
            ("trainer.",),
            ("trainer.global_step", "trainer.current_epoch", "trainer.should_stop", "trainer.accumulate_grad_batches"),
        ),
        (("param.", "buffer."), ()),
        (False, ()),
    ],
)
def test_the_fields_checked_at_every_step_are_the_small_ones_the_state_option_covers(state, step):
    assert _state.step_fields(_state.fields_option(state)) == step
