"""The training loop under DDP: what ``trainer.fit`` synchronizes, what it shuffles, and what it warns.

- **Gradients** are all-reduced and averaged during ``backward``, so after every optimizer step each
  rank holds the same parameters although each rank computed its loss on its own shard.
  Source: torch/nn/parallel/distributed.py (the reducer's gradient all_reduce, divided by the world
  size); Lightning wraps the module in it in pytorch_lightning/strategies/ddp.py ``DDPStrategy._setup_model``.
  So do ``manual_backward`` in manual optimization, which runs the backward through the DDP-wrapped module
  (pytorch_lightning/core/module.py ``manual_backward`` -> ``strategy.backward``), and automatic
  optimization with ``DDPStrategy(static_graph=True)``.
- **Buffers** (batch norm's ``running_mean``/``running_var``) are *not* averaged: DDP broadcasts rank
  0's buffers at the start of each forward (``broadcast_buffers``/``forward_sync_buffers`` default
  ``True``), then every rank updates them with its own batch. ``Trainer(sync_batchnorm=True)`` swaps in
  ``SyncBatchNorm``, which computes the statistics over the global batch — on GPUs only.
- **The training sampler** is a shuffling ``DistributedSampler`` whatever the user's ``DataLoader``
  says (unless ``Trainer(overfit_batches=...)``: tests/facts/test_samplers_rewrapped.py), seeded with
  ``PL_GLOBAL_SEED`` (0 without ``seed_everything``) and reshuffled every epoch by ``set_epoch``;
  validation keeps the user's order.
- **Epoch-level ``self.log(..., sync_dist=True)``** from ``training_step`` is already reduced over the
  epoch and the ranks when ``on_train_epoch_end`` reads ``trainer.callback_metrics``.
- **The ``DistributedSampler`` PossibleUserWarning** is raised by ``trainer.validate()`` and
  ``trainer.test()``, not by the validation loop inside ``fit``.

The probe is ddpprobe/probes/training.py: a ``Linear(2, 1)`` with fixed initial weights, plain SGD on
the mean squared error over ``RegressionDataset`` (``x = [id / 4, ±1]``, ``y = id % 3 - 1``).
Expected numbers come from the data, torch's own ``DistributedSampler`` and the SGD and batch-norm
update rules, computed here in float64.
"""

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import gradients_and_weights, training
from ddpprobe.probes.training import INIT_BIAS, INIT_WEIGHT, regression_x, regression_y
from tests.support import oracle

# ---------------------------------------------------------------------------------------------
# Oracle: the optimizer steps the ranks take, computed from the data
# ---------------------------------------------------------------------------------------------


def _train_batches(n, world_size, rank, epoch, batch_size, seed=0) -> list:
    """Batches of ids rank ``rank``'s ``training_step`` gets in ``epoch`` (shuffling DistributedSampler)."""
    ids = oracle.distributed_sampler_ids(n, world_size, rank, epoch, shuffle=True, seed=seed)
    return oracle.batches(ids, batch_size)


def _steps(n, world_size, batch_size, epochs) -> list:
    """One entry per optimizer step: ``[batch of rank 0, batch of rank 1, ...]`` (every rank has the
    same number of batches, because ``DistributedSampler`` pads every shard to the same length)."""
    steps = []
    for epoch in range(epochs):
        per_rank = [_train_batches(n, world_size, r, epoch, batch_size) for r in range(world_size)]
        steps += [[per_rank[r][k] for r in range(world_size)] for k in range(len(per_rank[0]))]
    return steps


def _mse_and_gradient(params, ids) -> tuple:
    """Mean squared error of ``w . x + b`` against ``y`` over ``ids`` and its gradient ``[dw0, dw1, db]``."""
    w0, w1, b = params
    errors = [(w0 * regression_x(i)[0] + w1 * regression_x(i)[1] + b - regression_y(i), regression_x(i)) for i in ids]
    loss = oracle.mean(e * e for e, _ in errors)
    grad = [
        2 * oracle.mean(e * x[0] for e, x in errors),
        2 * oracle.mean(e * x[1] for e, x in errors),
        2 * oracle.mean(e for e, _ in errors),
    ]
    return loss, grad


def _sgd(n, world_size, batch_size, epochs, lr, combine="mean") -> tuple:
    """SGD from ``INIT_WEIGHT``/``INIT_BIAS`` with the ranks' gradients combined by ``combine``:
    ``"mean"`` (DDP), ``"sum"``, or ``"rank0"`` (rank 0's gradient only: no synchronization, as rank 0
    would see it). Returns ``(params after each step, [loss of each rank] at each step)``."""
    params = INIT_WEIGHT[0] + INIT_BIAS
    trajectory, losses = [], []
    for batches in _steps(n, world_size, batch_size, epochs):
        results = [_mse_and_gradient(params, ids) for ids in batches]
        grads = [g for _, g in results]
        if combine == "mean":
            grad = [sum(col) / world_size for col in zip(*grads)]
        elif combine == "sum":
            grad = [sum(col) for col in zip(*grads)]
        else:
            grad = grads[0]
        params = [p - lr * g for p, g in zip(params, grad)]
        trajectory.append(params)
        losses.append([loss for loss, _ in results])
    return trajectory, losses


# ---------------------------------------------------------------------------------------------
# Oracle: batch-norm running statistics under each candidate synchronization rule
# ---------------------------------------------------------------------------------------------


def _running_stats(n, world_size, batch_size, epochs, momentum, rule) -> list:
    """Running statistics each rank holds after its forward of each training step, as
    ``[[(mean, var) of rank r] per step]``, from ``running_mean = 0``, ``running_var = 1``.

    Rules: ``"broadcast"`` (DDP: every rank starts the step from rank 0's buffers, then updates them
    with its own batch), ``"local"`` (no synchronization), ``"average"`` (each rank's update, averaged
    over ranks), ``"global"`` (one update with the statistics of all ranks' batches together:
    SyncBatchNorm)."""
    channels = len(regression_x(0))
    held = [([0.0] * channels, [1.0] * channels) for _ in range(world_size)]
    out = []
    for batches in _steps(n, world_size, batch_size, epochs):
        rows = [[regression_x(i) for i in ids] for ids in batches]
        if rule == "broadcast":
            held = [oracle.batch_norm_update(*held[0], rows[r], momentum) for r in range(world_size)]
        elif rule == "local":
            held = [oracle.batch_norm_update(*held[r], rows[r], momentum) for r in range(world_size)]
        elif rule == "average":
            updates = [oracle.batch_norm_update(*held[0], rows[r], momentum) for r in range(world_size)]
            avg = tuple([sum(col) / world_size for col in zip(*(u[k] for u in updates))] for k in (0, 1))
            held = [avg] * world_size
        else:
            everything = [row for rank_rows in rows for row in rank_rows]
            held = [oracle.batch_norm_update(*held[0], everything, momentum)] * world_size
        out.append(held)
    return out


def _flatten(nested) -> list:
    """Nested lists/tuples of numbers -> one flat list (``pytest.approx`` compares flat sequences only)."""
    if isinstance(nested, (list, tuple)):
        return [x for item in nested for x in _flatten(item)]
    return [nested]


def _as_stats(recorded: dict) -> tuple:
    return recorded["mean"], recorded["var"]


def _flat(stats) -> list:
    mean, var = stats
    return list(mean) + list(var)


# ---------------------------------------------------------------------------------------------
# 1. Gradients: all-reduced and averaged
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_gradients_are_averaged_over_ranks_so_every_rank_holds_the_same_parameters_after_each_step(
    run_world, semantics, world_size
):
    """Each rank computes the loss on its own shard, so the losses differ by rank; DDP all-reduces the
    gradients during ``backward`` and divides by the world size, so every rank applies the *mean* of
    the ranks' gradients and holds bit-identical parameters after every SGD step. The expected
    parameters are SGD steps from the fixed initial weights with the mean gradient, computed from the
    ids each rank's shard holds; a sum of gradients, or rank 0's gradient alone, gives other numbers.
    Source: torch/nn/parallel/distributed.py (``DistributedDataParallel`` docs: "the gradients between
    different nodes are averaged"); pytorch_lightning/strategies/ddp.py ``DDPStrategy._setup_model``
    wraps the LightningModule in it."""
    n, batch_size, epochs, lr = 7, 2, 2, 0.05
    world = run_world(training.fit_regression, world_size, n=n, batch_size=batch_size, max_epochs=epochs, lr=lr)

    expected, expected_losses = _sgd(n, world_size, batch_size, epochs, lr, "mean")
    if world_size > 1:
        summed, _ = _sgd(n, world_size, batch_size, epochs, lr, "sum")
        rank0_only, _ = _sgd(n, world_size, batch_size, epochs, lr, "rank0")
        oracle.assert_distinct(mean=expected[0][0], sum=summed[0][0], rank0_only=rank0_only[0][0])
        oracle.assert_distinct(**{f"rank{r}_first_loss": expected_losses[0][r] for r in range(world_size)})

    params = [rank.record["params"] for rank in world]
    semantics.number(
        "first parameter after step 1",
        params[0][0][0],
        vs=("with summed gradients", _sgd(n, world_size, batch_size, epochs, lr, "sum")[0][0][0]),
    )
    assert all(p == params[0] for p in params), oracle.side_by_side("params after each step", params)
    for rank in world:
        assert len(rank.record["params"]) == len(expected)
        assert _flatten(rank.record["params"]) == pytest.approx(_flatten(expected), rel=1e-5, abs=1e-6), (
            oracle.side_by_side("params after each step", params) + f"  expected (mean gradient) {expected}"
        )
    losses = [rank.record["losses"] for rank in world]
    expected_per_rank = [[step[r] for step in expected_losses] for r in range(world_size)]
    assert [len(x) for x in losses] == [len(x) for x in expected_per_rank]
    assert _flatten(losses) == pytest.approx(_flatten(expected_per_rank), rel=1e-5), (
        oracle.side_by_side("loss of each step", losses) + f"  expected {expected_per_rank}"
    )


# ---------------------------------------------------------------------------------------------
# 2. Buffers: broadcast from rank 0, not averaged; SyncBatchNorm
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_batchnorm_running_stats_are_broadcast_from_rank_0_before_each_forward_then_updated_with_the_ranks_own_batch(
    run_world, semantics, world_size
):
    """``BatchNorm1d(momentum=0.5)`` under DDP: buffers are not averaged. At the start of every forward
    DDP broadcasts rank 0's buffers to all ranks, then each rank's own forward updates them with its
    own batch: after step t rank r holds ``0.5 * (rank 0's stats after step t-1) + 0.5 * (rank r's
    batch stats)`` (variance unbiased). So at the end of ``fit`` the ranks hold *different* running
    statistics, each one broadcast step behind rank 0's. Rank 0 keeps its own running average.
    Source: torch/nn/parallel/distributed.py ``_pre_forward`` -> ``_sync_buffers`` (authoritative rank
    0; ``forward_sync_buffers``, formerly ``broadcast_buffers``, defaults to True, and Lightning's
    ``DDPStrategy`` keeps the default)."""
    n, batch_size, epochs, momentum = 12, 2, 2, 0.5
    world = run_world(
        training.fit_batchnorm, world_size, n=n, batch_size=batch_size, max_epochs=epochs, momentum=momentum
    )

    expected = _running_stats(n, world_size, batch_size, epochs, momentum, "broadcast")
    last = world_size - 1
    oracle.assert_distinct(
        broadcast=expected[-1][last][0][0],
        no_sync=_running_stats(n, world_size, batch_size, epochs, momentum, "local")[-1][last][0][0],
        averaged=_running_stats(n, world_size, batch_size, epochs, momentum, "average")[-1][last][0][0],
        rank0s=expected[-1][0][0][0],
    )
    for rank in world:
        r = rank.rank
        got = [_flat(_as_stats(step)) for step in rank.record["running"]]
        want = [_flat(step[r]) for step in expected]
        assert len(got) == len(want)
        assert _flatten(got) == pytest.approx(_flatten(want), abs=1e-6), (
            f"rank {r}: running [mean, var] per step {got}, expected {want}"
        )
    finals = [_flat(_as_stats(rank.record["final"])) for rank in world]
    semantics.number(f"rank {last}'s final running mean", finals[last][0], vs=("rank 0's", finals[0][0]))
    assert _flatten(finals) == pytest.approx(_flatten([_flat(s) for s in expected[-1]]), abs=1e-6), oracle.side_by_side(
        "running [mean, var] at the end of fit", finals
    )
    assert _flatten(finals[last]) != pytest.approx(_flatten(finals[0]), abs=1e-6), oracle.side_by_side(
        "final running stats", finals
    )


def test_a_validation_loop_after_training_leaves_every_rank_with_rank_0s_running_stats(run_world, semantics):
    """The same broadcast runs at the start of the first validation forward after a training step (in
    eval mode; DDP still has ``require_forward_param_sync`` set by the training forward), and eval mode
    does not update running statistics. So when every epoch ends with validation, every rank ends
    ``fit`` holding rank 0's running statistics — unlike the same fit without validation, where rank 1
    differs. Source: torch/nn/parallel/distributed.py ``_pre_forward``/``_post_forward``
    (``require_forward_param_sync``); Lightning calls the DDP-wrapped module for ``validation_step``
    (pytorch_lightning/strategies/strategy.py ``Strategy.validation_step``)."""
    n, batch_size, epochs, momentum, world_size = 12, 2, 2, 0.5, 2
    world = run_world(
        training.fit_batchnorm, world_size, n=n, batch_size=batch_size, max_epochs=epochs, momentum=momentum, val_n=4
    )

    expected = _running_stats(n, world_size, batch_size, epochs, momentum, "broadcast")
    rank0 = _flat(expected[-1][0])
    oracle.assert_distinct(rank0s=rank0[0], rank1_without_validation=_flat(expected[-1][1])[0])
    finals = [_flat(_as_stats(rank.record["final"])) for rank in world]
    semantics.number("rank 1's final running mean", finals[1][0], vs=("without validation", _flat(expected[-1][1])[0]))
    assert _flatten(finals) == pytest.approx(rank0 * world_size, abs=1e-6), (
        oracle.side_by_side("running [mean, var] at the end of fit", finals) + f"  expected rank 0's {rank0}"
    )


@run_if(backend="gloo")  # a CPU fact: with --backend nccl the modules are on GPUs, where SyncBatchNorm works
def test_sync_batchnorm_is_refused_on_cpu_when_ddp_wraps_the_module(run_world, semantics):
    """``Trainer(sync_batchnorm=True)`` converts every ``BatchNorm*d`` to ``SyncBatchNorm``
    (pytorch_lightning/plugins/layer_sync.py ``TorchSyncBatchNorm``), but on CPU (gloo) DDP refuses the
    module when it wraps it: ``ValueError: SyncBatchNorm layers only work with GPU modules``, on every
    world size including 1. Source: torch/nn/parallel/distributed.py
    ``_passing_sync_batchnorm_handle``; ``SyncBatchNorm.forward`` (torch/nn/modules/batchnorm.py) also
    accepts only GPU-like inputs."""
    with pytest.raises(RankFailed) as failure:
        run_world(training.fit_batchnorm, 2, n=12, batch_size=2, sync_batchnorm=True)
    semantics.number(
        "ranks raising ValueError",
        sum(t == "ValueError" for t in failure.value.exc_types.values()),
        vs=("world size", 2),
    )
    assert set(failure.value.exc_types.values()) == {"ValueError"}, failure.value.exc_types
    for trace in failure.value.tracebacks.values():
        assert "SyncBatchNorm layers only work with GPU modules" in trace, trace


@run_if(min_gpus=2, backend="nccl")
def test_sync_batchnorm_running_stats_are_the_global_batch_stats_and_equal_on_every_rank(run_world):
    """With ``Trainer(sync_batchnorm=True)`` on GPUs, ``SyncBatchNorm`` all-gathers each rank's batch
    mean, variance and count, so every rank updates its running statistics with the statistics of
    the global batch (all ranks' samples together; variance unbiased over the global count): the
    running statistics are equal on every rank after every step. This differs from averaging the
    ranks' unbiased variances. Source: torch/nn/modules/_functions.py ``SyncBatchNorm.forward``
    (``batch_norm_gather_stats_with_counts``); pytorch_lightning/strategies/ddp.py applies the layer
    sync before wrapping the model."""
    n, batch_size, epochs, momentum, world_size = 12, 2, 2, 0.5, 2
    world = run_world(
        training.fit_batchnorm,
        world_size,
        n=n,
        batch_size=batch_size,
        max_epochs=epochs,
        momentum=momentum,
        sync_batchnorm=True,
    )

    expected = _running_stats(n, world_size, batch_size, epochs, momentum, "global")
    averaged = _running_stats(n, world_size, batch_size, epochs, momentum, "average")
    oracle.assert_distinct(global_var=expected[-1][0][1][0], averaged_var=averaged[-1][0][1][0])
    assert [rank.record["bn_class"] for rank in world] == ["SyncBatchNorm"] * world_size
    for rank in world:
        got = [_flat(_as_stats(step)) for step in rank.record["running"]]
        want = [_flat(step[rank.rank]) for step in expected]
        assert len(got) == len(want)
        assert _flatten(got) == pytest.approx(_flatten(want), abs=1e-5), (
            f"rank {rank.rank}: running [mean, var] per step {got}, expected {want}"
        )


# ---------------------------------------------------------------------------------------------
# 3. The training DistributedSampler: shuffled (unless overfit_batches), reshuffled per epoch; validation in order
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size, user_shuffle", [(1, False), (2, False), (3, False), (2, True)])
def test_the_training_sampler_shuffles_whatever_the_user_loader_says_and_reshuffles_every_epoch(
    run_world, semantics, world_size, user_shuffle
):
    """For the training dataloader Lightning asks for a shuffling ``DistributedSampler`` unless
    ``overfit_batches`` is set (``_process_dataloader`` passes ``shuffle=True`` for the training stage,
    ``_get_distributed_sampler`` makes it ``shuffle and not overfit_batches``: the overfit_batches fact of
    test_samplers_rewrapped.py; ``_is_dataloader_shuffled`` is consulted only for validation/test), so a
    user's ``DataLoader(shuffle=False)`` is shuffled too, and a user's ``shuffle=True`` gives exactly the
    same order (its ``RandomSampler`` is replaced).
    The seed is ``PL_GLOBAL_SEED``, 0 without ``seed_everything``, and the fit loop calls
    ``set_epoch(epoch)`` before each epoch, so each epoch has a new permutation. Each rank's
    ``training_step`` sees exactly what torch's ``DistributedSampler(shuffle=True, seed=0)`` deals it
    after ``set_epoch(e)``. Source: pytorch_lightning/trainer/connectors/data_connector.py
    ``_process_dataloader``/``_resolve_sampler``/``_get_distributed_sampler``;
    pytorch_lightning/loops/fit_loop.py ``on_advance_start`` (``_set_sampler_epoch``)."""
    n, batch_size, epochs = 7, 2, 3
    world = run_world(
        training.fit_regression, world_size, n=n, batch_size=batch_size, max_epochs=epochs, user_shuffle=user_shuffle
    )

    expected = {
        str(e): [_train_batches(n, world_size, r, e, batch_size) for r in range(world_size)] for e in range(epochs)
    }
    sequential = [oracle.batches(oracle.shard(n, world_size, r), batch_size) for r in range(world_size)]
    assert expected["0"] != sequential, "data do not discriminate: epoch 0's shuffle is the user's order"
    shared = [(a, b) for a in expected for b in expected if a < b and expected[a] == expected[b]]
    assert not shared, f"data do not discriminate: epochs {shared} share an order"
    semantics.number(
        "rank 0's epoch 0 batches",
        str(world[0].record["train_ids"]["0"]),
        vs=("the loader's order", str(sequential[0])),
    )

    for epoch in expected:
        got = [rank.record["train_ids"][epoch] for rank in world]
        assert got == expected[epoch], (
            f"epoch {epoch}: "
            + oracle.side_by_side("saw", got)
            + f"  expected {expected[epoch]}  user's order {sequential}"
        )
    samplers = [rank.record["train_sampler"] for rank in world]
    assert samplers == [{"class": "DistributedSampler", "shuffle": True, "seed": 0}] * world_size, samplers


def test_seed_everything_seeds_the_training_sampler_shuffle(run_world, semantics):
    """``seed_everything(7)`` sets ``PL_GLOBAL_SEED=7``, which Lightning passes as the
    ``DistributedSampler`` seed: the ranks see torch's ``DistributedSampler(shuffle=True, seed=7)``
    order, not the seed-0 order. Source: pytorch_lightning/trainer/connectors/data_connector.py
    ``_get_distributed_sampler`` (``kwargs.setdefault("seed", int(os.getenv("PL_GLOBAL_SEED", 0)))``)."""
    n, batch_size, epochs, world_size, seed = 7, 2, 2, 2, 7
    world = run_world(training.fit_regression, world_size, n=n, batch_size=batch_size, max_epochs=epochs, seed=seed)
    semantics.number(
        "rank 0's epoch 0 batches",
        str(world[0].record["train_ids"]["0"]),
        vs=("with seed 0", str(_train_batches(n, world_size, 0, 0, batch_size, seed=0))),
    )

    for e in range(epochs):
        expected = [_train_batches(n, world_size, r, e, batch_size, seed=seed) for r in range(world_size)]
        seed0 = [_train_batches(n, world_size, r, e, batch_size, seed=0) for r in range(world_size)]
        assert expected != seed0, "data do not discriminate: seed 7 and seed 0 give the same order"
        got = [rank.record["train_ids"][str(e)] for rank in world]
        assert got == expected, (
            f"epoch {e}: " + oracle.side_by_side("saw", got) + f"  expected {expected}  seed 0 {seed0}"
        )
    assert [rank.record["train_sampler"]["seed"] for rank in world] == [seed] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_validation_inside_fit_keeps_the_users_order_every_epoch(run_world, semantics, world_size):
    """The validation dataloader (``shuffle=False``) gets a ``DistributedSampler(shuffle=False)``:
    each rank's ``validation_step`` sees its sequential shard of the padded index list, in the same
    order every epoch, although the training order changes. Source:
    pytorch_lightning/trainer/connectors/data_connector.py ``_process_dataloader``
    (``_is_dataloader_shuffled`` is False for a ``SequentialSampler``)."""
    n, val_n, batch_size, epochs = 7, 5, 2, 2
    world = run_world(training.fit_regression, world_size, n=n, batch_size=batch_size, max_epochs=epochs, val_n=val_n)

    expected = [oracle.batches(oracle.shard(val_n, world_size, r), batch_size) for r in range(world_size)]
    shuffled = [
        oracle.batches(oracle.distributed_sampler_ids(val_n, world_size, r, 1), batch_size) for r in range(world_size)
    ]
    assert expected != shuffled, "data do not discriminate: the epoch-1 shuffle equals the user's order"
    semantics.number(
        "rank 0's epoch 1 validation batches", str(world[0].record["val_ids"]["1"]), vs=("shuffled", str(shuffled[0]))
    )
    for e in range(epochs):
        got = [rank.record["val_ids"][str(e)] for rank in world]
        assert got == expected, f"epoch {e}: " + oracle.side_by_side("validation saw", got) + f"  expected {expected}"
    samplers = [rank.record["val_sampler"] for rank in world]
    assert samplers == [{"class": "DistributedSampler", "shuffle": False}] * world_size, samplers


# ---------------------------------------------------------------------------------------------
# 4. Epoch-level self.log from training_step, read in on_train_epoch_end
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 8)])
def test_on_train_epoch_end_already_reads_this_epochs_synced_value_of_an_on_epoch_log(
    run_world, semantics, world_size, n
):
    """``self.log("value_mean", batch mean, on_step=False, on_epoch=True, sync_dist=True)`` in
    ``training_step``, read from ``self.trainer.callback_metrics`` in ``on_train_epoch_end``: the value
    is already this epoch's mean over every sample the ranks trained on (this epoch's shuffled, padded
    index list), equal on all ranks — not the rank's own mean, not last epoch's value, not a running
    mean over epochs. The same log without ``sync_dist`` gives the rank's own shard mean.
    Source: pytorch_lightning/loops/fit_loop.py ``on_advance_end`` (``epoch_end_reached()`` runs before
    the ``on_train_epoch_end`` hooks, so ``callback_metrics`` computes epoch values);
    pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultMetric.compute`` (the sync)."""
    batch_size, epochs = 2, 2
    world = run_world(training.fit_regression, world_size, n=n, batch_size=batch_size, max_epochs=epochs)

    ids = {e: [oracle.distributed_sampler_ids(n, world_size, r, e) for r in range(world_size)] for e in range(epochs)}
    synced = {e: oracle.mean(oracle.values(i for shard in ids[e] for i in shard)) for e in range(epochs)}
    local = {e: [oracle.mean(oracle.values(ids[e][r])) for r in range(world_size)] for e in range(epochs)}
    oracle.assert_distinct(
        epoch1_synced=synced[1],
        epoch0_synced=synced[0],
        rank0_local=local[1][0],
        over_both_epochs=oracle.mean([synced[0], synced[1]]),
        single_process=oracle.mean(oracle.values(range(n))),
    )
    semantics.number(
        "epoch 1 value_mean",
        world[0].record["epoch_end_metrics"]["1"].get("value_mean"),
        vs=("rank 0's own", local[1][0]),
    )
    for e in range(epochs):
        got = [rank.record["epoch_end_metrics"][str(e)] for rank in world]
        values = [g.get("value_mean") for g in got]
        assert values == pytest.approx([synced[e]] * world_size), (
            f"epoch {e}: " + oracle.side_by_side("value_mean in on_train_epoch_end", values) + f"  expected {synced[e]}"
        )
        local_values = [g.get("value_mean_local") for g in got]
        assert local_values == pytest.approx(local[e]), (
            f"epoch {e}: " + oracle.side_by_side("value_mean_local", local_values) + f"  expected {local[e]}"
        )


# ---------------------------------------------------------------------------------------------
# 5. Which loop warns about DistributedSampler
# ---------------------------------------------------------------------------------------------

_SAMPLER_WARNING = "Using `DistributedSampler` with the dataloaders. During `trainer.{fn}()`"


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_distributed_sampler_warning_fires_for_validate_and_test_but_not_for_validation_inside_fit(
    run_world, semantics, world_size
):
    """One Trainer runs ``fit`` (with a validation set and the sanity check), then ``validate`` and
    ``test``. The PossibleUserWarning "Using `DistributedSampler` with the dataloaders. During
    `trainer.validate()` ..." (and "`trainer.test()`") comes from ``validate`` and ``test`` only,
    once, on global rank 0 only (``rank_zero_warn``), and only when the sampler spans more than one
    rank; the validation loop inside ``fit`` is silent although it pads the same way.
    Source: pytorch_lightning/trainer/connectors/data_connector.py ``_resolve_sampler``
    (``trainer_fn in (TrainerFn.VALIDATING, TrainerFn.TESTING)`` and ``sampler.num_replicas > 1``)."""
    world = run_world(training.fit_then_evaluate, world_size, n=5)

    def count(record, phase, fn):
        return sum(_SAMPLER_WARNING.format(fn=fn) in w["message"] for w in record["warnings"][phase])

    expected_rank0 = 1 if world_size > 1 else 0
    semantics.number(
        "rank 0's warnings in validate / test",
        f"{count(world[0].record, 'validate', 'validate')} / {count(world[0].record, 'test', 'test')}",
        vs=("in fit", sum("Using `DistributedSampler`" in w["message"] for w in world[0].record["warnings"]["fit"])),
    )
    for phase, fn in (("validate", "validate"), ("test", "test")):
        got = [count(rank.record, phase, fn) for rank in world]
        assert got == [expected_rank0] + [0] * (world_size - 1), oracle.side_by_side(f"warnings in {phase}", got)
    in_fit = [
        sum("Using `DistributedSampler`" in w["message"] for w in rank.record["warnings"]["fit"]) for rank in world
    ]
    assert in_fit == [0] * world_size, oracle.side_by_side("DistributedSampler warnings in fit", in_fit)


def _prediction(params, sample_id: int, offset: float) -> float:
    w0, w1, b = params
    x = regression_x(sample_id)
    return w0 * x[0] + w1 * x[1] + b + offset


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


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors("tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced")
def test_manual_backward_averages_gradients_over_two_gpus(run_world, semantics):
    """test_training_loop.py::test_manual_backward_averages_gradients_over_ranks_before_the_optimizer_step
    at W=2 over NCCL. Mirrors tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced."""
    test_manual_backward_averages_gradients_over_ranks_before_the_optimizer_step(run_world, semantics, 2)


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
