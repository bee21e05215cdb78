"""A logged value explained by arithmetic (ddpprobe/audit/evidence/_arithmetic.py): the relation of the ranks' recorded
values that reproduces a value that differs from single-process or between the ranks, named with the collective
that made it. Tested on numbers written by hand and on modules written for it
(tests/support/contract_modules.py): a validation error all-reduced with MAX where a mean was meant, and a count
logged without a sync. A key that equals single-process gets no such sentence."""

import pytest

from ddpprobe.audit.evidence import _arithmetic
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit's arithmetic explanations, not a fact about DDP")

M = "tests.support.contract_modules"


def _audit(model: str):
    return audited(f"{M}:{model}", f"{M}:make_data", world_size=2, timeout=60.0)


@pytest.mark.parametrize(
    "target, values, weights, first",
    [
        (2.0, [1.0, 3.0], None, "mean"),
        (2.5, [1.0, 3.0], [1, 3], "weighted mean"),
        (4.0, [1.0, 3.0], None, "sum"),
        (3.0, [1.0, 3.0], None, "max"),
        (1.0, [1.0, 3.0], None, "min"),
    ],
)
def test_each_relation_is_found_first_where_it_alone_gives_the_value(target, values, weights, first):
    assert _arithmetic.relations(target, values, weights)[0] == first


def test_a_value_no_relation_gives_is_not_explained_and_one_ranks_value_is_named():
    assert _arithmetic.relations(7.0, [1.0, 3.0]) == []
    assert _arithmetic.relations(1.5, [1.5, 2.5, 0.7]) == ["rank 0's value"]
    assert _arithmetic.relations(1.0, [1.0, None]) == []


def test_own_epoch_values_weight_each_ranks_batches_by_their_size():
    logs = [
        [{"key": "k", "value": 1.0, "batch_size": 1}, {"key": "k", "value": 4.0, "batch_size": 3}],
        [{"key": "k", "value": 2.0, "batch_size": 2}, {"key": "other", "value": 9.0, "batch_size": 2}],
    ]
    assert _arithmetic.own_epoch_values(logs, "k") == ([3.25, 2.0], [4, 2])
    assert _arithmetic.own_epoch_values(logs, "k", "max") == ([4.0, 2.0], [4, 2])


def test_a_max_all_reduce_where_a_mean_was_meant_is_named_with_its_inputs_and_their_mean():
    result = _audit("make_max_reduced_error")

    row = result.row("val_mae")
    text = " ".join(row.cause.split())
    assert "is what all_reduce MAX at contract_modules.py:" in text and "the max of the ranks' inputs" in text
    assert f"their mean is {row.single:.6g}" in text, text


def test_a_count_logged_without_a_sync_is_the_sum_of_the_ranks_values_at_single_process():
    result = _audit("make_unsynced_count")

    row = result.row("val_samples")
    assert row.per_rank == [8.0, 8.0] and row.single == 16.0
    assert "the single-process 16 is the sum of the ranks' values [8, 8]" in " ".join(row.cause.split())


def test_a_key_equal_to_single_process_gets_no_arithmetic():
    """The count logged with ``sync_dist=True, reduce_fx="sum"``: 16 on every rank, as at W=1; nothing to explain."""
    row = _audit("make_synced_count").row("val_samples")
    assert row.per_rank == [16.0, 16.0] and row.single == 16.0 and not row.problem, row
    assert " is the " not in (row.cause or ""), row.cause
