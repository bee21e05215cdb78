"""The guard's sentence of what would happen (ddpprobe/guard/_entries.py ``consequence``) follows from the two
sides' recorded fields: what each side's collective carries (a logged key, a metric's states, a gradient
bucket, the data given to a library call), whether the collective carries data or is a barrier, and whether
the sides' dtypes and shapes agree. Pure Python: the entries are built as a rank posts them.
"""

import itertools

import pytest

from ddpprobe.guard import _entries

pytestmark = pytest.mark.not_a_fact("tests the words of the guard's errors, not a fact about DDP")

KEY_MIX = "The values of different keys would be reduced together"
PG_TIMEOUT_S = 10.0


def _post(rank: int, **fields) -> dict:
    """The entry ``rank`` posts before a collective described by ``fields`` (as the trace records them)."""
    return _entries.collective(3, rank, {"dtype": "float32", "shape": [], "group_size": 2, "root": None, **fields})


def _log(rank, key, op="all_reduce", **more):
    """A ``self.log(key, ..., sync_dist=True)`` sync logged in validation_step."""
    return _post(rank, op=op, source="self.log", key=key, hook="validation_step", sync="epoch", **more)


def _metric(rank, op="all_gather", **more):
    """``MeanMetric.compute()``'s state sync, called at the user's line."""
    return _post(
        rank,
        op=op,
        source="torchmetrics",
        metric="MeanMetric",
        call="MeanMetric.compute",
        call_kind="method",
        call_site="m.py:30 in on_validation_epoch_end",
        **more,
    )


def _loop_sync(rank, key, op="all_gather", **more):
    """The epoch sync of ``key`` that Lightning's loop runs on its own."""
    return _post(
        rank,
        op=op,
        source="self.log",
        key=key,
        hook="training_step",
        sync="epoch",
        loop_step="_FitLoop.on_advance_end",
        call_site="m.py:12 in training_step",
        **more,
    )


def _reduce(rank, **more):
    """``self.trainer.strategy.reduce(x)`` at the user's line."""
    more = {"op": "all_reduce", **more}
    return _post(
        rank,
        source="user",
        call="DDPStrategy.reduce",
        call_kind="method",
        call_site="m.py:20 in validation_step",
        **more,
    )


def _bucket(rank, bucket=0, **more):
    """DistributedDataParallel's gradient all_reduce of ``bucket`` (the comm hook's)."""
    more = {"shape": [6], **more}
    return _post(
        rank,
        op="all_reduce",
        source="gradient",
        bucket=bucket,
        loop_step="_AutomaticOptimization.backward_fn",
        running="backward",
        **more,
    )


def _said(pair: list) -> str:
    return _entries.consequence(pair, PG_TIMEOUT_S).splitlines()[0]


def test_two_self_log_syncs_of_different_keys_say_the_keys_values_are_reduced_together_and_nothing_raises():
    """Rank 0 syncs ``a``, rank 1 ``b``, one all_reduce of one scalar each: the keys' values are mixed and
    nothing raises (the same dtype and shape)."""
    said = _said([_log(0, "a"), _log(1, "b")])
    assert said.startswith(KEY_MIX), said
    assert said.endswith("every key would hold a mix of the ranks' values, and nothing would raise."), said


def test_at_the_barrier_of_two_self_log_syncs_the_reduction_comes_after_it_and_no_claim_is_made_on_raising():
    """A barrier carries no data: the keys' values meet in the all_reduce after it (Lightning's ``_sync_ddp``),
    whose dtypes the barrier's entries do not show, so the sentence does not say that nothing raises."""
    said = _said(
        [_log(0, "a", op="barrier", dtype=None, shape=None), _log(1, "b", op="barrier", dtype=None, shape=None)]
    )
    assert said.startswith(KEY_MIX + " after this barrier"), said
    assert "raise" not in said, said


def test_different_keys_of_different_shapes_say_the_backend_aborts_not_that_nothing_raises():
    said = _said([_log(0, "a", op="all_gather", shape=[2]), _log(1, "b", op="all_gather", shape=[3])])
    assert said.startswith("The ranks would contribute tensors of different dtypes or shapes"), said
    assert "nothing would raise" not in said and KEY_MIX not in said, said


def test_a_metric_state_sync_against_a_loop_sync_names_the_metric_and_the_key_not_different_keys():
    """``MeanMetric.compute()`` on rank 0, Lightning's epoch sync of ``v`` on rank 1, both an all_gather of
    one float32 scalar: unrelated values, one metric's states with one key's value; no sentence about
    keys."""
    said = _said([_metric(0), _loop_sync(1, "v")])
    assert KEY_MIX not in said and "different keys" not in said, said
    assert said.startswith("The ranks would all_gather unrelated values together"), said
    assert "MeanMetric's states on rank 0 with the value logged as 'v' in training_step on rank 1" in said, said
    assert said.endswith("and nothing would raise."), said


def test_a_strategy_reduce_against_a_self_log_sync_names_the_call_and_the_key_not_different_keys():
    said = _said([_reduce(0), _log(1, "v")])
    assert KEY_MIX not in said and "different keys" not in said, said
    assert (
        "the data given to `DDPStrategy.reduce()` on rank 0 with the value logged as 'v' in validation_step on rank 1"
        in said
    ), said


def test_a_gradient_bucket_against_a_hook_boundary_says_the_rank_would_wait_alone_in_that_buckets_all_reduce():
    boundary = _entries.boundary(3, 1, "on_train_batch_end", 0, 2, 0, None)
    said = _said([_bucket(0), boundary])
    assert said.startswith(
        "rank 0 would wait in a collective the other ranks do not call (an all_reduce of the gradients of bucket 0)"
    ), said


def test_two_gradient_buckets_say_one_buckets_gradients_would_go_to_another():
    said = _said([_bucket(0, 0), _bucket(1, 1)])
    assert said.startswith("Different gradient buckets would be reduced together"), said
    assert "the gradients of bucket 0 on rank 0 with the gradients of bucket 1 on rank 1" in said, said


SIDES = {
    "self.log a": lambda r: _log(r, "a"),
    "self.log b": lambda r: _log(r, "b"),
    "self.log a, loop": lambda r: _loop_sync(r, "a", op="all_reduce"),
    "metric": lambda r: _metric(r, op="all_reduce"),
    "reduce": _reduce,
    "bucket 0": lambda r: _bucket(r, 0, shape=[]),
    "bucket 1": lambda r: _bucket(r, 1, shape=[]),
    "user": lambda r: _post(r, op="all_reduce", source="user", call_site="m.py:9 in validation_step"),
}


@pytest.mark.parametrize("one, other", list(itertools.combinations(SIDES, 2)))
def test_the_sentence_follows_from_what_each_side_carries(one, other):
    """Over every pairing of sides making one all_reduce of one float32 scalar: the sentence speaks of
    different keys exactly when both sides are ``self.log`` syncs of different keys, of gradient buckets
    exactly when both are buckets, always says that nothing raises (same dtype and shape), and otherwise
    names what each side carries."""
    pair = [SIDES[one](0), SIDES[other](1)]
    said = _said(pair)
    both_keys = all(e["fields"]["source"] == "self.log" for e in pair)
    keys_differ = both_keys and pair[0]["fields"]["key"] != pair[1]["fields"]["key"]
    assert (KEY_MIX in said) == keys_differ, said
    assert ("gradient buckets" in said) == all(e["fields"]["source"] == "gradient" for e in pair), said
    assert said.endswith(", and nothing would raise."), said
    if not both_keys:
        carried = [_entries._carries(e["fields"]) for e in pair]
        assert f"{carried[0]} on rank 0 with {carried[1]} on rank 1" in said, said
