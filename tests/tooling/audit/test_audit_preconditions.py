"""Every sentence the fidelity work added is refused where its precondition fails: each function that words one is
called here, in this process, on evidence that misses exactly the precondition, and says nothing (or leaves the row
as it was). Pure Python on hand-written evidence: no world starts.

The sentences and their preconditions:

- the references' notes (ddpprobe/audit/report/_format.py ``_references_lines``): the single process raised and a
  one-rank DDP world did not; or the W=N ranks raised and a one-rank DDP world ran; the batch-size clause
  (``_batch_text``) only where the raising rank's batch size is one no batch of one process had;
- the files' clauses (ddpprobe/audit/causes/_files.py): "outside the working folder" only for a path that is not
  ``./<relative>``; "keys that all start with 'module.'" only where one process's keys do not;
- the contract's clauses (ddpprobe/audit/causes/_contract.py): a hook some ranks never run only where the ranks that
  set the field set it in that hook and the others did not; a monitored key only where a row says it is rank-local;
  a schedule following the step count only where the ranks' last rate is one process's at as many steps and one
  process ends elsewhere;
- the arithmetic causes (ddpprobe/audit/causes/_differs.py): shares of one sum only where the ranks' values add up
  to one process's; a sum of whole values only for ``reduce_fx="sum"`` where every rank's own value is one
  process's and a collective of the module's own in the key's hook made it so;
- the proofs (ddpprobe/audit/causes/_proven.py): a verdict changes only on a proving run's value.
"""

from __future__ import annotations

import pytest

from ddpprobe.audit import RANK_DIVERGENT, SYNCED_DIFFERS, SYNCED_EQUAL, KeyRow
from ddpprobe.audit.causes import _contract, _differs, _files, _proven
from ddpprobe.audit.report import _format


class _Result:
    """The fields ``_references_lines`` reads of an ``AuditResult``."""

    def __init__(self, references: dict, raised_world: list, world_size: int = 2):
        self.references = references
        self.raised = {"single": None, "world": raised_world}
        self.world_size = world_size


RAISED = {"type": "ValueError", "message": "boom"}


@pytest.mark.parametrize(
    "references, raised_world",
    [
        ({"compared_with": "single process", "single_process_raised": None, "one_rank_ddp": None}, [None, None]),
        # the single process raised but no one-rank DDP world ran it: no note saying the values were compared with one
        ({"compared_with": "single process", "single_process_raised": RAISED, "one_rank_ddp": None}, [None, None]),
        # the W=N ranks raised but no one-rank DDP world ran
        ({"compared_with": "single process", "single_process_raised": None, "one_rank_ddp": None}, [RAISED, None]),
    ],
    ids=["nothing raised", "no second reference for the single process", "no second reference for the ranks"],
)
def test_no_reference_note_without_the_runs_it_speaks_of(references, raised_world):
    assert _format._references_lines(_Result(references, raised_world)) == []


def test_the_batch_clause_needs_a_size_no_batch_of_one_process_had():
    held = [{"rank": 0, "stage": "train", "size": 2, "single_sizes": [2, 4]}]
    assert _format._batch_text(held) == ""
    assert _format._batch_text([{**held[0], "single_sizes": []}]) == ""
    assert "a train batch of 1 sample(s)" in _format._batch_text([{**held[0], "size": 1}])


def test_the_files_clauses_need_a_path_outside_and_keys_only_the_ranks_prefix():
    inside = {"key": "./preds.csv"}
    assert _files._outside_text(inside) == ""
    assert "outside the audit's working folder" in _files._outside_text({"key": "/data/preds.csv"})
    both_prefixed = {
        "single": {"saved": [["module.w", [1]]]},
        "per_rank": [{"saved": [["module.w", [1]]]}],
    }
    assert _files._wrapped_text(both_prefixed) == ""
    neither = {"single": {"saved": [["w", [1]]]}, "per_rank": [{"saved": [["w", [1]]]}]}
    assert _files._wrapped_text(neither) == ""
    assert "module." in _files._wrapped_text({"single": neither["single"], "per_rank": both_prefixed["per_rank"]})


def test_the_hook_clause_needs_the_field_set_in_that_hook_on_some_ranks_only():
    site = "m.py:3 in prepare_data"
    assert _contract._set_in_a_hook_some_ranks_run([site, site]) == ""  # every rank set it
    assert _contract._set_in_a_hook_some_ranks_run(["m.py:3 in setup", None]) == ""  # a hook every rank runs
    assert _contract._set_in_a_hook_some_ranks_run([None, None]) == ""
    assert "it is set in prepare_data" in _contract._set_in_a_hook_some_ranks_run([site, None])


def _row(**fields) -> KeyRow:
    base = dict(
        key="val_x",
        hooks=["validation_step"],
        on_step=False,
        on_epoch=True,
        sync_dist=True,
        reduce_fx="mean",
        metric_object=False,
        single=0.25,
        per_rank=[0.25, 0.25],
        logged_on=[0, 1],
        verdict=SYNCED_EQUAL,
        cause="",
        problem=False,
    )
    base.update(fields)
    return KeyRow(**base)


def test_the_monitored_key_clause_needs_a_row_that_says_the_key_is_rank_local():
    breaks = {"breaks": [{"field": "optimizer[0].group[0].lr"}]}
    states = [{"fields": {"scheduler[0].monitor": "val_x"}}]
    synced = [_row()]
    assert "fed_by" not in _contract.fed_by_monitored_keys(breaks, states, synced)["breaks"][0]
    local = [_row(verdict=RANK_DIVERGENT, problem=True, sync_dist=False, per_rank=[0.0, 0.5])]
    other_field = {"breaks": [{"field": "param.layer.weight"}]}
    assert "fed_by" not in _contract.fed_by_monitored_keys(other_field, states, local)["breaks"][0]
    assert _contract.fed_by_monitored_keys(breaks, states, local)["breaks"][0]["fed_by"]["key"] == "val_x"


def _schedule_states(rates: list) -> list:
    return [
        {
            "boundary": "train_batch_end",
            "fields": {
                "scheduler[0].interval": "step",
                "scheduler[0].last_epoch": step,
                "scheduler[0]._last_lr": [rate],
            },
        }
        for step, rate in enumerate(rates, start=1)
    ]


def test_the_schedule_clause_needs_the_ranks_rate_to_be_one_process_s_at_as_many_steps_and_its_end_elsewhere():
    one = _schedule_states([0.075, 0.05, 0.025, 0.0])
    assert _contract.schedules_by_step_count(one, _schedule_states([0.05, 0.0])) == []  # sized by the rank's steps
    assert _contract.schedules_by_step_count(one, _schedule_states([0.075, 0.05])) != []
    flat = _schedule_states([0.1, 0.1, 0.1, 0.1])
    assert _contract.schedules_by_step_count(flat, _schedule_states([0.1, 0.1])) == []  # both end alike


def _case(values: list, single: float, measured: float, reduce_fx: str = "mean", sizes=(1, 1)) -> _differs._Case:
    calls = [{"reduce_fx": reduce_fx, "sync_dist": True, "metric_object": False, "hook": "on_validation_epoch_end"}]
    logs = [
        [{"key": "val_x", "value": v, "batch_size": n, "on_epoch": True, "on_step": False}]
        for v, n in zip(values, sizes)
    ]
    return _differs._Case("val_x", calls, measured, single, logs, [], None, len(values), 1e-5, 1e-6, {})


def test_the_arithmetic_causes_need_their_arithmetic():
    assert _differs._rank_shares(_case([0.375, 0.125], 0.6, 0.25)) is None  # they do not add up to one process's
    assert _differs._rank_shares(_case([0.375, 0.125], 0.5, 0.25)) is not None
    assert _differs._already_whole(_case([19.0, 19.0], 19.0, 38.0, reduce_fx="mean")) is None  # not a sum sync
    assert _differs._already_whole(_case([19.0, 10.0], 19.0, 29.0, reduce_fx="sum")) is None  # a rank's own part
    assert _differs._already_whole(_case([19.0, 19.0], 19.0, 38.0, reduce_fx="sum")) is None  # no own collective
    whole = _case([19.0, 19.0], 19.0, 38.0, reduce_fx="sum")
    gathered = {"source": "user", "hook": "validation_step", "op": "all_gather", "call_site": "m.py:3"}
    whole.collectives, whole.hooks = [[gathered], [gathered]], ["validation_step"]
    assert _differs._already_whole(whole) is not None


class _Ins:
    """The fields the proofs read of the verdicts' inputs."""

    def __init__(self, counts=None):
        self.counts = counts or {}
        self.stage = "validate"

    def close(self, a, b) -> bool:
        return abs(a - b) <= 1e-6 + 1e-5 * abs(b)


def test_a_verdict_changes_only_on_a_proving_runs_value():
    equal = _row(verdict=SYNCED_EQUAL)
    assert _proven.proven(equal, _Ins(), None, _proven.Proof()) == equal  # no second split ran
    moved = _proven.proven(equal, _Ins(), None, _proven.Proof(partition=[{"val_x": 0.2}, {"val_x": 0.2}]))
    assert moved.verdict == SYNCED_DIFFERS and moved.hazards == ["non_decomposable"]
    held = _proven.proven(equal, _Ins(), None, _proven.Proof(partition=[{"val_x": 0.25}, {"val_x": 0.25}]))
    assert held.verdict == SYNCED_EQUAL and "second split" in held.cause
    differs = _row(verdict=SYNCED_DIFFERS, per_rank=[0.5, 0.5], single=4 / 7, problem=True)
    assert _proven.proven(differs, _Ins(), None, _proven.Proof()) == differs  # no padded run: no padding claim


def test_a_torch_save_digest_tells_zero_dimensional_tensors_apart_and_an_unreadable_one_proves_no_equality():
    """Two ranks saving their own 0-d accuracy to one path: the digests differ (a 0-d tensor is read as its bytes),
    so the file is not "what one process writes"; a digest that could not be taken never makes contents equal."""
    import torch

    from ddpprobe.audit.evidence import _files as evidence_files
    from ddpprobe.trace._files import saved_content

    assert saved_content(torch.tensor(0.5))["sha1"] != saved_content(torch.tensor(0.25))["sha1"]
    assert not saved_content(torch.tensor(0.5))["sha1"].startswith("unreadable")
    assert evidence_files._unreadable([{"sha1": "unreadable: RuntimeError"}, {"sha1": "ab"}])
    assert not evidence_files._unreadable([{"sha1": "ab"}])
