"""Reductions outside ``self.log``: what ``trainer.strategy.reduce`` and Fabric's ``all_reduce`` give each rank
for an int64, a bool and a float tensor and for a plain Python number, and what they do to the input.

Both end in lightning_fabric/utilities/distributed.py ``_sync_ddp``: ``torch.distributed.all_reduce(result,
SUM)`` *in place* and, for ``"mean"`` (the default of both) on gloo, a division by the world size written
back into the same tensor: ``result.div_(W)`` for a float tensor, ``result.copy_(result / W)`` for any other
dtype, so the float quotient is cast back to the input's dtype: an int64 mean is truncated toward zero, a
bool mean is True wherever any rank held True. The returned tensor *is* the input, so the rank's own value is
gone. ``DDPStrategy.reduce`` (pytorch_lightning/strategies/ddp.py) returns a non-tensor as given, unreduced;
``Fabric.all_reduce`` (lightning_fabric/fabric.py) first turns numbers into tensors (bool -> uint8,
int -> int32, float -> float32: lightning_fabric/utilities/apply_func.py ``CONVERSION_DTYPES``), and walks
collections, reducing (or gathering) each tensor and leaving other leaves as they are (``Fabric.all_reduce``,
``all_gather``).

Rank ``r`` reduces the ``r``-th entry of each table below (``ddpprobe/probes/outside_log_reductions.py``);
the expected values are the tables' sums and means computed here, on data where the exact mean, the mean
truncated toward zero and the floored mean all differ.
"""

import math

import pytest

from ddpprobe.probes import outside_log_reductions, strategy_and_fabric_collectives
from tests.support import oracle

#: ``[rank] -> [a positive, a negative]`` int64 entry: sums 7, -7 (W=2) and 8, -8 (W=3), none a multiple of W.
INT64 = [[3, -4], [4, -3], [1, -1]]
#: ``[rank] -> [True on rank 0 only, True everywhere, False everywhere]``.
BOOLS = [[True, True, False], [False, True, False], [False, True, False]]
#: Floats exactly representable in float32, as are their sums (the W = 3 means are compared to 1e-6).
FLOATS = [[0.5, -1.0], [1.25, 2.0], [2.25, 0.5]]
#: One Python number per rank.
INTS, PY_FLOATS, PY_BOOLS = [3, 4, 1], [0.5, 1.25, 2.25], [True, False, False]
#: A bool that every rank holds True.
PY_BOOLS_ALL = [True, True, True]
#: The calls the probe makes on each input (``outside_log_reductions.OPS``).
OPS_NAMES = tuple(outside_log_reductions.OPS)
#: The collectives one ``_sync_ddp`` runs: ``torch.distributed.barrier``, then ``all_reduce``.
SYNC_DDP_COLLECTIVES = ("barrier", "all_reduce")


def _tables(world_size, *kinds):
    tables = {
        "int64": INT64,
        "int64_clone": INT64,
        "float64": INT64,
        "bool": BOOLS,
        "float32": FLOATS,
        "python_int": INTS,
        "python_float": PY_FLOATS,
        "python_bool": PY_BOOLS,
        "python_bool_all": PY_BOOLS_ALL,
    }
    return {kind: tables[kind][:world_size] for kind in kinds}


def _column_sums(rows):
    return [sum(column) for column in zip(*rows)]


def _truncated_mean(rows, world_size):
    """``int(sum / W)`` per element: Python's ``int`` of a float truncates toward zero, as ``Tensor.copy_``
    into an integer tensor does."""
    return [int(s / world_size) for s in _column_sums(rows)]


def _got(world, kind, op, field="returned"):
    return [rec["reduced"][kind][op][field] for rec in world.records]


@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_reduce_mean_of_an_int64_tensor_is_truncated_toward_zero_and_stays_int64(
    run_world, semantics, world_size
):
    """``trainer.strategy.reduce(x)`` on an int64 tensor (default ``reduce_op="mean"``, and ``"mean"``
    given): ``_sync_ddp`` sums in place, then ``result.copy_(result / W)`` casts the float quotient back
    into int64, which truncates toward zero: every rank gets ``int(sum / W)`` (7/2 -> 3, -7/2 -> -3), an
    int64 tensor, not the exact mean 3.5 (nor the floored -4). ``reduce_op="sum"`` is exact."""
    rows = INT64[:world_size]
    world = run_world(outside_log_reductions.strategy_reduce, world_size, values=_tables(world_size, "int64"))

    sums = _column_sums(rows)
    truncated = _truncated_mean(rows, world_size)
    oracle.assert_distinct(truncated_positive=truncated[0], exact_positive=sums[0] / world_size)
    oracle.assert_distinct(truncated_negative=truncated[1], floored_negative=sums[1] // world_size)
    got = {op: _got(world, "int64", op) for op in ("default", "mean", "sum")}
    semantics.number(
        "int64 mean of the positive element",
        got["mean"][0]["value"][0],
        vs=("exact mean", sums[0] / world_size),
    )
    for op in ("default", "mean"):
        expected = {"type": "Tensor", "dtype": "int64", "value": truncated}
        assert got[op] == [expected] * world_size, (
            oracle.side_by_side(f"reduce {op}", got[op]) + f"  expected {expected}"
        )
    expected_sum = {"type": "Tensor", "dtype": "int64", "value": sums}
    assert got["sum"] == [expected_sum] * world_size, oracle.side_by_side("reduce sum", got["sum"])


@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_reduce_of_an_integer_count_as_a_float64_tensor_is_the_exact_mean(run_world, semantics, world_size):
    """The fix for the truncated integer mean: reduce the count as a floating tensor
    (``trainer.strategy.reduce(torch.tensor(count, dtype=torch.float64))``): ``_sync_ddp`` then divides with
    ``result.div_(W)`` and every rank gets ``sum / W`` exactly (3.5, -3.5 at W = 2)."""
    rows = INT64[:world_size]
    world = run_world(outside_log_reductions.strategy_reduce, world_size, values=_tables(world_size, "float64"))

    exact = [s / world_size for s in _column_sums(rows)]
    oracle.assert_distinct(exact=exact[0], truncated=_truncated_mean(rows, world_size)[0])
    got = _got(world, "float64", "mean")
    semantics.number("float64 mean", got[0]["value"][0], vs=("int64 mean", _truncated_mean(rows, world_size)[0]))
    for rank_got in got:
        assert rank_got["dtype"] == "float64", oracle.side_by_side("dtype", got)
        assert rank_got["value"] == pytest.approx(exact, rel=1e-12), oracle.side_by_side("mean", got)


@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_reduce_of_a_float_tensor_is_the_exact_mean_or_sum_in_float32(run_world, semantics, world_size):
    """On a float32 tensor ``_sync_ddp`` divides in place (``result.div_(W)``): the default op and
    ``"mean"`` give every rank the all-rank mean, ``"sum"`` the all-rank sum, both float32."""
    rows = FLOATS[:world_size]
    world = run_world(outside_log_reductions.strategy_reduce, world_size, values=_tables(world_size, "float32"))

    sums = _column_sums(rows)
    means = [s / world_size for s in sums]
    oracle.assert_distinct(mean=means[0], rank0_own=rows[0][0], sum=sums[0])
    semantics.number("float32 mean", _got(world, "float32", "mean")[0]["value"][0], vs=("rank 0's own", rows[0][0]))
    for op, expected in (("default", means), ("mean", means), ("sum", sums)):
        got = _got(world, "float32", op)
        for rank_got in got:
            assert rank_got["dtype"] == "float32", oracle.side_by_side(op, got)
            assert rank_got["value"] == pytest.approx(expected, rel=1e-6), (
                oracle.side_by_side(op, got) + f"  {expected}"
            )


@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_reduce_of_a_bool_tensor_is_any_for_mean_and_sum(run_world, semantics, world_size):
    """A bool tensor stays bool: gloo's SUM of bools is a logical or, and the mean's
    ``result.copy_(result / W)`` casts the quotient back to bool (nonzero -> True). So ``"mean"`` and
    ``"sum"`` both give ``any`` over ranks per element: True where a single rank held True, not the
    fraction of ranks (1/W), their count, nor ``all``."""
    world = run_world(outside_log_reductions.strategy_reduce, world_size, values=_tables(world_size, "bool"))

    rows = BOOLS[:world_size]
    any_ = [any(column) for column in zip(*rows)]
    all_ = [all(column) for column in zip(*rows)]
    oracle.assert_distinct(any_first=any_[0], all_first=all_[0], fraction_first=sum(r[0] for r in rows) / world_size)
    got = {op: _got(world, "bool", op) for op in ("default", "mean", "sum")}
    semantics.number("bool mean where 1 rank holds True", got["mean"][0]["value"][0], vs=("all", all_[0]))
    expected = {"type": "Tensor", "dtype": "bool", "value": any_}
    for op, per_rank in got.items():
        assert per_rank == [expected] * world_size, oracle.side_by_side(op, per_rank) + f"  expected {expected}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_reduce_writes_the_result_into_the_input_tensor_and_a_clone_keeps_it(run_world, semantics, world_size):
    """``reduce(x)`` returns ``x`` itself, overwritten on every rank (``all_reduce`` and the division are in
    place): a rank that keeps ``x`` (a counter, a buffer) has lost its own value. Passing ``x.clone()``
    is the fix: the clone is reduced, ``x`` keeps the rank's own value."""
    values = _tables(world_size, "int64", "float32", "int64_clone")
    world = run_world(outside_log_reductions.strategy_reduce, world_size, values=values)

    truncated = _truncated_mean(INT64[:world_size], world_size)
    float_sums = _column_sums(FLOATS[:world_size])
    reduced = {
        ("int64", "default"): truncated,
        ("int64", "mean"): truncated,
        ("int64", "sum"): _column_sums(INT64[:world_size]),
        ("float32", "default"): [s / world_size for s in float_sums],
        ("float32", "mean"): [s / world_size for s in float_sums],
        ("float32", "sum"): float_sums,
    }
    own = {"int64": INT64, "float32": FLOATS}
    for (kind, _), value in reduced.items():  # every rank's own tensor differs from the reduced one somewhere
        for rank in range(world_size):
            oracle.assert_distinct(own_minus_reduced=max(abs(a - b) for a, b in zip(own[kind][rank], value)), zero=0)
    same = [rec["reduced"]["int64"]["mean"]["same_object"] for rec in world.records]
    semantics.number("ranks whose input was overwritten", sum(same), vs=("ranks", world_size))
    for (kind, op), value in reduced.items():
        returned, after = _got(world, kind, op), _got(world, kind, op, "input_after")
        assert _got(world, kind, op, "same_object") == [True] * world_size, oracle.side_by_side("is x", returned)
        # x itself now holds the all-rank result, not the rank's own table entry
        assert [a["value"] for a in after] == [pytest.approx(value, rel=1e-6)] * world_size, (
            oracle.side_by_side(f"{kind} {op} x after", after) + f"  expected {value}"
        )
        assert after == returned, oracle.side_by_side(f"{kind} {op} x after", after)
    for rank, rec in enumerate(world.records):
        entry = rec["reduced"]["int64_clone"]["mean"]
        assert entry["same_object"] is False
        assert entry["input_after"]["value"] == INT64[rank], oracle.side_by_side("x after reducing a clone", [entry])
        assert entry["returned"]["value"] == truncated, oracle.side_by_side("reduced clone", [entry])


@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_reduce_returns_a_python_number_unreduced(run_world, semantics, world_size):
    """``DDPStrategy.reduce`` reduces tensors only (``if isinstance(tensor, Tensor)``): a Python ``int``,
    ``float`` or ``bool`` comes back as given, with no collective, so each rank keeps its *own* number,
    silently, for every op. Wrap it in a tensor to reduce it: a float32 tensor reduced next to them runs
    ``_sync_ddp``'s barrier and all_reduce, two collectives per call (counted with the default process
    group's sequence number)."""
    values = _tables(world_size, "python_int", "python_float", "python_bool", "float32")
    world = run_world(outside_log_reductions.strategy_reduce, world_size, values=values)

    oracle.assert_distinct(rank0_own=INTS[0], mean=sum(INTS[:world_size]) / world_size)
    oracle.assert_distinct(rank1_own=PY_FLOATS[1], mean=sum(PY_FLOATS[:world_size]) / world_size)
    semantics.number(
        "rank 0's reduced int",
        _got(world, "python_int", "mean")[0]["value"],
        vs=("mean", sum(INTS[:world_size]) / world_size),
    )
    for kind, type_name in (("python_int", "int"), ("python_float", "float"), ("python_bool", "bool")):
        for op in OPS_NAMES:
            got = _got(world, kind, op)
            expected = [{"type": type_name, "dtype": None, "value": v} for v in values[kind]]
            assert got == expected, oracle.side_by_side(f"reduce({kind}) {op}", got) + f"  expected {expected}"
            ran = _got(world, kind, op, "collectives")
            assert ran == [0] * world_size, oracle.side_by_side(f"collectives reduce({kind}) {op} ran", ran)
    for op in OPS_NAMES:
        ran = _got(world, "float32", op, "collectives")
        assert ran == [len(SYNC_DDP_COLLECTIVES)] * world_size, oracle.side_by_side(
            f"collectives reduce(float32 tensor) {op} ran", ran
        )


@pytest.mark.parametrize("world_size", [2, 3])
def test_fabric_all_reduce_turns_numbers_into_int32_float32_uint8_tensors_and_truncates_integer_means(
    run_world, semantics, world_size
):
    """``Fabric.all_reduce`` converts numbers first (``convert_to_tensors``: int -> int32, float -> float32,
    bool -> uint8) and reduces every tensor with the same ``_sync_ddp``: every rank gets a tensor; the int
    mean is ``int(sum / W)`` in int32, the float mean exact in float32, the bool mean the count of True
    ranks divided by W and truncated in uint8 (0 unless every rank is True, then 1: ``all``), the bool sum
    that count. An int64 tensor input is truncated as under ``trainer.strategy.reduce``."""
    values = _tables(world_size, "python_int", "python_float", "python_bool", "python_bool_all", "int64")
    world = run_world(outside_log_reductions.fabric_all_reduce, world_size, values=values)

    int_sum, float_sum = sum(INTS[:world_size]), sum(PY_FLOATS[:world_size])
    true_ranks, all_true = sum(PY_BOOLS[:world_size]), sum(PY_BOOLS_ALL[:world_size])
    assert math.trunc(all_true / world_size) == 1 and math.trunc(true_ranks / world_size) == 0
    oracle.assert_distinct(truncated=int(int_sum / world_size), exact=int_sum / world_size)
    oracle.assert_distinct(bool_mean=math.trunc(true_ranks / world_size), any_=1.0, fraction=true_ranks / world_size)
    semantics.number(
        "Fabric int mean", _got(world, "python_int", "mean")[0]["value"], vs=("exact", int_sum / world_size)
    )
    expected = {
        ("python_int", "mean"): {"type": "Tensor", "dtype": "int32", "value": int(int_sum / world_size)},
        ("python_int", "sum"): {"type": "Tensor", "dtype": "int32", "value": int_sum},
        ("python_bool", "mean"): {"type": "Tensor", "dtype": "uint8", "value": math.trunc(true_ranks / world_size)},
        ("python_bool", "sum"): {"type": "Tensor", "dtype": "uint8", "value": true_ranks},
        # True on every rank: the count is W, so the truncated mean is 1 (``all``) and the sum W
        ("python_bool_all", "mean"): {"type": "Tensor", "dtype": "uint8", "value": math.trunc(all_true / world_size)},
        ("python_bool_all", "sum"): {"type": "Tensor", "dtype": "uint8", "value": all_true},
        ("int64", "mean"): {
            "type": "Tensor",
            "dtype": "int64",
            "value": _truncated_mean(INT64[:world_size], world_size),
        },
    }
    for (kind, op), want in expected.items():
        got = _got(world, kind, op)
        assert got == [want] * world_size, oracle.side_by_side(f"all_reduce({kind}) {op}", got) + f"  expected {want}"
    assert _got(world, "python_int", "default") == [expected[("python_int", "mean")]] * world_size
    for op, want in (("mean", float_sum / world_size), ("sum", float_sum)):
        got = _got(world, "python_float", op)
        for rank_got in got:
            assert rank_got["dtype"] == "float32", oracle.side_by_side(op, got)
            assert rank_got["value"] == pytest.approx(want, rel=1e-6), oracle.side_by_side(op, got) + f"  {want}"


@pytest.mark.mirrors("tests_fabric/test_fabric.py::test_all_reduce", "tests_fabric/test_fabric.py::test_all_gather")
def test_fabric_all_reduce_and_all_gather_walk_collections_and_leave_other_leaves_alone(run_world, semantics):
    """``fabric.all_reduce({"a": r+1, "b": [2(r+1)], "s": "text"})`` returns the dict with each tensor
    averaged (the default op, ``"mean"``: 1.5 and 3.0 at W=2) and the string untouched; ``reduce_op="sum"``
    gives 3.0; ``fabric.all_gather`` of ``{"a": r, "b": [[r, r]]}`` stacks each leaf to shape (W, ...).
    Mirrors Lightning's tests_fabric/test_fabric.py::test_all_reduce and ::test_all_gather (mocked
    strategy). Source: lightning_fabric/fabric.py ``Fabric.all_reduce`` and ``all_gather``
    (``apply_to_collection``)."""
    world_size = 2
    world = run_world(strategy_and_fabric_collectives.fabric_collectives_and_loaders, world_size)

    values = [r + 1.0 for r in range(world_size)]
    oracle.assert_distinct(mean=oracle.mean(values), sum=sum(values), rank0=values[0])
    want = {
        "all_reduce": {"a": oracle.mean(values), "b": [2 * oracle.mean(values)], "s": "text"},
        "all_reduce_sum": sum(values),
        "all_gather": {"a": [float(r) for r in range(world_size)], "b": [[[r, r] for r in range(world_size)]]},
    }
    got = [rec["collections"] for rec in world.records]
    assert got == [want] * world_size, oracle.side_by_side("collections", got) + f"  expected {want}"
    semantics.number("all_reduce default of 1 and 2", got[0]["all_reduce"]["a"], vs=("sum", sum(values)))
