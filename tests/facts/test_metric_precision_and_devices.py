"""Precision and devices in metric syncs: bfloat16 states summed over gloo, and CPU tensors synced over a
process group whose only backend is NCCL.

**bfloat16 over gloo.** gloo raised "Invalid scalar type" for bfloat16 tensors (pytorch #111131,
torchmetrics #1809, where a ``bf16-mixed`` run's metric sync failed) until it learned the type (pytorch PR
#113557, merged 2023-11); the suite's torch 2.13 sums and gathers bfloat16 over gloo without error, and
sums *in* bfloat16. A ``SumMetric`` set to bfloat16 keeps a bfloat16 state and its ``compute()`` all-gathers
and sums bfloat16 values; a plain ``all_reduce`` does the same. bfloat16 keeps 8 significant bits, so
next to 256 it steps by 2: rank 0 contributes 256.0 and every other rank 0.5, and every bfloat16 sum of
them rounds to 256, where the exact sum is 256.5 (W = 2) or 257 (W = 3). ``self.log`` casts a value that
is not float32 or float64 to float32 before its sync (``_ResultMetric.update``), so the logged sum is exact;
int8 becomes float32 too, and a float64 value keeps float64 through the sync (probe
ddpprobe/probes/logged_metrics.py).

**CPU tensors over NCCL** (GPU only): a process group created with ``backend="nccl"`` has no CPU backend,
so a collective on a CPU tensor raises "No backend type associated with device type cpu": a
``self.log(..., sync_dist=True)`` of a CPU tensor (Lightning moves its result to the value's device,
``_ResultCollection.log``; Lightning #18803) and a metric with ``compute_on_cpu=True``, whose list states
are moved to the CPU after every update (torchmetrics #2477). The same metric without ``compute_on_cpu``
syncs. These facts need ``--backend nccl`` and two GPUs and skip here with that reason.

The probe is ddpprobe/probes/precision.py. Sources: pytorch_lightning/trainer/connectors/logger_connector/
result.py ``_ResultMetric.update``, ``_ResultCollection.log``; torchmetrics/metric.py ``Metric.set_dtype``,
``Metric._sync_dist``, ``Metric._move_list_states_to_cpu``; torchmetrics/utilities/distributed.py
``gather_all_tensors``; torch/distributed/distributed_c10d.py ``all_reduce``.
"""

import numpy
import pytest
import torch

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import logged_metrics, precision
from tests.support import oracle

NO_CPU_BACKEND = "No backend type associated with device type cpu"


def _bfloat16_sum(values: list) -> float:
    """The values summed one after the other in bfloat16, as one process computes it (here every order
    gives the same number: 256 absorbs each 0.5 and each 1.0)."""
    total = torch.tensor(values[0], dtype=torch.bfloat16)
    for v in values[1:]:
        total = total + torch.tensor(v, dtype=torch.bfloat16)
    return float(total)


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_bfloat16_metric_state_syncs_over_gloo_and_sums_in_bfloat16_so_small_values_vanish(
    run_world, semantics, world_size
):
    """``SumMetric().set_dtype(torch.bfloat16)`` updated with 256.0 on rank 0 and 0.5 elsewhere: its state
    is bfloat16, ``compute()`` syncs it over gloo without error and returns a bfloat16 256.0 on every rank,
    not the exact 256.5 (W = 2) or 257 (W = 3); a plain bfloat16 ``all_reduce`` gives the same, while
    ``all_gather`` returns every rank's value exactly."""
    world = run_world(precision.bfloat16, world_size)

    values = [precision.bf16_value(r) for r in range(world_size)]
    exact, rounded = sum(values), _bfloat16_sum(values)
    oracle.assert_distinct(exact=exact, bfloat16=rounded)
    states = [rec["state_dtypes"]["sum_metric"] for rec in world.records]
    assert states == ["bfloat16"] * world_size, oracle.side_by_side("state dtype", states)
    computed = [rec["syncs"]["sum_metric"] for rec in world.records]
    semantics.number("bfloat16 SumMetric.compute()", computed[0].get("values", [None])[0], vs=("exact sum", exact))
    assert computed == [{"values": [rounded], "dtype": "bfloat16"}] * world_size, (
        oracle.side_by_side("compute()", computed) + f"  expected bfloat16 {rounded}; exact {exact}"
    )
    reduced = [rec["syncs"]["all_reduce"] for rec in world.records]
    assert reduced == [{"values": [rounded], "dtype": "bfloat16"}] * world_size, oracle.side_by_side(
        "all_reduce", reduced
    )
    gathered = [rec["syncs"]["all_gather"] for rec in world.records]
    assert gathered == [{"values": values, "dtype": "bfloat16"}] * world_size, oracle.side_by_side(
        "all_gather", gathered
    )


@run_if(lightning=">=2.1")  # the cast before the step sync arrived in 2.1 (_ResultMetric.update)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_bfloat16_value_logged_with_sync_dist_is_cast_to_float32_first_so_its_synced_sum_is_exact(
    run_world, semantics, world_size
):
    """The same bfloat16 values given to ``self.log(..., sync_dist=True, reduce_fx="sum", on_step=True,
    on_epoch=True)``: Lightning casts each to float32 before the sync and accumulates in float32, so the
    step and epoch values in ``logged_metrics`` are float32 and the exact sum (256.5 at W = 2). The fix for
    a metric of your own: keep its states float32 (``set_dtype(torch.float32)``) or cast before syncing."""
    world = run_world(precision.bfloat16, world_size)

    values = [precision.bf16_value(r) for r in range(world_size)]
    exact, rounded = sum(values), _bfloat16_sum(values)
    oracle.assert_distinct(exact=exact, bfloat16=rounded)
    got = [rec["logged"] for rec in world.records]
    semantics.number("bf16_sum_epoch", got[0]["bf16_sum_epoch"], vs=("summed in bfloat16", rounded))
    assert got == [{"bf16_sum_epoch": exact, "bf16_sum_step": exact}] * world_size, (
        oracle.side_by_side("logged", got) + f"  expected {exact}; in bfloat16 {rounded}"
    )
    dtypes = [rec["logged_dtypes"] for rec in world.records]
    assert dtypes == [{"bf16_sum_epoch": "float32", "bf16_sum_step": "float32"}] * world_size


@run_if(lightning="<2.1")
@pytest.mark.parametrize("world_size", [2, 3])
def test_before_2_1_a_bfloat16_value_logged_with_sync_dist_is_synced_in_bfloat16_at_step_level(
    run_world, semantics, world_size
):
    """Before 2.1 ``_ResultMetric.update`` cast only integer values, and after the step sync: the step value
    of the same bfloat16 log is synced in bfloat16 (256.0, a bfloat16 in ``logged_metrics``), while the
    epoch value, accumulated into the float32 state, is synced in float32 (256.5). Checked on 1.9.5 and
    2.0.9.post0."""
    world = run_world(precision.bfloat16, world_size)

    values = [precision.bf16_value(r) for r in range(world_size)]
    exact, rounded = sum(values), _bfloat16_sum(values)
    oracle.assert_distinct(exact=exact, bfloat16=rounded)
    got = [rec["logged"] for rec in world.records]
    semantics.number("bf16_sum_step", got[0]["bf16_sum_step"], vs=("exact sum", exact))
    assert got == [{"bf16_sum_epoch": exact, "bf16_sum_step": rounded}] * world_size, oracle.side_by_side("logged", got)
    dtypes = [rec["logged_dtypes"] for rec in world.records]
    assert dtypes == [{"bf16_sum_epoch": "float32", "bf16_sum_step": "bfloat16"}] * world_size


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.parametrize("world_size", [2])
def test_cpu_tensors_synced_over_an_nccl_process_group_raise_while_the_same_metric_on_the_gpu_syncs(
    run_world, semantics, world_size
):
    """Under ``--backend nccl``: ``CatMetric(compute_on_cpu=True)`` updated with a GPU value keeps its list
    state on the CPU, and its ``compute()`` raises ``RuntimeError: No backend type associated with device
    type cpu`` on every rank; ``self.log("cpu_value", cpu_tensor, sync_dist=True)`` raises the same. The
    same ``CatMetric`` without ``compute_on_cpu`` (state on the GPU) gathers every rank's value. Fix: keep
    synced tensors on ``self.device`` (``.to(self.device)``), and leave ``compute_on_cpu`` off under NCCL."""
    world = run_world(precision.cpu_over_nccl, world_size)

    values = [precision.bf16_value(r) for r in range(world_size)]
    assert [rec["backend"] for rec in world.records] == ["nccl"] * world_size
    devices = [rec["state_devices"] for rec in world.records]
    assert devices == [{"on_cpu": "cpu", "on_device": "cuda"}] * world_size, oracle.side_by_side("devices", devices)
    for name in ("compute_on_cpu", "self_log_cpu"):
        got = [rec["syncs"][name] for rec in world.records]
        semantics.number(f"{name} raised", str(got[0].get("raised")), vs=("on the GPU", "nothing"))
        assert all(g.get("raised") == "RuntimeError" and NO_CPU_BACKEND in g.get("message", "") for g in got), (
            oracle.side_by_side(name, got)
        )
    on_device = [rec["syncs"]["on_device"] for rec in world.records]
    assert on_device == [{"values": values, "dtype": "float32"}] * world_size, oracle.side_by_side("on GPU", on_device)


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
