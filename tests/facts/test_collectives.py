"""Collectives from a LightningModule: what ``self.all_gather`` returns, and what happens when the ranks
do not all enter the same collective with the same shapes.

``self.all_gather(x)`` is a collective: every rank calls it and every rank gets every rank's ``x``,
stacked along a new first dimension in rank order — shape ``(W, *x.shape)``. Under
``strategy="ddp"`` that holds even for one device (W = 1); only a non-distributed run (a single-device
strategy) returns ``x`` unchanged. The ranks must send equal shapes: with gloo, a rank whose buffer is
too small for a peer's block aborts. A pad-gather-trim helper (``collectives.all_gather_uneven``)
gathers uneven first dimensions correctly.

A collective entered by some ranks only never completes. ``self.log(..., sync_dist=True)`` is one
(an all_reduce when the epoch-level value is computed), so calling it under ``if self.global_rank == 0``
leaves rank 0 waiting for peers that never come; ``rank_zero_only=True`` turns the sync off.

``self.all_gather(x, sync_grads=True)`` is differentiable: its backward all-reduces (sums) the gradients of
the gathered tensor and hands each rank its own slice (lightning_fabric/utilities/distributed.py
``_AllGatherGrad``); without ``sync_grads`` no gradient flows through it.

Beside ``self.all_gather``: ``trainer.strategy.broadcast(obj)`` pickles rank 0's object to every rank
(``broadcast_object_list``) and leaves the caller's object as it was (pytorch_lightning/strategies/ddp.py), and
Lightning's private ``_gather_all_tensors`` gathers the shapes first, pads every tensor to the largest, gathers
and trims (lightning_fabric/utilities/distributed.py), so it gathers tensors of different shapes.

Sources: pytorch_lightning/core/module.py ``LightningModule.all_gather``;
lightning_fabric/utilities/distributed.py ``_all_gather_ddp_if_available``;
pytorch_lightning/strategies/single_device.py ``SingleDeviceStrategy.all_gather``;
pytorch_lightning/trainer/connectors/logger_connector/result.py ``_Sync``, ``_ResultMetric.compute``;
upstream issues Lightning-AI/pytorch-lightning#19195 (all_gather at world size 1, documented in #19469)
and #7773 (all_gather of uneven shapes, open). The probe is ddpprobe/probes/collectives.py.
"""

import pytest

from ddpprobe import RankDied, RankFailed, WorldTimeout
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import collectives, gradients_and_weights, strategy_and_fabric_collectives
from tests.support import gloo, oracle


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_all_gather_stacks_every_ranks_tensor_along_a_new_first_dimension_in_rank_order(
    run_world, semantics, world_size
):
    """``self.all_gather(x)`` under ``strategy="ddp"`` returns shape ``(W, *x.shape)``, block ``r`` being
    rank ``r``'s ``x``, on every rank: for a (2, 3) tensor -> (W, 2, 3); for a 0-d tensor and for a
    Python float (converted to a 0-d tensor first) -> (W,); for a dict, each value gathered that way.
    ``_all_gather_ddp_if_available`` calls ``torch.distributed.nn.functional.all_gather`` and
    ``torch.stack``s the list, so W = 1 also gets the leading dimension."""
    world = run_world(collectives.collective, world_size, action="shapes")

    tensor = {
        "shape": [world_size, *collectives.LOCAL_SHAPE],
        "values": [collectives.local_tensor(r).tolist() for r in range(world_size)],
    }
    scalar = {"shape": [world_size], "values": [collectives.local_scalar(r) for r in range(world_size)]}
    expected = {"tensor": tensor, "scalar_tensor": scalar, "python_float": scalar, "dict": {"s": scalar, "t": tensor}}
    results = [rec["result"] for rec in world.records]
    semantics.number(
        "gathered shape of a (2, 3) tensor",
        str(results[0]["tensor"]["shape"]),
        vs=("x.shape", str(list(collectives.LOCAL_SHAPE))),
    )
    assert results == [expected] * world_size, (
        oracle.side_by_side("tensor shape", [res["tensor"]["shape"] for res in results])
        + "   "
        + oracle.side_by_side("scalar gathered", [res["scalar_tensor"] for res in results])
        + f"   expected {expected['tensor']['shape']} and {scalar}"
    )
    assert {rec["strategy"] for rec in world.records} == {"DDPStrategy"}


def test_with_ddp_and_one_device_all_gather_adds_a_dimension_of_1_but_a_non_distributed_run_adds_none(
    run_world, semantics
):
    """``LightningModule.all_gather``'s docstring says that "for the special case where world_size is 1,
    no additional dimension is added". That is a property of the strategy, not of the world size:
    ``Trainer(strategy="ddp", devices=1)`` initialises a process group of one rank and
    ``_all_gather_ddp_if_available`` stacks -> (1, 2, 3) and (1,); ``Trainer(accelerator="cpu",
    devices=1, strategy="auto")`` picks ``SingleDeviceStrategy``, whose ``all_gather`` returns its input
    -> (2, 3) and () (a Python float becomes a 0-d tensor). Upstream: #19195, documented in #19469."""
    ddp = run_world(collectives.collective, 1, action="shapes", strategy="ddp").records[0]
    single = run_world(collectives.collective, 1, action="shapes", strategy="auto").records[0]

    local, scalar = collectives.local_tensor(0), collectives.local_scalar(0)
    semantics.number(
        "gathered shape with ddp at W=1",
        str(ddp["result"]["tensor"]["shape"]),
        vs=("without DDP", str(single["result"]["tensor"]["shape"])),
    )
    assert (ddp["strategy"], ddp["process_group"]) == ("DDPStrategy", True)
    assert ddp["result"]["tensor"] == {"shape": [1, *local.shape], "values": [local.tolist()]}
    assert ddp["result"]["python_float"] == {"shape": [1], "values": [scalar]}

    assert (single["strategy"], single["process_group"]) == ("SingleDeviceStrategy", False)
    assert single["result"]["tensor"] == {"shape": list(local.shape), "values": local.tolist()}
    assert single["result"]["scalar_tensor"] == {"shape": [], "values": scalar}
    assert single["result"]["python_float"] == {"shape": [], "values": scalar}
    assert single["result"]["dict"] == {
        "s": {"shape": [], "values": scalar},
        "t": {"shape": list(local.shape), "values": local.tolist()},
    }


@run_if(backend="gloo")  # asserts how gloo reports a broken collective; NCCL fails differently
@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_of_different_first_dimensions_fails_with_gloo_and_is_reported_not_hung(
    run_world, semantics, world_size
):
    """Rank ``r`` all-gathers a tensor of ``r + 1`` rows. ``torch.distributed.nn.functional.all_gather``
    gives each rank receive buffers shaped like its *own* tensor, so rank 0 (1 row, the smallest) gets
    blocks larger than its buffers; gloo's TCP transport checks every received message against the
    buffer (``op.preamble.length <= op.nbytes``) and throws ``gloo::EnforceNotMet`` ("Received data size
    doesn't match expected size") in a background thread, which terminates rank 0 (SIGABRT). The
    launcher reports the world as failed well before its timeout: ``RankDied`` (rank 0's abort) or,
    when a peer's broken read reaches the launcher first, ``RankFailed`` from that peer; never a
    ``WorldTimeout``. Upstream feature request for uneven all_gather: #7773."""
    with pytest.raises((RankDied, RankFailed, WorldTimeout)) as failure:
        run_world(collectives.collective, world_size, action="uneven", timeout=8, pg_timeout=5)

    err = failure.value
    semantics.number("reported as", type(err).__name__, vs=("world timeout", "8 s"))
    assert not isinstance(err, WorldTimeout), f"the world hung until its timeout instead of failing:\n{err}"
    rank0_report = err.outputs[0][1] + str(err)
    assert gloo.error_kind(rank0_report) == gloo.SIZE_MISMATCH, rank0_report[-3000:]
    if isinstance(err, RankDied):
        assert err.ranks == [0] and err.exitcodes[0] == -6, f"{err.ranks} {err.exitcodes}"


@pytest.mark.parametrize("world_size, strategy", [(1, "ddp"), (2, "ddp"), (3, "ddp"), (1, "auto")])
def test_pad_gather_trim_returns_every_ranks_rows_for_uneven_first_dimensions(
    run_world, semantics, world_size, strategy
):
    """``collectives.all_gather_uneven`` (all_gather the sizes, pad to the largest, all_gather, trim)
    gives every rank the list of all ranks' tensors, rank ``r``'s with its own ``r + 1`` rows and no
    padding row left, under DDP at W = 1, 2, 3 and in a non-distributed run (where ``all_gather`` adds
    no leading dimension)."""
    world = run_world(collectives.collective, world_size, action="pad_trim", strategy=strategy)

    expected = [collectives.uneven_rows(r).tolist() for r in range(world_size)]
    got = [rec["result"]["gathered"] for rec in world.records]
    semantics.number(
        "rows per rank gathered on rank 0",
        str([len(t) for t in got[0]]),
        vs=("expected", str([len(t) for t in expected])),
    )
    assert got == [expected] * world_size, oracle.side_by_side("gathered", got) + f"  expected {expected}"


@run_if(backend="gloo")  # asserts how gloo reports a broken collective; NCCL fails differently
@pytest.mark.parametrize("world_size", [2, 3])
def test_sync_dist_logging_under_if_global_rank_0_leaves_rank_0_alone_in_the_all_reduce(
    run_world, semantics, world_size
):
    """``if self.global_rank == 0: self.log("rank0_value", v, sync_dist=True)`` in
    ``on_validation_epoch_end``: only rank 0 holds the value, so only rank 0 all-reduces it when the
    logger connector computes epoch metrics (``_ResultMetric.compute`` -> ``_Sync`` ->
    ``strategy.reduce``). The other ranks never enter that collective: they finish ``trainer.validate``
    and leave the process group, and rank 0's all_reduce fails at once with gloo's "Connection closed by
    peer" (or "reset by peer": tests/support/gloo.py), not a process-group timeout. The launcher reports
    ``RankFailed`` naming rank 0 only, with a traceback through the epoch-end metric sync; every other
    rank finished."""
    with pytest.raises(RankFailed) as failure:
        run_world(collectives.collective, world_size, action="log_rank0", timeout=10, pg_timeout=5)

    err = failure.value
    semantics.number("failed ranks", str(err.ranks), vs=("world size", world_size))
    assert err.ranks == [0] and err.exc_types == {0: "RuntimeError"}, f"{err.ranks} {err.exc_types}\n{err}"
    traceback = err.tracebacks[0]
    assert "logger_connector" in traceback and "compute" in traceback and "_sync_ddp" in traceback, traceback
    assert gloo.error_kind(err.rank_errors[0]) == gloo.PEER_GONE, err.rank_errors[0]
    assert "did not finish" not in str(err), str(err)


@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_zero_only_logging_under_if_global_rank_0_completes_and_only_rank_0_holds_the_value(
    run_world, semantics, world_size
):
    """The same call with ``rank_zero_only=True``: ``_Sync`` replaces the reduction with a no-op, so no
    collective is entered, the run completes, rank 0's ``callback_metrics`` holds its own value and the
    other ranks hold nothing under that name."""
    world = run_world(collectives.collective, world_size, action="log_rank0", log_rank_zero_only=True)

    own = collectives.local_scalar(0)
    oracle.assert_distinct(rank0_value=own, mean_with_absent_ranks_as_zero=own / world_size)
    got = [rec["callback_metrics"] for rec in world.records]
    semantics.number(
        "rank 0's value", got[0].get("rank0_value"), vs=("mean with absent ranks as zero", own / world_size)
    )
    assert got == [{"rank0_value": own}] + [{}] * (world_size - 1), oracle.side_by_side("callback_metrics", got)


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


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors("tests_pytorch/utilities/test_all_gather_grad.py::test_all_gather_sync_grads")
def test_all_gather_with_sync_grads_sums_the_gradients_over_two_gpus(run_world, semantics):
    """test_collectives.py::test_all_gather_with_sync_grads_gives_each_rank_the_sum_over_ranks_of_the_gradients_of_its_slice
    at W=2 over NCCL. Mirrors tests_pytorch/utilities/test_all_gather_grad.py::test_all_gather_sync_grads."""
    test_all_gather_with_sync_grads_gives_each_rank_the_sum_over_ranks_of_the_gradients_of_its_slice(
        run_world, semantics, 2
    )


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


@pytest.mark.mirrors("tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp", row=26)
@pytest.mark.parametrize("world_size", [2, 3])
def test_strategy_broadcast_returns_rank_0s_object_everywhere_and_leaves_each_ranks_input_as_it_was(
    run_world, semantics, world_size
):
    """``trainer.strategy.broadcast({"rank": r, "names": [...]})``: every rank gets rank 0's dict back, and
    the dict each rank passed in still holds its own rank. Mirrors Lightning's tests_pytorch/checkpointing/
    test_checkpoint_callback_frequency.py::test_top_k_ddp (its broadcast check; 2 GPUs). Source:
    pytorch_lightning/strategies/ddp.py ``DDPStrategy.broadcast`` (``broadcast_object_list`` of a new list)."""
    world = run_world(strategy_and_fabric_collectives.evaluate_collectives, world_size)

    got = [rec["broadcast"] for rec in world.records]
    assert got == [{"rank": 0, "names": ["from rank 0"]}] * world_size, oracle.side_by_side("broadcast", got)
    inputs = [rec["input_after"] for rec in world.records]
    assert inputs == [{"rank": r, "names": [f"from rank {r}"]} for r in range(world_size)], oracle.side_by_side(
        "input after", inputs
    )
    semantics.number("ranks holding rank 0's object", sum(g["rank"] == 0 for g in got), vs=("world size", world_size))


@pytest.mark.mirrors("tests_fabric/utilities/test_distributed.py::test_collective_operations", row=25)
@pytest.mark.parametrize("world_size", [2, 3])
def test_gather_all_tensors_gathers_tensors_whose_shapes_differ_between_ranks(run_world, semantics, world_size):
    """Lightning's private ``_gather_all_tensors`` of ``arange(r)`` (empty on rank 0) and of ``full((r+1,
    2-r), r)`` returns, on every rank, each rank's tensor with its own shape and values: no padding left,
    nothing cut. Mirrors Lightning's tests_fabric/utilities/test_distributed.py::test_collective_operations
    [_test_all_gather_uneven_tensors, _test_all_gather_uneven_tensors_multidim] (2 CPU ranks). Source:
    lightning_fabric/utilities/distributed.py ``_gather_all_tensors`` (gathers sizes, pads to the maximum,
    trims each slice back)."""
    world = run_world(strategy_and_fabric_collectives.evaluate_collectives, world_size)

    expected = [[t.tolist() for t in strategy_and_fabric_collectives.uneven_tensors(r)] for r in range(world_size)]
    shapes = {tuple(strategy_and_fabric_collectives.uneven_tensors(r)[1].shape) for r in range(world_size)}
    assert len(shapes) == world_size, "the ranks' 2-D shapes must differ for the fact to test uneven gathers"
    for rec in world.records:
        assert rec["gathered_1d"] == [e[0] for e in expected], oracle.side_by_side(
            "1-D gathered", [r["gathered_1d"] for r in world.records]
        )
        assert rec["gathered_2d"] == [e[1] for e in expected], oracle.side_by_side(
            "2-D gathered", [r["gathered_2d"] for r in world.records]
        )
    semantics.number("elements gathered (1-D)", sum(len(x) for x in world.records[0]["gathered_1d"]))
