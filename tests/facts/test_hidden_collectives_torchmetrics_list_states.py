"""torchmetrics list states when the ranks hold different amounts: what ``compute()`` gathers.

A state added with ``add_state(name, default=[], dist_reduce_fx=...)`` is synced at ``compute()`` by
``Metric._sync_dist``, one ``gather_all_tensors`` (a barrier, an all_gather of the shapes, an all_gather of
the zero-padded data) per tensor in the list:

- ``dist_reduce_fx="cat"``: a list of more than one tensor is first concatenated into one, and an empty
  list (a rank that never called ``update``) becomes one placeholder ``torch.tensor([], dtype=self.dtype)``
  (float32 unless the metric was cast). So every rank runs exactly one gather, whatever its number of
  updates, and gets every rank's entries concatenated in rank order. But the placeholder is float32:
  next to int64 entries on the other ranks the gathered byte counts differ and gloo aborts the empty
  rank (SIGABRT, "Received data size doesn't match expected size"); next to int32 entries (the same 4
  bytes per element) nothing fails and the empty rank reads the other ranks' integers *as float32 bit
  patterns* (denormals like 2.8e-43). ``BinaryAUROC(thresholds=None)`` keeps its int64 targets in such a
  state, so a rank that never updated it aborts; ``CatMetric`` casts what it is given to float32 (and
  skips empty updates), so integer ids are gathered as floats and an empty rank is harmless.
- ``dist_reduce_fx=None``: nothing is concatenated; the list is gathered entry by entry and the results
  flattened entry-major (every rank's entry 0, then every rank's entry 1, ...). With different numbers of
  entries, the ranks run different numbers of collectives: the ranks with the fewest finish with only
  the first ``k`` entries of every rank (the others' extra entries silently left out), and the ranks with
  more are left alone in a barrier and fail (gloo: the peers closed their connections).

The fixes: ``dist_reduce_fx="cat"`` for lists whose length differs between ranks; on a rank with nothing
to add, one ``update`` with empty tensors of the right dtypes (``torch.empty(0, dtype=torch.long)``).

Rank ``r``'s ``k``-th update appends ``list_item(r, k)``: ``k + 2`` entries ``100 * (r + 1) + 10 * k + j``.
The probe is ddpprobe/probes/hidden_collectives.py (``list_state``); expected values are built from
``list_item`` and, for the AUROC, scikit-learn's ``roc_auc_score``.
Sources: torchmetrics/metric.py ``Metric.add_state``, ``Metric._sync_dist``, ``Metric._wrap_compute``
(the "compute ... before the update" warning); torchmetrics/utilities/distributed.py
``gather_all_tensors``; torchmetrics/aggregation.py ``CatMetric.update``,
``BaseAggregator._cast_and_nan_check_input``; torchmetrics/classification/precision_recall_curve.py
``BinaryPrecisionRecallCurve.__init__`` (``preds``/``target`` list states, ``dist_reduce_fx="cat"``);
gloo/transport/tcp/pair.cc (the size check).
"""

import pytest
import torch
from sklearn.metrics import roc_auc_score

from ddpprobe import RankDied, RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hidden_collectives as hidden
from tests.support import gloo, oracle

PG_TIMEOUT_S, WORLD_TIMEOUT_S = 2, 20

#: torchmetrics' warning on a rank whose metric was never updated (``Metric._wrap_compute``).
NOT_UPDATED = "was called before the ``update`` method"

#: gloo's words when a block is larger than the receive buffer (gloo/transport/tcp/pair.cc).
SIZE_MISMATCH = "Received data size doesn't match expected size"


def _items(rank: int, count: int, dtype: str = "float32") -> list:
    """Rank ``rank``'s ``count`` items as lists."""
    return [hidden.list_item(rank, k, dtype).tolist() for k in range(count)]


def _concatenated(updates: list, dtype: str = "float32") -> list:
    return [v for rank, count in enumerate(updates) for item in _items(rank, count, dtype) for v in item]


def _not_updated_warnings(world) -> list:
    return [any(NOT_UPDATED in w["message"] for w in rec["warnings"]) for rec in world.records]


@pytest.mark.parametrize("updates", [[1, 2], [0, 2], [2, 0, 1], [1, 2, 3]], ids=["1-2", "0-2", "2-0-1", "1-2-3"])
def test_a_cat_list_state_is_concatenated_before_the_gather_so_every_rank_gets_every_entry_whatever_its_count(
    run_world, semantics, updates
):
    """``add_state("items", default=[], dist_reduce_fx="cat")``, rank ``r`` calling ``update``
    ``updates[r]`` times (0 included): one gather per rank, and every rank's ``compute()`` returns every
    rank's entries concatenated in rank order (float32). A rank that never updated contributes nothing;
    torchmetrics warns that ``compute`` ran before ``update`` with ``rank_zero_warn``, so only when that
    rank is global rank 0."""
    world_size = len(updates)
    world = run_world(hidden.list_state, world_size, metric="list_state", updates=updates, reduce="cat")

    expected = {"dtype": "float32", "values": [float(v) for v in _concatenated(updates)]}
    own = [sum(sum(item) for item in _items(r, c)) for r, c in enumerate(updates)]
    updated = [r for r, count in enumerate(updates) if count]
    own_sums = {f"rank{r}_own": own[r] for r in updated} if len(updated) > 1 else {}
    oracle.assert_distinct(every_rank=sum(own), nothing=0.0, **own_sums)
    got = [rec["computed"] for rec in world.records]
    semantics.number("entries on rank 0", len(got[0]["values"]), vs=("rank 0's own", len(_concatenated(updates[:1]))))
    assert got == [expected] * world_size, oracle.side_by_side("computed", got) + f"   expected {expected}"
    # rank_zero_warn: only global rank 0 warns, so an empty rank other than 0 gets no warning at all
    assert _not_updated_warnings(world) == [updates[0] == 0] + [False] * (world_size - 1)


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_list_state_without_dist_reduce_fx_is_gathered_entry_by_entry_and_flattened_entry_major(
    run_world, semantics, world_size
):
    """``dist_reduce_fx=None``, every rank updating twice: ``compute()`` returns a list of ``2 * W``
    tensors, in the order entry 0 of rank 0, 1, ..., then entry 1 of rank 0, 1, ... (not rank by rank)."""
    updates = [2] * world_size
    world = run_world(hidden.list_state, world_size, metric="list_state", updates=updates, reduce="none")

    entry_major = [_items(r, 2)[k] for k in range(2) for r in range(world_size)]
    rank_major = [item for r in range(world_size) for item in _items(r, 2)]
    assert entry_major != rank_major
    expected = {"list": [{"dtype": "float32", "values": [float(v) for v in item]} for item in entry_major]}
    got = [rec["computed"] for rec in world.records]
    semantics.number("entries on rank 0", len(got[0]["list"]), vs=("entries per rank", 2))
    assert got == [expected] * world_size, oracle.side_by_side("computed", got) + f"   expected {expected}"


@run_if(backend="gloo")  # asserts gloo's report of a peer that left
@pytest.mark.parametrize("updates", [[1, 2], [0, 2], [1, 2, 2]], ids=["1-2", "0-2", "1-2-2"])
def test_a_list_state_without_dist_reduce_fx_and_different_counts_drops_entries_on_the_fewest_and_fails_the_rest(
    run_world, semantics, updates
):
    """``dist_reduce_fx=None`` with ``updates[r]`` entries on rank ``r``: the ranks run one gather per
    entry, so the ranks with the fewest (``k``) finish after ``k`` gathers, with the first ``k`` entries
    of every rank, no error, and no ``UserWarning`` about the rest (a rank with none runs no collective
    and gets ``[]``, and, if it is rank 0, only torchmetrics' warning that ``compute`` ran before
    ``update``). The ranks with more enter a barrier nobody else enters; when the finished ranks leave, gloo
    fails them with ``RuntimeError`` ("Connection closed by peer"), from ``gather_all_tensors``. Which of
    them fails first is not determined (each notices the closed connections on its own), so the failed
    ranks are compared as a set; the finished ranks' records come with the error."""
    world_size, fewest = len(updates), min(updates)
    more = [r for r, count in enumerate(updates) if count > fewest]
    with pytest.raises(RankFailed) as failure:
        run_world(
            hidden.list_state,
            world_size,
            metric="list_state",
            updates=updates,
            reduce="none",
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )

    err = failure.value
    semantics.number("failed ranks", str(sorted(err.ranks)), vs=("ranks with more entries", str(more)))
    assert sorted(err.ranks) == more and set(err.exc_types.values()) == {"RuntimeError"}, f"{err.ranks}\n{err}"
    for rank in more:
        assert gloo.error_kind(err.rank_errors[rank]) == gloo.PEER_GONE, err.rank_errors[rank]
        assert "gather_all_tensors" in err.tracebacks[rank], err.tracebacks[rank]
        assert gloo.collective_in(err.tracebacks[rank]) == "barrier", err.tracebacks[rank]
    kept = [_items(r, fewest)[k] for k in range(fewest) for r in range(world_size)]
    expected = {"list": [{"dtype": "float32", "values": [float(v) for v in item]} for item in kept]}
    assert [r for r, rec in enumerate(err.records) if rec is None] == more, err.records
    finished = [rec for rec in err.records if rec is not None]
    assert len(_concatenated(updates)) > sum(len(item) for item in kept)  # entries really are left out
    assert [rec["computed"] for rec in finished] == [expected] * len(finished), oracle.side_by_side(
        "finished ranks computed", [rec["computed"] for rec in finished]
    )
    user_warnings = [[w["message"] for w in rec["warnings"] if w["category"] == "UserWarning"] for rec in finished]
    not_updated = [[NOT_UPDATED in m for m in messages] for messages in user_warnings]
    expected_warnings = [[True] if r == 0 and updates[0] == 0 else [] for r in range(world_size) if r not in more]
    assert not_updated == expected_warnings, oracle.side_by_side("UserWarnings on the finished ranks", user_warnings)


@run_if(backend="gloo")  # asserts gloo's size check
@pytest.mark.parametrize(
    "metric, updates",
    [("list_state", [0, 2]), ("list_state", [0, 2, 1]), ("binary_auroc", [0, 3]), ("binary_auroc", [0, 3, 1])],
    ids=["int64_list-0-2", "int64_list-0-2-1", "binary_auroc-0-3", "binary_auroc-0-3-1"],
)
def test_a_rank_that_never_updated_sends_a_float32_placeholder_and_is_aborted_when_the_others_hold_int64(
    run_world, semantics, metric, updates
):
    """A ``"cat"`` list state of int64 entries (a ``ListStateMetric`` of int64 items, or the ``target``
    state of ``BinaryAUROC(thresholds=None)``) with rank 0 never updated: its placeholder is float32 (4
    bytes per element), the others' padded blocks are int64 (8 bytes), so gloo's size check fails on rank
    0 ("Received data size doesn't match expected size") and aborts it (SIGABRT, exit code -6). ddpprobe
    reports ``RankDied`` naming rank 0, before the timeouts."""
    with pytest.raises(RankDied) as failure:
        run_world(
            hidden.list_state,
            len(updates),
            metric=metric,
            updates=updates,
            dtype="int64",
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )

    err = failure.value
    semantics.number("ranks that died", str(err.ranks), vs=("ranks that never updated", "[0]"))
    assert err.ranks == [0] and err.exitcodes == {0: -6}, f"{err.ranks} {err.exitcodes}\n{err}"
    assert SIZE_MISMATCH in err.rank_errors[0], err.rank_errors[0]
    # the size check, not a timeout: no timeout words in rank 0's report
    assert gloo.error_kind(err.rank_errors[0]) == gloo.SIZE_MISMATCH, err.rank_errors[0]


@pytest.mark.parametrize("updates", [[0, 2], [0, 2, 1]], ids=["0-2", "0-2-1"])
def test_a_rank_that_never_updated_reads_the_others_int32_entries_as_float32_bit_patterns(
    run_world, semantics, updates
):
    """The same with int32 entries (4 bytes, like the float32 placeholder): every collective completes,
    no error, and the ranks that updated get the right int32 entries while rank 0 gets a float32 tensor
    holding the same bytes: each integer ``i`` read as the float whose bits are ``i``
    (``torch.tensor(i, dtype=torch.int32).view(torch.float32)``, about ``i * 1.4e-45``)."""
    world_size = len(updates)
    world = run_world(hidden.list_state, world_size, metric="list_state", updates=updates, dtype="int32")

    ints = _concatenated(updates, "int32")
    as_float_bits = torch.tensor(ints, dtype=torch.int32).view(torch.float32).tolist()
    got = [rec["computed"] for rec in world.records]
    semantics.number("rank 0's first entry", got[0]["values"][0], vs=("the integer sent", ints[0]))
    assert got[0] == {"dtype": "float32", "values": as_float_bits}, f"rank 0 {got[0]}   ints {ints}"
    assert got[1:] == [{"dtype": "int32", "values": ints}] * (world_size - 1), oracle.side_by_side("computed", got)


@pytest.mark.parametrize("updates", [[0, 2], [0, 2, 1]], ids=["0-2", "0-2-1"])
def test_cat_metric_casts_integer_ids_to_float32_so_a_rank_that_never_updated_is_harmless(
    run_world, semantics, updates
):
    """``CatMetric`` fed int64 items, rank 0 never updated: ``CatMetric.update`` casts its input to the
    metric's dtype (float32), so the placeholder and the entries agree and every rank gets every rank's
    entries as float32 (exact below 2 ** 24; larger integer ids would be rounded)."""
    world_size = len(updates)
    world = run_world(hidden.list_state, world_size, metric="cat_metric", updates=updates, dtype="int64")

    expected = {"dtype": "float32", "values": [float(v) for v in _concatenated(updates, "int64")]}
    got = [rec["computed"] for rec in world.records]
    semantics.number("dtype on rank 0", got[0]["dtype"], vs=("dtype updated with", "int64"))
    assert got == [expected] * world_size, oracle.side_by_side("computed", got) + f"   expected {expected}"


def _auroc(updates: list) -> float:
    """scikit-learn's ROC AUC over every rank's predictions ``list_item(r, k) / 1000`` and targets ``k % 2``."""
    preds, targets = [], []
    for rank, count in enumerate(updates):
        for k, item in enumerate(_items(rank, count)):
            preds += [v / 1000.0 for v in item]
            targets += [k % 2] * len(item)
    return float(roc_auc_score(targets, preds))


@pytest.mark.parametrize(
    "metric, updates",
    [("list_state", [0, 2]), ("list_state", [0, 2, 1]), ("binary_auroc", [0, 3]), ("binary_auroc", [0, 3, 1])],
    ids=["int64_list-0-2", "int64_list-0-2-1", "binary_auroc-0-3", "binary_auroc-0-3-1"],
)
def test_an_empty_update_of_the_right_dtype_on_a_rank_with_nothing_to_add_lets_every_rank_compute(
    run_world, semantics, metric, updates
):
    """The fix: on a rank with nothing to add, one ``update`` with empty tensors of the right dtypes
    (``torch.empty(0, dtype=torch.long)`` entries; for ``BinaryAUROC`` empty float predictions and empty
    int64 targets). Its list then holds a 0-element int64 tensor instead of the float32 placeholder:
    every rank gets the int64 entries of every rank, or the AUROC over every rank's samples
    (scikit-learn's ``roc_auc_score``)."""
    world_size = len(updates)
    world = run_world(hidden.list_state, world_size, metric=metric, updates=updates, dtype="int64", fill_empty=True)

    if metric == "list_state":
        expected = [{"dtype": "int64", "values": _concatenated(updates, "int64")}] * world_size
    else:
        whole = _auroc(updates)
        if world_size > 2:
            oracle.assert_distinct(every_rank=whole, rank1_alone=_auroc([0, updates[1]] + [0] * (world_size - 2)))
        expected = [{"dtype": "float32", "values": pytest.approx(whole, abs=1e-6)}] * world_size
    got = [rec["computed"] for rec in world.records]
    semantics.number(
        "rank 0 computed" if metric == "binary_auroc" else "entries on rank 0",
        got[0]["values"] if metric == "binary_auroc" else len(got[0]["values"]),
        vs=("rank 0's own", "nothing"),
    )
    assert got == expected, oracle.side_by_side("computed", got) + f"   expected {expected[0]}"
