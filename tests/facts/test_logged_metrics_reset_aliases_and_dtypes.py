"""What ``self.log`` does with torchmetrics objects across epochs, with step-level ``reduce_fx``, with a
batch size it must infer, and with float64, as Lightning's own tests assert it, in real worlds.

- A ``Metric`` passed to ``self.log`` belongs to Lightning's result collection, which resets it when the
  epoch's results are done (pytorch_lightning/trainer/connectors/logger_connector/result.py
  ``_ResultCollection.reset`` -> ``_ResultMetric.reset`` -> ``Metric.reset``). A metric only
  ``compute()``-d is the user's to reset: torchmetrics never resets it (torchmetrics/metric.py
  ``Metric.compute`` syncs, computes and restores the local state).
- A step-level ``sync_dist=True`` value is all-reduced at that step with the op named by ``reduce_fx``;
  the strings are lower-cased and ``"avg"`` means ``"mean"`` (result.py ``_Metadata._parse_reduce_fx``).
- Without ``batch_size`` Lightning takes the batch size from the batch (``extract_batch_size``) for the
  weighted epoch mean; float64 values keep float64 (result.py ``_ResultMetric.update``).

The probe module is ddpprobe/probes/logged_metrics.py; sample ``i`` has value ``i ** 2``.
"""

import numpy
import pytest
import torch

from ddpprobe.probes import logged_metrics
from tests.support import oracle


@pytest.mark.mirrors("tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp")
def test_a_logged_metric_is_reset_at_each_epoch_end_while_an_unlogged_one_keeps_growing(run_world, semantics):
    """Two ``SumMetric`` objects fed the same validation values over two epochs of ``fit`` at W=2: the one
    passed to ``self.log`` starts each epoch from its default (local state 0) and logs the padded set's
    sum every epoch (30 for N=5); the one only ``compute()``-d in ``on_validation_epoch_end`` keeps its
    local state (rank 0 holds 20, rank 1 10 at the start of epoch 1), so its synced ``compute()`` is 30
    then 60. Mirrors Lightning's tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp
    (``result.reset()`` then ``metric.x == metric._defaults["x"]``; 2 GPUs); the unlogged case is
    torchmetrics' design, not in Lightning's tests. Source: result.py ``_ResultCollection.reset``;
    torchmetrics/metric.py ``Metric.compute``."""
    n, val_n, batch_size, epochs, world_size = 4, 5, 2, 2, 2
    world = run_world(
        logged_metrics.fit_metric_reset, world_size, n=n, val_n=val_n, batch_size=batch_size, epochs=epochs
    )

    epoch_sum = sum(oracle.values(oracle.padded_indices(val_n, world_size)))
    local = [sum(oracle.values(oracle.shard(val_n, world_size, r))) for r in range(world_size)]
    oracle.assert_distinct(fresh=epoch_sum, cumulative=2 * epoch_sum)
    got = [[rec["epochs"][str(e)] for e in range(epochs)] for rec in world.records]
    logged = [[e["logged_value"] for e in rank] for rank in got]
    assert logged == [[epoch_sum] * epochs] * world_size, oracle.side_by_side("logged_sum per epoch", logged)
    logged_state = [[e["logged_state"] for e in rank] for rank in got]
    assert logged_state == [[0.0] * epochs] * world_size, oracle.side_by_side("logged metric's state", logged_state)
    unlogged = [[e["unlogged_compute"] for e in rank] for rank in got]
    expected = [epoch_sum * (e + 1) for e in range(epochs)]
    assert unlogged == [expected] * world_size, oracle.side_by_side("unlogged compute() per epoch", unlogged)
    kept = [rank[1]["unlogged_state"] for rank in got]
    assert kept == local, oracle.side_by_side("unlogged state at epoch 1's start", kept) + f"  expected {local}"
    semantics.number("unlogged compute() in epoch 1", unlogged[0][1], vs=("logged value", logged[0][1]))


#: The ``reduce_fx`` strings logged, and the reduction each names.
REDUCE_FXS = {"max": max, "min": min, "sum": sum, "mean": oracle.mean, "SUM": sum, "AVG": oracle.mean, "Max": max}


@pytest.mark.mirrors(
    "tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true",
    "tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true_ddp",
)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_step_level_synced_value_is_reduced_across_ranks_with_reduce_fx_and_its_case_insensitive_aliases(
    run_world, semantics, world_size
):
    """Rank r logs ``(r+1)**2 + 0.5`` with ``on_step=True, on_epoch=False, sync_dist=True`` and each
    ``reduce_fx`` of ``max``, ``min``, ``sum``, ``mean``, ``"SUM"``, ``"AVG"``, ``"Max"``: every rank
    gets the cross-rank max, min, sum or mean at that step (at W=3: 9.5, 1.5, 15.5, 5.17), the upper-case
    strings the same as the lower-case ones and ``"AVG"`` as ``"mean"``. Mirrors Lightning's
    tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true (``foo_5``,
    max) and ::test_logging_sync_dist_true_ddp (``"SUM"``, ``"AVG"``; 2 GPUs). Source: result.py
    ``_Metadata._parse_reduce_fx``, ``_ResultMetric.update`` (``self.meta.sync`` at step level)."""
    world = run_world(logged_metrics.fit_step_reductions, world_size, reduce_fxs=list(REDUCE_FXS))

    values = [logged_metrics.step_value(r) for r in range(world_size)]
    expected = {f"v_{fx}": reduce(values) for fx, reduce in REDUCE_FXS.items()}
    oracle.assert_distinct(max=max(values), min=min(values), sum=sum(values), mean=oracle.mean(values))
    assert len(set(values)) == world_size, (
        "ranks must log different values, so an unsynced value differs from max or min"
    )
    for rec in world.records:
        got = {k: rec["callback_metrics"][k] for k in expected}
        assert got == pytest.approx(expected), (
            oracle.side_by_side("step values", [r["callback_metrics"] for r in world.records])
            + f"  expected {expected}"
        )
    semantics.number(
        "step-level max across ranks", world.records[0]["callback_metrics"]["v_max"], vs=("rank 0's", values[0])
    )


@pytest.mark.mirrors(
    "tests_pytorch/trainer/logging_/test_logger_connector.py::test_result_collection_batch_size_extraction",
    "tests_pytorch/trainer/logging_/test_logger_connector.py::test_result_collection_on_tensor_with_mean_reduction",
)
def test_without_batch_size_the_epoch_mean_is_weighted_by_the_batch_size_inferred_from_the_batch(run_world, semantics):
    """Validation batches of 2 and 1 samples (N=5, W=2, batch size 2), each batch's mean logged with
    ``sync_dist=True``: without ``batch_size`` the synced epoch value is the same as with
    ``batch_size=len(batch)``, the mean over the padded set (5.0), because Lightning reads the size of the
    batch's first tensor; ``batch_size=1`` gives the unweighted mean of batch means (5.75). Mirrors
    Lightning's tests_pytorch/trainer/logging_/test_logger_connector.py::
    test_result_collection_batch_size_extraction and ::test_result_collection_on_tensor_with_mean_reduction
    (one process). Source: pytorch_lightning/utilities/data.py ``extract_batch_size``; result.py
    ``_ResultCollection.log`` (``batch_size``) and ``_ResultMetric.update``."""
    n, batch_size, world_size = 5, 2, 2
    world = run_world(logged_metrics.validate_inference, world_size, n=n, batch_size=batch_size)

    batches = oracle.rank_batches(n, world_size, batch_size)
    per_rank = [[(oracle.mean(oracle.values(b)), len(b)) for b in rank] for rank in batches]
    weighted = oracle.sync_reduce("mean", per_rank)
    unweighted = oracle.sync_reduce("mean", [[(v, 1) for v, _ in rank] for rank in per_rank])
    oracle.assert_distinct(weighted=weighted, unweighted=unweighted)
    got = [{k: rec["callback_metrics"][k] for k in ("inferred", "explicit", "unweighted")} for rec in world.records]
    want = {"inferred": weighted, "explicit": weighted, "unweighted": unweighted}
    assert got == [pytest.approx(want)] * world_size, (
        oracle.side_by_side("synced epoch values", got) + f"  expected {want}"
    )
    semantics.number("synced mean without batch_size", got[0]["inferred"], vs=("unweighted", unweighted))


@pytest.mark.mirrors("tests_pytorch/core/test_metric_result_integration.py::test_metric_result_dtype_promotion")
def test_a_float64_value_stays_float64_through_the_sync(run_world, semantics):
    """Rank r logs the float64 tensor ``1 + (r+1) * 1e-10`` with ``sync_dist=True``: the synced epoch value
    in ``callback_metrics`` is a float64 tensor holding the exact mean ``1 + 1.5e-10``, which float32
    would round to 1.0. Mirrors Lightning's tests_pytorch/core/test_metric_result_integration.py::
    test_metric_result_dtype_promotion (one process). Source: result.py ``_ResultMetric.update`` (float32
    and float64 kept; other dtypes cast to the default float dtype)."""
    world_size = 2
    world = run_world(logged_metrics.validate_inference, world_size, n=4, batch_size=2)

    exact = oracle.mean(logged_metrics.float64_value(r) for r in range(world_size))
    as_float32 = float(numpy.float32(exact))
    oracle.assert_distinct(float64_excess_in_1e10=(exact - 1) * 1e10, float32_excess_in_1e10=(as_float32 - 1) * 1e10)
    got = [(rec["dtypes"]["f64"], rec["callback_metrics"]["f64"]) for rec in world.records]
    assert all(d == "torch.float64" for d, _ in got), oracle.side_by_side("dtype, value", got)
    assert [v for _, v in got] == pytest.approx([exact] * world_size, rel=0, abs=1e-13), (
        oracle.side_by_side("f64", got) + f"  expected {exact!r}, float32 gives {as_float32!r}"
    )
    semantics.number("synced float64 value minus 1", got[0][1] - 1.0, vs=("in float32", as_float32 - 1.0))


@pytest.mark.mirrors(
    "tests_pytorch/core/test_metric_result_integration.py::test_metric_result_precision_no_lower_than_float32",
    "tests_pytorch/core/test_metric_result_integration.py::test_metric_result_respects_dtype",
)
def test_int8_and_bfloat16_values_are_cast_to_float32_before_the_sync(run_world, semantics):
    """Rank r logs the int8 tensor ``r + 1`` and the bfloat16 tensor ``1 + r * 2**-7`` with
    ``sync_dist=True``: both reach ``callback_metrics`` as float32 means computed in float32, 1.5 (an int8
    mean would truncate to 1) and ``1 + 2**-8`` (which bfloat16 cannot hold: it would round to 1.0 or
    ``1 + 2**-7``). (The int tensor's cast warning: test_log_reductions.py.) Mirrors
    Lightning's tests_pytorch/core/test_metric_result_integration.py::
    test_metric_result_precision_no_lower_than_float32 and ::test_metric_result_respects_dtype (one
    process). Source: result.py ``_ResultMetric.update`` (``value.to(_get_default_dtype())`` for any
    dtype other than float32 and float64)."""
    world_size = 2
    world = run_world(logged_metrics.validate_inference, world_size, n=4, batch_size=2)

    int_mean = oracle.mean(r + 1 for r in range(world_size))
    bf16_mean = oracle.mean(logged_metrics.bfloat16_value(r) for r in range(world_size))
    oracle.assert_distinct(float_mean=int_mean, truncated=float(int(int_mean)))
    bf16_rounded = float(torch.tensor(bf16_mean).to(torch.bfloat16))
    oracle.assert_distinct(float32_in_2e8=bf16_mean * 2**8, bfloat16_in_2e8=bf16_rounded * 2**8)
    got = [{k: (rec["dtypes"][k], rec["callback_metrics"][k]) for k in ("i8", "bf16")} for rec in world.records]
    want = {"i8": ("torch.float32", int_mean), "bf16": ("torch.float32", bf16_mean)}
    assert got == [want] * world_size, oracle.side_by_side("dtype, value", got) + f"  expected {want}"
    semantics.number(
        "synced bfloat16 mean minus 1, in 2**-8",
        (got[0]["bf16"][1] - 1) * 2**8,
        vs=("in bfloat16", (bf16_rounded - 1) * 2**8),
    )
