"""Manual optimization with ``DDPStrategy(static_graph=True)``: are the gradients averaged across ranks?

DDP averages gradients inside ``backward``; with ``static_graph=True`` its first iteration delays the
all_reduce until the whole graph has been seen, and Lightning's manual optimization path
(``self.manual_backward``) did not set it off before 2.6.0 (Lightning #18086): the gradients stayed
rank-local, and the ranks' parameters drifted apart. Since 2.6.0 ``DDPStrategy.post_backward`` calls
``reducer._delay_all_reduce()`` after the first manual backward (PR #21251), and every step's gradients
are the mean over the ranks, as with ``static_graph=False``.

``Linear(2, 1)`` from fixed weights, SGD (lr 0.05), 3 steps of batch 2 over ``RegressionDataset(18)``
(x = [id / 4, +-1], y = id % 3 - 1), each rank its shuffled ``DistributedSampler`` shard (seed 0). The
expected gradients and parameters are computed here from the data: the mean squared error's gradient
of each rank's batch, combined as the mean over ranks or kept per rank. The probe is
ddpprobe/probes/manual_ddp_options.py.
Sources: pytorch_lightning/strategies/ddp.py ``DDPStrategy.pre_backward``, ``post_backward``;
pytorch_lightning/core/module.py ``LightningModule.manual_backward``; torch/nn/parallel/distributed.py
(``static_graph``, ``_DDPSink``, ``_delay_all_reduce``).
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import manual_ddp_options as manual
from ddpprobe.probes.training import INIT_BIAS, INIT_WEIGHT, regression_x, regression_y
from tests.support import oracle

N, BATCH_SIZE, STEPS, LR = 18, 2, 3, 0.05


def _gradient(params, ids) -> list:
    """``[dw0, dw1, db]`` of the mean squared error of ``w . x + b`` against ``y`` over the batch ``ids``."""
    w0, w1, b = params
    errors = [(w0 * regression_x(i)[0] + w1 * regression_x(i)[1] + b - regression_y(i), regression_x(i)) for i in ids]
    return [
        2 * oracle.mean(e * x[0] for e, x in errors),
        2 * oracle.mean(e * x[1] for e, x in errors),
        2 * oracle.mean(e for e, _ in errors),
    ]


def _batches(world_size: int) -> list:
    """``[rank][step] -> ids`` of each rank's shuffled shard (epoch 0, seed 0), cut into batches."""
    return [
        oracle.batches(oracle.distributed_sampler_ids(N, world_size, r, shuffle=True, seed=0), BATCH_SIZE)[:STEPS]
        for r in range(world_size)
    ]


def _sgd(world_size: int, averaged: bool) -> tuple:
    """``(grads, params)``, each ``[rank][step] -> [3 floats]``: SGD from the initial weights with each step's
    gradient the mean over ranks (``averaged``) or each rank's own, at that rank's parameters."""
    batches = _batches(world_size)
    held = [INIT_WEIGHT[0] + INIT_BIAS for _ in range(world_size)]
    grads, params = [[] for _ in range(world_size)], [[] for _ in range(world_size)]
    for step in range(STEPS):
        local = [_gradient(held[r], batches[r][step]) for r in range(world_size)]
        if averaged:
            mean = [sum(col) / world_size for col in zip(*local)]
            local = [mean] * world_size
        held = [[p - LR * g for p, g in zip(held[r], local[r])] for r in range(world_size)]
        for r in range(world_size):
            grads[r].append(local[r])
            params[r].append(held[r])
    return grads, params


def _flat(nested) -> list:
    return [x for rank in nested for step in rank for x in step]


def _check_shards(world, world_size: int) -> None:
    seen = [rec["train_ids"] for rec in world.records]
    assert seen == _batches(world_size), oracle.side_by_side("batches", seen) + f"  expected {_batches(world_size)}"


def _assert_averaged(world, semantics, world_size: int, static_graph: bool) -> None:
    _check_shards(world, world_size)
    averaged, averaged_params = _sgd(world_size, averaged=True)
    local, _ = _sgd(world_size, averaged=False)
    oracle.assert_distinct(averaged=averaged[0][0][0], rank0_local=local[0][0][0], rank1_local=local[1][0][0])
    grads = [rec["grads"] for rec in world.records]
    semantics.number("rank 0's first dw0", grads[0][0][0], vs=("rank 0's own batch", local[0][0][0]))
    assert _flat(grads) == pytest.approx(_flat(averaged), rel=1e-5), (
        oracle.side_by_side("grads", grads) + f"  expected (mean over ranks) {averaged}"
    )
    params = [rec["params"] for rec in world.records]
    assert _flat(params) == pytest.approx(_flat(averaged_params), rel=1e-5), oracle.side_by_side("params", params)
    assert [rec["static_graph"] for rec in world.records] == [static_graph] * world_size


@run_if(lightning=">=2.6")
@pytest.mark.parametrize("world_size", [2, 3])
def test_manual_backward_with_static_graph_true_averages_every_steps_gradients_from_the_first_step(
    run_world, semantics, world_size
):
    """``self.manual_backward(loss)`` under ``DDPStrategy(static_graph=True)``: from the first step on, each
    rank's ``.grad`` after the backward is the mean of the ranks' batch gradients, so every rank applies
    the same update and holds the same parameters."""
    world = run_world(manual.fit_manual, world_size, static_graph=True, n=N, batch_size=BATCH_SIZE)
    _assert_averaged(world, semantics, world_size, static_graph=True)


@pytest.mark.parametrize("world_size", [2, 3])
def test_manual_backward_with_static_graph_false_averages_every_steps_gradients(run_world, semantics, world_size):
    """The control, on every release: with ``static_graph=False`` (the default) each rank's ``.grad`` after
    ``self.manual_backward`` is the mean of the ranks' batch gradients at every step (DDP's reducer fires
    during the backward), and the ranks' parameters stay identical. Source: ddp.py ``pre_backward``
    (``prepare_for_backward``)."""
    world = run_world(manual.fit_manual, world_size, static_graph=False, n=N, batch_size=BATCH_SIZE)
    _assert_averaged(world, semantics, world_size, static_graph=False)


@run_if(lightning="<2.6")
@pytest.mark.parametrize("world_size", [2, 3])
def test_before_2_6_manual_backward_with_static_graph_true_leaves_every_rank_its_own_gradients(
    run_world, semantics, world_size
):
    """Before 2.6.0 (Lightning #18086): with ``static_graph=True`` and manual optimization, no step's
    gradients were averaged (checked on 2.5.1, first 3 steps): each rank's ``.grad`` is its own batch's
    gradient at its own parameters, and the ranks' parameters drift apart from the first step."""
    world = run_world(manual.fit_manual, world_size, static_graph=True, n=N, batch_size=BATCH_SIZE)

    _check_shards(world, world_size)
    local, local_params = _sgd(world_size, averaged=False)
    averaged, _ = _sgd(world_size, averaged=True)
    oracle.assert_distinct(averaged=averaged[0][0][0], rank0_local=local[0][0][0], rank1_local=local[1][0][0])
    grads = [rec["grads"] for rec in world.records]
    semantics.number("rank 0's first dw0", grads[0][0][0], vs=("the mean over ranks", averaged[0][0][0]))
    assert _flat(grads) == pytest.approx(_flat(local), rel=1e-5), (
        oracle.side_by_side("grads", grads) + f"  expected (each rank's own) {local}"
    )
    params = [rec["params"] for rec in world.records]
    assert _flat(params) == pytest.approx(_flat(local_params), rel=1e-5), oracle.side_by_side("params", params)
