"""Parameters and gradients under DDP, as Lightning's own tests assert them, in real worlds: rank 0's
parameters in ``validate``/``test``/``predict``, gradients after ``manual_backward``, gradients through
``all_gather(..., sync_grads=True)``, and parameters the loss does not use.

- Outside ``fit`` Lightning does not wrap the module in ``DistributedDataParallel`` ("there's no gradients to
  reduce") but broadcasts rank 0's parameters and buffers to every rank at setup
  (pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup``, ``_sync_module_states``).
- In manual optimization ``manual_backward`` runs the backward through the DDP-wrapped module, so DDP's
  reducer all-reduces and averages the gradients before ``optimizer.step()``
  (pytorch_lightning/core/module.py ``manual_backward`` -> ``strategy.backward``).
- ``self.all_gather(x, sync_grads=True)`` is differentiable: its backward all-reduces (sums) the
  gradients of the gathered tensor and hands each rank its own slice
  (lightning_fabric/utilities/distributed.py ``_AllGatherGrad``).

The module is ``Linear(2, 1)`` on ``RegressionDataset`` (``x = [id / 4, ±1]``, ``y = id % 3 - 1``;
ddpprobe/probes/gradients_and_weights.py); expected numbers are computed here from the data in float64.
"""

import pytest

from ddpprobe.probes import gradients_and_weights
from ddpprobe.probes.training import regression_x, regression_y
from tests.support import oracle


def _prediction(params, sample_id: int, offset: float) -> float:
    w0, w1, b = params
    x = regression_x(sample_id)
    return w0 * x[0] + w1 * x[1] + b + offset


def _flat_params(init: dict) -> list:
    return init["weight"][0] + init["bias"]


@pytest.mark.mirrors(
    "tests_pytorch/overrides/test_distributed.py::test_params_synced_during_nonfit",
    "tests_pytorch/strategies/test_ddp.py::test_ddp_configure_ddp",
)
@pytest.mark.parametrize("stage", gradients_and_weights.STAGES)
def test_validate_test_and_predict_broadcast_rank_0s_parameters_and_buffers_without_a_ddp_wrapper(
    run_world, semantics, stage
):
    """Each rank builds its module with its own weights, bias and buffer (rank r: weight ``[r+1,
    -(r+1)/2]``, bias ``r/4``, buffer ``10 + r``). In ``trainer.validate``, ``test`` and ``predict`` the
    module is not wrapped (``trainer.strategy.model`` is the LightningModule itself), yet every rank's
    steps run with rank 0's parameters and buffer: Lightning broadcasts them at setup. Rank 1's
    outputs are rank 0's weights applied to rank 1's own samples, and the module keeps rank 0's
    weights after the stage. Mirrors Lightning's tests_pytorch/overrides/test_distributed.py::
    test_params_synced_during_nonfit (standalone, 2 CPU ranks) and strategies/test_ddp.py::
    test_ddp_configure_ddp. Source: pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup`` (``if
    trainer_fn == TrainerFn.FITTING: configure_ddp() else: _sync_module_states(self.model)``)."""
    world_size, n = 2, 4
    world = run_world(gradients_and_weights.evaluate_rank_weights, world_size, stage=stage, n=n, batch_size=2)

    rank0 = gradients_and_weights.rank_weights(0)
    rank1 = gradients_and_weights.rank_weights(1)
    ids1 = oracle.shard(n, world_size, 1)
    broadcast = [_prediction(_flat_params(rank0), i, rank0["offset"]) for i in ids1]
    local = [_prediction(_flat_params(rank1), i, rank1["offset"]) for i in ids1]
    oracle.assert_distinct(broadcast=sum(broadcast), rank_local=sum(local))
    steps = [rec["steps"] for rec in world.records]
    wrappers = [{s["wrapper"] for s in rank} for rank in steps]
    assert wrappers == [{"RankWeightsProbe"}] * world_size, oracle.side_by_side("trainer.strategy.model", wrappers)
    held = [[(s["params"], s["offset"]) for s in rank] for rank in steps]
    want = (_flat_params(rank0), rank0["offset"])
    assert all(h == [want] * len(h) and h for h in held), oracle.side_by_side("params, buffer in each step", held)
    outputs = [[o for s in rank for o in s["outputs"]] for rank in steps]
    expected = [
        [_prediction(_flat_params(rank0), i, rank0["offset"]) for i in oracle.shard(n, world_size, r)] for r in (0, 1)
    ]
    assert [o for rank in outputs for o in rank] == pytest.approx([o for rank in expected for o in rank]), (
        oracle.side_by_side("outputs", outputs) + f"  expected {expected}"
    )
    after = [rec["after"] for rec in world.records]
    assert after == [_flat_params(rank0)] * world_size, oracle.side_by_side("params after the stage", after)
    semantics.number(f"rank 1's outputs in {stage}", str(outputs[1]), vs=("with its own weights", str(local)))


def _mse_gradient(params, ids) -> list:
    """Gradient ``[dw0, dw1, db]`` of the mean squared error of ``w . x + b`` against ``y`` over ``ids``."""
    errors = [(_prediction(params, i, 0.0) - regression_y(i), regression_x(i)) for i in ids]
    return [
        2 * oracle.mean(e * x[0] for e, x in errors),
        2 * oracle.mean(e * x[1] for e, x in errors),
        2 * oracle.mean(e for e, _ in errors),
    ]


def _manual_steps(n, world_size, batch_size, steps, lr, init, combine) -> tuple:
    """SGD over the first ``steps`` batches of each rank's shuffled shard; the gradient of each step is
    the ranks' gradients combined by ``combine`` (``"mean"``, ``"sum"``, or ``"local"``: each rank its own,
    returned for rank 0). Returns ``(gradient at each step, params after each step)``."""
    batches = [
        oracle.batches(oracle.distributed_sampler_ids(n, world_size, r, 0), batch_size) for r in range(world_size)
    ]
    params, grads, trajectory = list(init), [], []
    for k in range(steps):
        per_rank = [_mse_gradient(params, batches[r][k]) for r in range(world_size)]
        if combine == "mean":
            grad = [sum(col) / world_size for col in zip(*per_rank)]
        elif combine == "sum":
            grad = [sum(col) for col in zip(*per_rank)]
        else:
            grad = per_rank[0]
        params = [p - lr * g for p, g in zip(params, grad)]
        grads.append(grad)
        trajectory.append(params)
    return grads, trajectory


@pytest.mark.mirrors(
    "tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced",
    "tests_pytorch/trainer/optimization/test_manual_optimization.py::test_step_with_optimizer_closure_with_different_frequencies_ddp",
)
@pytest.mark.parametrize("world_size", [2, 3])
def test_manual_backward_averages_gradients_over_ranks_before_the_optimizer_step(run_world, semantics, world_size):
    """With ``automatic_optimization = False``, the gradient a rank reads right after
    ``self.manual_backward(loss)`` is already the mean over ranks of each rank's own gradient (each on
    its own shuffled shard), the same on every rank, so every rank's ``optimizer.step()`` leaves the same
    parameters; not the rank's own gradient, nor the sum. Mirrors Lightning's
    tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced (manual optimization case)
    and trainer/optimization/test_manual_optimization.py::
    test_step_with_optimizer_closure_with_different_frequencies_ddp, both on 2 GPUs only. Source:
    pytorch_lightning/core/module.py ``LightningModule.manual_backward``; torch/nn/parallel/distributed.py
    (the reducer's averaged all_reduce)."""
    n, batch_size, steps, lr = 12, 2, 2, 0.1
    world = run_world(gradients_and_weights.fit_manual, world_size, n=n, batch_size=batch_size, max_steps=steps, lr=lr)

    init = world.records[0]["init"]
    expected_grads, expected_params = _manual_steps(n, world_size, batch_size, steps, lr, init, "mean")
    summed, _ = _manual_steps(n, world_size, batch_size, steps, lr, init, "sum")
    local, _ = _manual_steps(n, world_size, batch_size, steps, lr, init, "local")
    oracle.assert_distinct(mean=expected_grads[0][0], sum=summed[0][0], rank0_local=local[0][0])
    grads = [rec["grads"] for rec in world.records]
    for r, got in enumerate(grads):
        assert [g for step in got for g in step] == pytest.approx(
            [g for step in expected_grads for g in step], rel=1e-5, abs=1e-6
        ), oracle.side_by_side("gradient after manual_backward", grads) + f"  expected (mean) {expected_grads}"
    params = [rec["params"] for rec in world.records]
    assert all(p == params[0] for p in params), oracle.side_by_side("params after each step", params)
    assert [v for step in params[0] for v in step] == pytest.approx(
        [v for step in expected_params for v in step], rel=1e-5, abs=1e-6
    )
    semantics.number("dw0 after manual_backward, step 1", grads[0][0][0], vs=("rank 0's own gradient", local[0][0]))


@pytest.mark.mirrors("tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced")
@pytest.mark.parametrize("world_size", [2, 3])
def test_with_static_graph_true_automatic_optimization_averages_every_steps_gradients_over_ranks(
    run_world, semantics, world_size
):
    """``DDPStrategy(static_graph=True)`` with automatic optimization: the wrapper Lightning builds holds
    ``static_graph=True``, and the gradient every rank holds before ``optimizer.step()`` (read in
    ``on_before_optimizer_step``) is, from the first step on, the mean over ranks of each rank's own
    gradient on its shuffled shard, computed here from the data; not the rank's own gradient, nor the
    sum; so the ranks' parameters stay equal. (Under manual optimization the same option lost the
    averaging before 2.6.0: tests/facts/test_manual_optimization_static_graph.py.) Mirrors Lightning's
    tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced (2 GPUs; automatic
    optimization with ``static_graph`` on and off). Source: pytorch_lightning/strategies/ddp.py
    ``DDPStrategy._setup_model`` (the strategy's kwargs passed to ``DistributedDataParallel``);
    torch/nn/parallel/distributed.py (``static_graph``: the first iteration's all_reduce delayed to the end
    of the backward)."""
    n, batch_size, steps, lr = 18, 2, 3, 0.1
    world = run_world(
        gradients_and_weights.fit_automatic,
        world_size,
        static_graph=True,
        n=n,
        batch_size=batch_size,
        max_steps=steps,
        lr=lr,
    )

    init = world.records[0]["init"]
    expected_grads, expected_params = _manual_steps(n, world_size, batch_size, steps, lr, init, "mean")
    summed, _ = _manual_steps(n, world_size, batch_size, steps, lr, init, "sum")
    local, _ = _manual_steps(n, world_size, batch_size, steps, lr, init, "local")
    oracle.assert_distinct(mean=expected_grads[0][0], sum=summed[0][0], rank0_local=local[0][0])
    assert [rec["static_graph"] for rec in world.records] == [True] * world_size
    grads = [rec["grads"] for rec in world.records]
    for got in grads:
        assert [g for step in got for g in step] == pytest.approx(
            [g for step in expected_grads for g in step], rel=1e-5, abs=1e-6
        ), oracle.side_by_side("gradient before optimizer.step()", grads) + f"  expected (mean) {expected_grads}"
    params = [rec["params"] for rec in world.records]
    assert all(p == params[0] for p in params), oracle.side_by_side("params after each step", params)
    assert [v for step in params[0] for v in step] == pytest.approx(
        [v for step in expected_params for v in step], rel=1e-5, abs=1e-6
    )
    semantics.number("dw0 at step 1, static_graph=True", grads[0][0][0], vs=("rank 0's own gradient", local[0][0]))


@pytest.mark.mirrors(
    "tests_pytorch/utilities/test_all_gather_grad.py::test_all_gather_ddp_spawn",
    "tests_pytorch/utilities/test_all_gather_grad.py::test_all_gather_sync_grads",
)
@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_with_sync_grads_gives_each_rank_the_sum_over_ranks_of_the_gradients_of_its_slice(
    run_world, semantics, world_size
):
    """Rank r gathers ``x_r = [r+1, 2(r+1)]`` with ``self.all_gather(x, sync_grads=True)`` into ``g`` of
    shape (W, 2), takes rank s's loss ``(s+1) * sum_k (k+1) * |g[k]|^2``, and differentiates it with
    respect to its own ``x_r``. The gradient is the sum over every rank s of ``d loss_s / d g[r] =
    2 (s+1)(r+1) x_r``, i.e. ``(r+1) W (W+1) x_r``: not the rank's own term ``2 (r+1)^2 x_r`` and not the
    mean over ranks. Mirrors Lightning's tests_pytorch/utilities/test_all_gather_grad.py::
    test_all_gather_ddp_spawn (3 CPU ranks) and ::test_all_gather_sync_grads (GPU). Source:
    lightning_fabric/utilities/distributed.py ``_AllGatherGrad.backward`` (``all_reduce`` of the
    gradient, then the rank's slice)."""
    world = run_world(gradients_and_weights.gather_with_grads, world_size, sync_grads=True)

    inputs = [gradients_and_weights.gathered_input(r) for r in range(world_size)]
    expected = [[(r + 1) * world_size * (world_size + 1) * v for v in inputs[r]] for r in range(world_size)]
    own = [[2 * (r + 1) ** 2 * v for v in inputs[r]] for r in range(world_size)]
    oracle.assert_distinct(summed=expected[0][0], own_loss_only=own[0][0], mean=expected[0][0] / world_size)
    gathered = [rec["gathered"] for rec in world.records]
    assert gathered == [inputs] * world_size, oracle.side_by_side("gathered", gathered)
    grads = [rec["grad"] for rec in world.records]
    assert [g for rank in grads for g in rank] == pytest.approx([g for rank in expected for g in rank]), (
        oracle.side_by_side("d loss / d x", grads) + f"  expected {expected}"
    )
    semantics.number("rank 0's gradient", grads[0][0], vs=("from its own loss only", own[0][0]))


@pytest.mark.mirrors("tests_pytorch/utilities/test_all_gather_grad.py::test_all_gather_ddp_spawn")
def test_all_gather_without_sync_grads_returns_a_tensor_no_gradient_flows_through(run_world, semantics):
    """The same with ``sync_grads=False`` (the default): ``self.all_gather`` returns the gathered values
    detached from the graph, so differentiating the loss raises on every rank ("does not require grad").
    Mirrors the ``sync_grads`` switch of Lightning's tests_pytorch/utilities/test_all_gather_grad.py.
    Source: lightning_fabric/utilities/distributed.py ``_gather_all_tensors`` (``torch.distributed.all_gather``
    into fresh tensors)."""
    world_size = 2
    world = run_world(gradients_and_weights.gather_with_grads, world_size, sync_grads=False)

    inputs = [gradients_and_weights.gathered_input(r) for r in range(world_size)]
    assert [rec["gathered"] for rec in world.records] == [inputs] * world_size
    errors = [rec["error"] for rec in world.records]
    assert [rec["grad"] for rec in world.records] == [None] * world_size, oracle.side_by_side("grad", errors)
    assert all(e and "does not require grad" in e for e in errors), oracle.side_by_side("error", errors)
    semantics.number("ranks where autograd.grad raised", sum(bool(e) for e in errors), vs=("world size", world_size))


@pytest.mark.mirrors(
    "tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_exception",
    "tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_spawn_raises",
)
def test_a_parameter_the_loss_does_not_use_fails_every_rank_at_the_second_step_with_lightnings_advice(
    run_world, semantics
):
    """A module with a ``Linear`` its loss never uses, under ``DDPStrategy(find_unused_parameters=False)``
    (the default): the first training step runs, and the second forward raises on every rank, with
    DDP's "Expected to have finished reduction in the prior iteration" replaced by Lightning's message
    naming ``strategy='ddp_find_unused_parameters_true'``. Mirrors Lightning's
    tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_exception and
    ::test_find_unused_parameters_ddp_spawn_raises (one rank). Source: pytorch_lightning/strategies/ddp.py
    ``DDPStrategy.on_exception`` (``_augment_message``); torch/nn/parallel/distributed.py
    ``_pre_forward`` (``_check_previous_reduction``)."""
    world_size = 2
    world = run_world(gradients_and_weights.fit_unused, world_size, find_unused_parameters=False)

    outcome = [(rec["steps"], rec["raised"]) for rec in world.records]
    assert outcome == [(1, "RuntimeError")] * world_size, oracle.side_by_side("steps run, raised", outcome)
    for rec in world.records:
        assert rec["message"].startswith("It looks like your LightningModule has parameters that were not used"), rec
        assert "ddp_find_unused_parameters_true" in rec["message"], rec["message"]
    semantics.number("training steps before the error", outcome[0][0], vs=("max_steps", 3))


@pytest.mark.mirrors("tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_exception")
def test_with_find_unused_parameters_true_the_same_module_trains_every_step(run_world, semantics):
    """The fix Lightning's message names: ``DDPStrategy(find_unused_parameters=True)`` lets the same module
    run all three steps on every rank. Source: torch/nn/parallel/distributed.py
    (``find_unused_parameters`` marks the unused parameters ready after each backward)."""
    world_size = 2
    world = run_world(gradients_and_weights.fit_unused, world_size, find_unused_parameters=True)

    outcome = [(rec["steps"], rec["raised"]) for rec in world.records]
    assert outcome == [(3, None)] * world_size, oracle.side_by_side("steps run, raised", outcome)
    semantics.number("training steps", outcome[0][0], vs=("without find_unused_parameters", 1))


@pytest.mark.mirrors("tests_pytorch/strategies/test_ddp.py::test_ddp_dont_configure_sync_batchnorm")
def test_sync_batchnorm_true_is_not_applied_in_validate_test_or_predict(run_world, semantics):
    """``Trainer(sync_batchnorm=True)`` converts ``BatchNorm*d`` to ``SyncBatchNorm`` for ``fit`` only: in
    ``validate``, ``test`` and ``predict`` every rank's steps run the module's own ``BatchNorm1d``, and it
    is still one when each stage returns (so on CPU, where ``fit`` refuses ``SyncBatchNorm``, these stages
    run). Mirrors Lightning's tests_pytorch/strategies/test_ddp.py::test_ddp_dont_configure_sync_batchnorm
    (one rank). Source: pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup`` (``if trainer_fn ==
    TrainerFn.FITTING and self._layer_sync``)."""
    world_size, stages = 2, ["validate", "test", "predict"]
    world = run_world(gradients_and_weights.batchnorm_classes, world_size, stages=stages)

    want = {"during": {s: ["BatchNorm1d"] for s in stages}, "after": {s: "BatchNorm1d" for s in stages}}
    got = world.records
    assert got == [want] * world_size, oracle.side_by_side("batch-norm classes", got)
    semantics.number("stages run with SyncBatchNorm outside fit", sum("SyncBatchNorm" in str(r) for r in got))
