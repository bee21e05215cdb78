"""Every compared field that differs between the ranks' entries (``_entries.COLLECTIVE_ID``) is named in each
side's words, and the fix lines name a registry entry only where the mismatch is of that entry's kind (its op
and the field that differs): otherwise they say that no proven fix applies, with the differing fields as
evidence. Pure Python: the entries are built as a rank posts them.
"""

import pytest

from ddpprobe.guard import _entries
from ddpprobe.hazards import NO_FIX

pytestmark = pytest.mark.not_a_fact("tests the words of the guard's errors, not a fact about DDP")


def _post(rank: int, **fields) -> dict:
    """The entry ``rank`` posts before ``torch.distributed.<op>`` of a float32 [2] at the user's line."""
    base = {"op": "all_reduce", "dtype": "float32", "shape": [2], "group_size": 2, "root": None}
    return _entries.collective(3, rank, {**base, "source": "user", "call_site": "m.py:20 in validation_step", **fields})


def _bucket(rank: int, bucket: int) -> dict:
    return _entries.collective(
        3,
        rank,
        {"op": "all_reduce", "dtype": "float32", "shape": [6], "group_size": 2, "source": "gradient", "bucket": bucket},
    )


def _lines(entries: list) -> list:
    return _entries.sides_text(entries).splitlines()


def test_a_reduce_op_difference_is_named_on_each_side_so_the_two_sides_never_read_alike():
    """Rank 0 all_reduce SUM, rank 1 MAX of float32 [2]: two side lines, each naming its own reduce op."""
    lines = _lines([_post(0, reduce_op="SUM"), _post(1, reduce_op="MAX")])
    assert len(lines) == 2, lines
    assert lines[0].startswith("  rank 0 ") and "reduce op SUM" in lines[0] and "MAX" not in lines[0], lines
    assert lines[1].startswith("  rank 1 ") and "reduce op MAX" in lines[1] and "SUM" not in lines[1], lines


def test_a_source_rank_difference_is_named_on_each_side():
    """Rank 0 broadcasts from src=0, rank 1 from src=1: each side names its own source rank."""
    lines = _lines([_post(0, op="broadcast", root="src=0"), _post(1, op="broadcast", root="src=1")])
    assert len(lines) == 2, lines
    assert "src=0" in lines[0] and "src=1" not in lines[0], lines
    assert "src=1" in lines[1] and "src=0" not in lines[1], lines


def test_equal_entries_add_no_field_words():
    """Fields are added only where they differ: equal ranks are one line, as posted."""
    entries = [_post(0, reduce_op="SUM"), _post(1, reduce_op="SUM")]
    assert _lines(entries) == [f"  ranks 0, 1 are {entries[0]['text'][3:]}"]


def test_the_guard_error_sides_carry_the_differing_field():
    """``GuardError.sides`` (the ranks' texts) are the completed texts too."""
    texts = _entries.side_texts([_post(0, reduce_op="SUM"), _post(1, reduce_op="MAX")])
    assert texts[0] != texts[1] and texts[0].endswith("reduce op SUM") and texts[1].endswith("reduce op MAX")


def _fix_lines(entries: list) -> list:
    """The fix lines of the guard's sentence (after what would happen and the entry's cause line, if any)."""
    return [line for line in _entries.consequence(entries, 10.0).splitlines()[1:] if not line.startswith("Cause (")]


def test_a_reduce_op_mismatch_names_no_gather_entry_and_shows_the_reduce_ops_as_evidence():
    """An all_reduce whose reduce op differs is no all_gather of different shapes: the fix line names no
    entry and shows the reduce ops per rank, not equal shapes."""
    lines = _fix_lines([_post(0, reduce_op="SUM"), _post(1, reduce_op="MAX")])
    assert lines == [f"{NO_FIX}; evidence: reduce op per rank ['SUM', 'MAX']"], lines


def test_two_gradient_buckets_differing_only_in_index_show_the_buckets_as_evidence():
    lines = _fix_lines([_bucket(0, 0), _bucket(1, 1)])
    assert lines == [f"{NO_FIX}; evidence: bucket per rank [0, 1]"], lines


def test_an_all_gather_of_different_shapes_still_gets_the_gather_fix():
    """The near miss's own kind (all_gather, shapes differ) keeps its proven fix."""
    lines = _fix_lines([_post(0, op="all_gather", shape=[2]), _post(1, op="all_gather", shape=[3])])
    assert len(lines) == 1 and lines[0].startswith("Fix: pad each rank's tensor"), lines


def test_a_step_sync_paired_with_an_epoch_sync_of_one_key_differs_in_the_guard_as_in_the_audit():
    """``sync`` is part of what must match (ddpprobe/hazards/_match.py): rank 0's step sync of ``v`` and rank 1's
    epoch sync of ``v`` are the same all_reduce of the same key, and still differ; each side names its own."""
    sides = [
        _entries.collective(3, r, {"op": "all_reduce", "dtype": "float32", "shape": [], "group_size": 2,
                                   "source": "self.log", "key": "v", "hook": "validation_step", "sync": sync})
        for r, sync in enumerate(("step", "epoch"))
    ]  # fmt: skip
    assert _entries.differing(sides) == {"sync": ["step", "epoch"]}
    lines = _lines(sides)
    assert len(lines) == 2 and "step" in lines[0] and "epoch" in lines[1], lines
