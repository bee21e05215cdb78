"""Which weights and layers do ``validate``, ``test`` and ``predict`` run with under DDP? Rank 0's parameters
and buffers, broadcast to every rank, in the plain module: no ``DistributedDataParallel`` wrapper and no
``SyncBatchNorm``.

Outside ``fit`` Lightning does not wrap the module in ``DistributedDataParallel`` ("there's no gradients to
reduce") but broadcasts rank 0's parameters and buffers to every rank at setup
(pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup``, ``_sync_module_states``); ``sync_batchnorm=True``
converts the layers for ``fit`` only and reverts them when it returns (``DDPStrategy.teardown``).

The module is ``Linear(2, 1)`` on ``RegressionDataset`` (``x = [id / 4, ±1]``, ``y = id % 3 - 1``;
ddpprobe/probes/gradients_and_weights.py); expected numbers are computed here from the data in float64.
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import gradients_and_weights
from ddpprobe.probes.training import regression_x
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


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors(
    "tests_pytorch/parity_pytorch/test_sync_batchnorm_parity.py::test_sync_batchnorm_parity",
    "tests_pytorch/strategies/test_ddp.py::test_ddp_dont_configure_sync_batchnorm",
)
def test_sync_batchnorm_runs_in_fit_and_is_reverted_to_batchnorm_when_fit_returns_on_two_gpus(run_world, semantics):
    """GPU only (``SyncBatchNorm`` needs CUDA): with ``Trainer(sync_batchnorm=True)`` the training steps run
    ``SyncBatchNorm`` on every rank, and when ``fit`` returns the module holds a ``BatchNorm1d`` again; a
    ``validate`` after it runs ``BatchNorm1d``. Mirrors Lightning's tests_pytorch/parity_pytorch/
    test_sync_batchnorm_parity.py::test_sync_batchnorm_parity (the revert) and strategies/test_ddp.py::
    test_ddp_dont_configure_sync_batchnorm. Source: pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup``
    and ``teardown`` (``self._layer_sync.revert``); pytorch_lightning/plugins/layer_sync.py ``TorchSyncBatchNorm``."""
    world_size = 2
    world = run_world(gradients_and_weights.batchnorm_classes, world_size, stages=["fit", "validate"])

    want = {
        "during": {"fit": ["SyncBatchNorm"], "validate": ["BatchNorm1d"]},
        "after": {"fit": "BatchNorm1d", "validate": "BatchNorm1d"},
    }
    assert world.records == [want] * world_size, world.records
    semantics.number("layer class after fit", world.records[0]["after"]["fit"], vs=("during fit", "SyncBatchNorm"))
