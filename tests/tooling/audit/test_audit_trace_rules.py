"""The audit's rules on recorded evidence, without launching a world: how per-rank traces become counts
and a first divergence (ddpprobe/audit/evidence/), and how the recomputed synced mean names the
floored-count bug (ddpprobe/audit/causes/_verdict.py). The events are written by hand in the format of
ddpprobe/trace/."""

import pytest

from ddpprobe import audit as ddp_audit
from ddpprobe.audit import FLOORED_COUNT_ISSUE
from ddpprobe.audit.causes import _verdict
from ddpprobe.audit.evidence import _counts
from ddpprobe.audit.evidence._keys import Reference
from ddpprobe.audit.evidence._sequences import first_divergence, sequence
from ddpprobe.audit.worlds._worlds import Worlds
from ddpprobe.trace import split_trace

pytestmark = pytest.mark.not_a_fact("tests the audit's rules, not a fact about DDP")


def _rank(collectives=(), batches=(), stage="end"):
    events = []
    for seq, (op, shape, key, status) in enumerate(collectives):
        events.append(
            {
                "event": "collective",
                "seq": seq,
                "op": op,
                "dtype": "float32",
                "shape": shape,
                "key": key,
                "source": "self.log" if key else "library",
                "hook": "validation_step",
                "call_site": None,
            }
        )
        if status != "pending":
            events.append({"event": status, "seq": seq})
    for i, ids in enumerate(batches):
        events.append({"event": "batch", "stage": "val", "batch_idx": i, "size": len(ids), "ids": list(ids)})
    events.append({"event": "stage", "status": stage})
    return split_trace(events)


def test_a_collective_one_rank_never_enters_is_the_first_divergence_naming_who_waits():
    ranks = [
        _rank([("all_reduce", [], "a", "done"), ("all_reduce", [], "a", "pending")], stage=None),
        _rank([("all_reduce", [], "a", "done")]),
    ]
    found = first_divergence([sequence(r, False) for r in ranks], [r["stage"] for r in ranks])
    assert (found["kind"], found["index"], found["ranks"], found["absent"]) == ("missing", 1, [0], [1])
    assert "rank(s) [0] waited there" in found["message"] and "its stage finished" in found["message"]


def test_the_same_all_reduce_under_different_keys_is_a_divergence_and_a_shape_mismatch_is_another():
    same = ("all_reduce", [], "a", "done")
    keys = [_rank([same, same]), _rank([same, ("all_reduce", [], "b", "done")])]
    shapes = [_rank([same, same]), _rank([same, ("all_reduce", [3], "a", "done")])]
    for ranks, kind in ((keys, "keys"), (shapes, "mismatch")):
        found = first_divergence([sequence(r, False) for r in ranks], ["end", "end"])
        assert (found["kind"], found["index"], found["ranks"], found["absent"]) == (kind, 1, [0, 1], []), found
    same = [_rank([("all_reduce", [], "a", "done")])] * 2
    assert first_divergence([sequence(r, False) for r in same], ["end", "end"]) is None


def test_a_step_sync_paired_with_an_epoch_sync_of_the_same_key_is_a_divergence_of_purpose():
    """Rank 0's third step sync of ``v`` and rank 1's epoch sync of ``v``: the same float32 all_reduce, the
    same key, two purposes; the divergence says which paired with which."""
    ranks = [_rank([("all_reduce", [], "v", "done")] * 3), _rank([("all_reduce", [], "v", "done")] * 3)]
    for r, levels in enumerate((["step", "step", "step"], ["step", "step", "epoch"])):
        for entry, level in zip(ranks[r]["collectives"], levels):
            entry["sync"] = level
    found = first_divergence([sequence(r, False) for r in ranks], ["end", "end"])
    assert (found["kind"], found["index"], found["ranks"]) == ("purpose", 2, [0, 1]), found
    assert "rank 0's all_reduce float32 [] (self.log step sync of 'v'" in found["message"], found["message"]
    assert "paired with rank 1's all_reduce float32 [] (self.log epoch sync of 'v'" in found["message"]


def _user_calls(rank: dict, fields: list) -> dict:
    for entry, extra in zip(rank["collectives"], fields):
        entry.update(source="user", key=None, **extra)
    return rank


def test_the_audit_compares_what_the_guard_compares_so_a_reduce_op_and_a_call_site_differ_too():
    """What must match at one position is one table (ddpprobe/hazards/_match.py) for the audit and the guard: an
    all_reduce SUM paired with MAX is a mismatch, and the user's own all_reduces from two lines in another order on
    each rank are a divergence of order, though op, dtype and shape agree."""
    from ddpprobe.guard import _entries
    from ddpprobe.hazards import _match

    assert _entries.COLLECTIVE_ID == _match.FIELDS
    call = ("all_reduce", [2], None, "done")
    ops = [_user_calls(_rank([call]), [{"reduce_op": op, "call_site": "m.py:9 in f"}]) for op in ("SUM", "MAX")]
    found = first_divergence([sequence(r, False) for r in ops], ["end", "end"])
    assert (found["kind"], found["index"]) == ("mismatch", 0), found
    lines = [{"call_site": "m.py:9 in f"}, {"call_site": "m.py:12 in f"}]
    order = [_user_calls(_rank([call, call]), lines), _user_calls(_rank([call, call]), lines[::-1])]
    found = first_divergence([sequence(r, False) for r in order], ["end", "end"])
    assert (found["kind"], found["index"], found["ranks"]) == ("order", 0, [0, 1]), found
    assert "m.py:9" in found["message"] and "m.py:12" in found["message"]
    same = [_user_calls(_rank([call, call]), lines) for _ in range(2)]
    assert first_divergence([sequence(r, False) for r in same], ["end", "end"]) is None


def test_counts_name_repeats_only_when_a_sample_ran_twice_and_unsharded_when_every_rank_ran_all():
    single = _rank(batches=[[0, 1, 2], [3, 4]])
    padded = _counts.counts([_rank(batches=[[0, 2], [4]]), _rank(batches=[[1, 3], [0]])], single, "val")
    uneven = _counts.counts([_rank(batches=[[0, 2], [4]]), _rank(batches=[[1, 3]])], single, "val")
    unsharded = _counts.counts([_rank(batches=[[0, 1, 2], [3, 4]])] * 2, single, "val")
    assert (padded.samples, padded.duplicates, padded.duplicated, padded.unsharded) == ([3, 3], 1, {"0": 2}, False)
    assert (uneven.samples, uneven.duplicates, uneven.missing_vs_single) == ([3, 2], 0, 0)
    assert unsharded.unsharded and unsharded.samples == [5, 5]


def test_a_sample_is_repeated_only_when_two_ranks_ran_it_in_the_same_run_of_the_loop():
    """The sanity check's batches (``sanity``) and each earlier epoch are counted apart: rank 0 ran ids 0, 2
    and rank 1 ids 1, 3 in each of two epochs, after a sanity check of ids 0 and 1: nothing repeats."""
    shards = [[0, 2], [1, 3]]

    def rank(r):
        events = [{"event": "batch", "stage": "val", "sanity": True, "epoch": 0, "size": 1, "ids": [r]}]
        for epoch in (0, 1):
            events.append({"event": "batch", "stage": "val", "epoch": epoch, "size": 2, "ids": shards[r]})
        return split_trace(events)

    found = _counts.counts([rank(0), rank(1)], None, "val")
    assert (found.samples, found.duplicates, found.epochs, found.sanity_batches) == ([2, 2], 0, [2, 2], [1, 1])


def test_the_floored_count_bug_is_named_only_when_the_recomputed_floored_mean_is_the_measured_value():
    """Batch means 1, 3 (sizes 2, 2) on rank 0 and 5 (size 1) on rank 1: the correct synced mean is
    (2 + 6 + 5) / 5 = 2.6; with the count floored, (13 / 2) / floor(5 / 2) = 3.25."""
    logs = [
        [
            {"key": "v", "on_epoch": True, "on_step": False, "value": 1.0, "batch_size": 2},
            {"key": "v", "on_epoch": True, "on_step": False, "value": 3.0, "batch_size": 2},
        ],
        [{"key": "v", "on_epoch": True, "on_step": False, "value": 5.0, "batch_size": 1}],
    ]
    calls = [{"hook": "validation_step", "reduce_fx": "mean", "sync_dist": True, "metric_object": False}]
    counts = _counts.counts(
        [_rank(batches=[[0, 1], [2, 3]]), _rank(batches=[[4]])], _rank(batches=[[0, 1, 2, 3, 4]]), "val"
    )
    cause, fixes, _ = _verdict.differs_cause("v", calls, 3.25, 2.6, logs, [], counts, 2, "validate", None, 1e-5, 1e-6)
    assert FLOORED_COUNT_ISSUE in cause and fixes == ["floored_count"], cause
    cause, _, _ = _verdict.differs_cause("v", calls, 3.0, 2.6, logs, [], counts, 2, "validate", None, 1e-5, 1e-6)
    assert cause.startswith("unknown") and FLOORED_COUNT_ISSUE not in cause, cause


def _record(name: str, hook: str, value: float) -> dict:
    call = {"name": name, "hook": hook, "on_step": False, "on_epoch": True, "sync_dist": True}
    call.update({"reduce_fx": "mean", "rank_zero_only": False, "metric_object": False, "calls": 1})
    return {"log_calls": [call], "callback_metrics": {name: value}}


def test_a_fit_compares_like_with_like_training_keys_of_weights_trained_apart_are_not_compared():
    """A ``fit`` whose W=1 and W=N weights differ: a validation key is compared with W=1 validating the W=N
    weights (equal here: synced, equals single-process), a training key with nothing (its W=1 value came
    from other weights: not a problem). With equal weights the training key is compared, and its cause
    does not blame the training."""
    world = [_record("val_v", "validation_step", 2.0), _record("val_v", "validation_step", 2.0)]
    for rec in world:
        rec["log_calls"] += _record("train_v", "training_step", 5.0)["log_calls"]
        rec["callback_metrics"]["train_v"] = 5.0
    single = _record("val_v", "validation_step", 1.0)
    single["log_calls"] += _record("train_v", "training_step", 4.0)["log_calls"]
    single["callback_metrics"]["train_v"] = 4.0
    apart = Reference(
        record=single, trained_apart=True, same_weights=_record("val_v", "validation_step", 2.0), steps=[4, 2]
    )
    rows = {row.key: row for row in _verdict.rows(Worlds.of_records(apart.record, world, "fit", reference=apart))}
    assert (rows["val_v"].verdict, rows["val_v"].single) == (_verdict.SYNCED_EQUAL, 2.0), rows["val_v"]
    assert rows["train_v"].verdict == _verdict.TRAINED_APART and not rows["train_v"].problem, rows["train_v"]
    assert "W=1 made 4 optimizer steps, W=2 2" in rows["train_v"].cause, rows["train_v"].cause
    same = Reference(record=single, weights_equal=True)
    train = {row.key: row for row in _verdict.rows(Worlds.of_records(single, world, "fit", reference=same))}["train_v"]
    assert train.verdict == _verdict.SYNCED_DIFFERS and "training at W ranks" not in train.cause, train.cause


def test_a_training_key_of_weights_trained_apart_that_the_ranks_disagree_on_is_judged_by_what_a_sync_gives():
    """Ranks 0 and 1 logged ``train_v`` 3 and 6 without ``sync_dist`` in a ``fit`` trained apart: rank-divergent,
    and the cause says what a sync of them gives (their mean, 4.5), comparing with no single-process value."""
    world = [_record("train_v", "training_step", 3.0), _record("train_v", "training_step", 6.0)]
    for rec in world:
        rec["log_calls"][0]["sync_dist"] = False
    apart = Reference(record=_record("train_v", "training_step", 1.0), trained_apart=True, steps=[4, 2])
    (row,) = _verdict.rows(Worlds.of_records(apart.record, world, "fit", reference=apart))
    assert (row.verdict, row.single) == (ddp_audit.RANK_DIVERGENT, None), row
    assert "a sync of the ranks' values (sync_dist=True, reduce_fx='mean') gives 4.5 on every rank" in row.cause
    assert "single-process" not in row.cause.replace("no single-process run", ""), row.cause
