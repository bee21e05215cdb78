"""The training loop under DDP as Lightning's own tests assert it, in real worlds: a ``training_step``
that returns None, ``trainer.estimated_stepping_batches``, ``SpikeDetection``, ``ModelCheckpoint`` with a
step-level monitor or none, and ``lr_find``.

- Returning None from ``training_step`` (to skip a bad batch) raises only where it happens: the check is
  the rank's own (``trainer.world_size > 1``), and its peers go on into the backward's gradient
  all_reduce (pytorch_lightning/loops/optimization/automatic.py ``_AutomaticOptimization._training_step``).
- ``estimated_stepping_batches`` counts one rank's batches (pytorch_lightning/trainer/trainer.py).
- ``SpikeDetection`` decides per rank and stops every rank if any rank saw a spike
  (lightning_fabric/utilities/spike.py ``reduce_boolean_decision(is_spike, all=False)``).
- ``ModelCheckpoint`` runs its logic on every rank with synced values and saves on rank 0 only; the
  ``lr_find`` results are rank 0's, broadcast (pytorch_lightning/tuner/lr_finder.py ``_lr_find``).

The module is a ``Linear(2, 1)`` on ``RegressionDataset`` (ddpprobe/probes/stopping_checkpoints_and_schedules.py).
"""

import math

import pytest

from ddpprobe import RankFailed
from ddpprobe.probes import stopping_checkpoints_and_schedules
from tests.support import oracle

NONE_MESSAGE = "Skipping the `training_step` by returning None in distributed training is not supported"


@pytest.mark.mirrors("tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed")
def test_returning_none_from_training_step_on_one_rank_raises_there_while_its_peer_waits_in_backward(run_world):
    """Rank 1 returns None from ``training_step`` at batch 1, rank 0 returns its loss: rank 1 raises
    ``RuntimeError: Skipping the `training_step` by returning None in distributed training is not
    supported``; rank 0 raises nothing and is found, when the world is ended, inside ``backward`` (the
    DDP gradient all_reduce rank 1 never joins): under a launcher that does not end the world it waits
    there until the connection closes or the process-group timeout. Lightning's
    tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed sets
    ``trainer.strategy.world_size = 2`` in one process, so it cannot show that the check is per rank.
    Source: pytorch_lightning/loops/optimization/automatic.py ``_AutomaticOptimization._training_step``."""
    with pytest.raises(RankFailed) as failure:
        run_world(stopping_checkpoints_and_schedules.fit_none_step, 2, none_ranks=[1], none_at=1, n=8)

    err = failure.value
    assert err.exc_types == {1: "RuntimeError"}, err.exc_types
    assert NONE_MESSAGE in err.rank_errors[1], err.rank_errors[1]
    assert err.rank_errors[0] == "did not finish", err.rank_errors
    stack = err.stacks.get(0, "")
    assert "pytorch_lightning/strategies/strategy.py" in stack and "in backward" in stack, stack


@pytest.mark.mirrors("tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed")
def test_returning_none_on_every_rank_at_the_same_batch_raises_on_every_rank(run_world, semantics):
    """When every rank returns None at the same batch, every rank raises the same ``RuntimeError`` at once
    and none is left waiting. Mirrors test_automatic_loop.py::test_skip_training_step_not_allowed.
    Source: automatic.py ``_AutomaticOptimization._training_step``."""
    with pytest.raises(RankFailed) as failure:
        run_world(stopping_checkpoints_and_schedules.fit_none_step, 2, none_ranks=[0, 1], none_at=1, n=8)

    err = failure.value
    semantics.number("ranks raising", len(err.exc_types), vs=("when one rank returns None", 1))
    assert err.exc_types == {0: "RuntimeError", 1: "RuntimeError"}, err.exc_types
    assert all(NONE_MESSAGE in err.rank_errors[r] for r in (0, 1)), err.rank_errors


@pytest.mark.mirrors("tests_pytorch/loops/optimization/test_automatic_loop.py::test_skip_training_step_not_allowed")
def test_in_a_world_of_one_rank_returning_none_skips_the_batch_without_an_error(run_world, semantics):
    """The control: at W=1 (``strategy="ddp"``, one rank) the same None is allowed; the epoch runs all
    four batches. Source: automatic.py (the check needs ``trainer.world_size > 1``)."""
    world = run_world(stopping_checkpoints_and_schedules.fit_none_step, 1, none_ranks=[0], none_at=1, n=8)

    assert world.records[0]["steps"] == [0, 1, 2, 3], world.records
    semantics.number("training batches run at W=1", len(world.records[0]["steps"]))


@pytest.mark.mirrors(
    "tests_pytorch/trainer/properties/test_estimated_stepping_batches.py::test_num_stepping_batches_gpu"
)
@pytest.mark.parametrize("world_size, accumulate", [(2, 1), (2, 2), (3, 1)])
def test_estimated_stepping_batches_counts_one_ranks_optimizer_steps(run_world, semantics, world_size, accumulate):
    """``trainer.estimated_stepping_batches`` read in ``configure_optimizers`` (what a OneCycle or warmup
    schedule is sized with) is one rank's count: ``ceil(ceil(ceil(N/W) / batch size) / accumulate) *
    epochs`` (9 for N=10, W=2, batch size 2, 3 epochs), and equals the optimizer steps the run takes, not
    the single-process count (15). Mirrors Lightning's tests_pytorch/trainer/properties/
    test_estimated_stepping_batches.py::test_num_stepping_batches_gpu (world size mocked). Source:
    trainer.py ``Trainer.estimated_stepping_batches`` (``num_training_batches``, per rank)."""
    n, batch_size, epochs = 10, 2, 3
    world = run_world(
        stopping_checkpoints_and_schedules.fit_stepping,
        world_size,
        n=n,
        batch_size=batch_size,
        max_epochs=epochs,
        accumulate_grad_batches=accumulate,
    )

    def steps(samples):
        return math.ceil(math.ceil(samples / batch_size) / accumulate) * epochs

    per_rank = steps(math.ceil(n / world_size))
    oracle.assert_distinct(per_rank=per_rank, single_process=steps(n))
    got = [(rec["estimated"], rec["global_step"]) for rec in world.records]
    assert got == [(per_rank, per_rank)] * world_size, oracle.side_by_side("estimated, taken", got)
    semantics.number("estimated_stepping_batches", got[0][0], vs=("single process", steps(n)))


@pytest.mark.mirrors("tests_pytorch/callbacks/test_spike.py::test_trainer_spike_detection_integration")
def test_a_loss_spike_on_one_rank_stops_every_rank_at_that_batch(run_world, semantics):
    """``SpikeDetection(window=2, warmup=1)`` with a loss of 1.0 everywhere except 100.0 on rank 1 at batch
    3: rank 0 saw no spike, yet both ranks raise ``TrainingSpikeException`` "Training spike detected in
    batch 3" after running batches 0 to 3, and only rank 0 writes ``skip_batches.json`` (batches 2 and
    3). Mirrors Lightning's tests_pytorch/callbacks/test_spike.py::test_trainer_spike_detection_integration
    (ddp_spawn, 2 CPU ranks). Source: lightning_fabric/utilities/spike.py ``SpikeDetection.on_train_batch_end``
    (``reduce_boolean_decision(is_spike, all=False)``) and ``_handle_spike``."""
    world_size, n = 2, 16
    world = run_world(stopping_checkpoints_and_schedules.fit_spike, world_size, n=n)

    spike = stopping_checkpoints_and_schedules.SPIKE_BATCH
    local = [
        any(stopping_checkpoints_and_schedules.spike_loss(r, b) > 1.0 for b in range(spike + 1))
        for r in range(world_size)
    ]
    assert local == [False, True], "only rank 1 may see the spike for the fact to show the cross-rank decision"
    got = [(rec["raised"], rec["message"], rec["steps"]) for rec in world.records]
    want = ("TrainingSpikeException", f"Training spike detected in batch {spike}", list(range(spike + 1)))
    assert got == [want] * world_size, oracle.side_by_side("raised, message, batches", got)
    files = [rec["skip_file"] for rec in world.records]
    assert files == [[spike - 1, spike], None], oracle.side_by_side("skip_batches.json", files)
    semantics.number("ranks stopped by rank 1's spike", sum(r == want for r in got), vs=("ranks that saw it", 1))


@pytest.mark.mirrors("tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp")
def test_a_step_level_monitor_keeps_the_top_k_steps_of_the_synced_value_and_rank_0_writes_them(run_world, semantics):
    """``ModelCheckpoint(monitor="v_step", save_top_k=2, every_n_train_steps=1)`` on a value logged with
    ``on_step=True, on_epoch=True, sync_dist=True`` that rank r logs as ``(r+1) * ((b-2)**2 + b/10)`` at
    batch b: every rank keeps the same two best steps (batches 2 and 1, files ``step=3`` and ``step=2``)
    and the same ``best_model_score``, the cross-rank mean at batch 2 (0.3), not rank 0's own 0.2; the
    files exist on rank 0 only. Mirrors Lightning's tests_pytorch/checkpointing/
    test_checkpoint_callback_frequency.py::test_top_k_ddp (2 GPUs). Source:
    pytorch_lightning/callbacks/model_checkpoint.py ``ModelCheckpoint.on_train_batch_end`` and
    ``_save_topk_checkpoint``; ``Strategy.save_checkpoint`` (rank 0)."""
    world_size, n, batch_size = 2, 10, 2
    world = run_world(
        stopping_checkpoints_and_schedules.fit_checkpoint,
        world_size,
        n=n,
        batch_size=batch_size,
        max_epochs=1,
        monitor="v_step",
        save_top_k=2,
        every_n_train_steps=1,
    )

    batches = range(math.ceil(math.ceil(n / world_size) / batch_size))
    synced = {
        b: oracle.mean(stopping_checkpoints_and_schedules.step_monitor_value(r, b) for r in range(world_size))
        for b in batches
    }
    best, second = sorted(batches, key=synced.get)[:2]
    oracle.assert_distinct(synced=synced[best], rank0=stopping_checkpoints_and_schedules.step_monitor_value(0, best))
    files = {f"epoch=0-step={b + 1}.ckpt" for b in (best, second)}
    got = [(rec["best_model_path"], set(rec["best_k_models"])) for rec in world.records]
    assert got == [(f"epoch=0-step={best + 1}.ckpt", files)] * world_size, oracle.side_by_side("best, top k", got)
    scores = [rec["best_model_score"] for rec in world.records]
    assert scores == pytest.approx([synced[best]] * world_size), oracle.side_by_side("best_model_score", scores)
    saved = [sorted(rank.files) for rank in world]
    assert saved == [sorted(f"checkpoints/{f}" for f in files), []], oracle.side_by_side("files", saved)
    semantics.number(
        "best_model_score",
        scores[0],
        vs=("rank 0's own value", stopping_checkpoints_and_schedules.step_monitor_value(0, best)),
    )


@pytest.mark.mirrors(
    "tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_model_checkpoint_ddp_monitor_none"
)
def test_without_a_monitor_every_rank_names_the_last_epochs_checkpoint_and_rank_0_keeps_only_it(run_world, semantics):
    """``ModelCheckpoint(monitor=None)`` (the default) over two epochs: every rank's ``best_model_path`` is
    the last epoch's file (``epoch=1-step=4``), ``best_model_score`` is None, and rank 0's folder holds
    only that file (epoch 0's is removed); rank 1 writes nothing. Mirrors Lightning's
    test_checkpoint_callback_frequency.py::test_model_checkpoint_ddp_monitor_none (2 GPUs). Source:
    model_checkpoint.py ``_save_none_monitor_checkpoint`` and ``_remove_checkpoint``."""
    world_size, n, batch_size, epochs = 2, 8, 2, 2
    world = run_world(
        stopping_checkpoints_and_schedules.fit_checkpoint, world_size, n=n, batch_size=batch_size, max_epochs=epochs
    )

    steps_per_epoch = math.ceil(math.ceil(n / world_size) / batch_size)
    last = f"epoch={epochs - 1}-step={epochs * steps_per_epoch}.ckpt"
    first = f"epoch=0-step={steps_per_epoch}.ckpt"
    got = [(rec["best_model_path"], rec["best_model_score"]) for rec in world.records]
    assert got == [(last, None)] * world_size, oracle.side_by_side("best_model_path, score", got)
    saved = [sorted(rank.files) for rank in world]
    assert saved == [[f"checkpoints/{last}"], []], oracle.side_by_side("files", saved) + f"  {first} should be gone"
    semantics.number("checkpoint files left on rank 0", len(saved[0]), vs=("epochs", epochs))


def _lr_finder_smoothed(losses, beta=0.98) -> list:
    """The losses ``lr_find`` records for one rank's step losses: a running average with momentum
    ``beta``, divided by ``1 - beta ** (global_step + 1)`` where the global step, read after the
    optimizer step, is ``k + 1`` at step ``k``. Source: pytorch_lightning/tuner/lr_finder.py
    ``_LRCallback.on_train_batch_end``."""
    avg, out = 0.0, []
    for k, loss in enumerate(losses):
        avg = beta * avg + (1 - beta) * loss
        out.append(avg / (1 - beta ** (k + 2)))
    return out


@pytest.mark.mirrors("tests_pytorch/tuner/test_lr_finder.py::test_lr_finder_with_ddp")
def test_lr_find_under_ddp_gives_every_rank_rank_0s_loss_curve_and_the_same_learning_rate(run_world, semantics):
    """``Tuner(trainer).lr_find(model)`` at W=2: each rank trains on its own shard, so the ranks' losses
    differ, but every rank ends with the same ``results`` (the smoothed loss curve of rank 0's losses, not
    rank 1's), the same suggestion and the same ``model.lr``. Mirrors Lightning's
    tests_pytorch/tuner/test_lr_finder.py::test_lr_finder_with_ddp (standalone, 2 CPU ranks; it checks the
    same lr on every rank). Source: pytorch_lightning/tuner/lr_finder.py ``_lr_find``
    (``lr_finder.results = trainer.strategy.broadcast(lr_finder.results)``)."""
    world_size, steps = 2, 20
    world = run_world(stopping_checkpoints_and_schedules.find_lr, world_size, num_training=steps)

    curves = [_lr_finder_smoothed(rec["losses"]) for rec in world.records]
    oracle.assert_distinct(rank0_first=curves[0][0], rank1_first=curves[1][0])
    for rec in world.records:
        assert len(rec["losses"]) == steps, rec["losses"]
        assert rec["results_loss"] == pytest.approx(curves[0], rel=1e-6), (
            oracle.side_by_side("results['loss'][:3]", [r["results_loss"][:3] for r in world.records])
            + f"  expected rank 0's {curves[0][:3]}, rank 1's would be {curves[1][:3]}"
        )
    lrs = [(rec["suggestion"], rec["lr"]) for rec in world.records]
    assert lrs[0][0] is not None and lrs[0][0] == lrs[0][1], lrs
    assert lrs == [lrs[0]] * world_size, oracle.side_by_side("suggestion, model.lr", lrs)
    semantics.number("learning rate chosen", lrs[0][1])


def _first_stop(values: list) -> int:
    """The epoch ``EarlyStopping(patience=0, mode="min")`` stops at for these per-epoch values: the first
    epoch whose value is not below the best so far (or past the last epoch when none is)."""
    best = values[0]
    for epoch, value in enumerate(values[1:], start=1):
        if not value < best:
            return epoch
        best = value
    return len(values)


@pytest.mark.mirrors("tests_pytorch/callbacks/test_early_stopping.py::test_multiple_early_stopping_callbacks")
@pytest.mark.parametrize("check_on_train_epoch_end", [True, False])
def test_with_two_early_stopping_callbacks_the_first_stop_any_rank_wants_stops_every_rank(
    run_world, semantics, check_on_train_epoch_end
):
    """Two ``EarlyStopping(patience=0)`` callbacks on unsynced values: ``"a"`` rises on rank 1 from epoch 1
    (rank 1 wants to stop there) and falls on rank 0; ``"b"`` stops improving at epoch 3 on every rank.
    Every rank trains epochs 0 and 1 and stops, the ``"a"`` callback records ``stopped_epoch`` 1 on both
    ranks (rank 0's own values never asked for it) and the ``"b"`` callback never stops; had rank 0
    decided for the world (its decision broadcast), every rank would have trained until epoch 3. The same
    whether the check runs at the training epoch's end or after validation. Mirrors Lightning's
    tests_pytorch/callbacks/test_early_stopping.py::test_multiple_early_stopping_callbacks[ddp_spawn] (2 CPU
    ranks). Source: pytorch_lightning/callbacks/early_stopping.py ``_run_early_stopping_check``
    (``reduce_boolean_decision(should_stop, all=False)``; ``stopped_epoch`` set where the reduced decision
    stops)."""
    world_size, max_epochs = 2, 6
    world = run_world(
        stopping_checkpoints_and_schedules.fit_two_early_stoppings,
        world_size,
        check_on_train_epoch_end=check_on_train_epoch_end,
        max_epochs=max_epochs,
    )

    per_rank_stop = [
        min(
            _first_stop([stopping_checkpoints_and_schedules.two_monitor_values(r, e)[key] for e in range(max_epochs)])
            for key in ("a", "b")
        )
        for r in range(world_size)
    ]
    stop = min(per_rank_stop)
    assert (
        stopping_checkpoints_and_schedules.STOPPING_RANK != 0
        and per_rank_stop[stopping_checkpoints_and_schedules.STOPPING_RANK] == stop
    )
    oracle.assert_distinct(any_rank=stop, rank0_decides=per_rank_stop[0])
    got = [(rec["epochs"], rec["stopped_epoch"]) for rec in world.records]
    assert got == [(list(range(stop + 1)), {"a": stop, "b": 0})] * world_size, oracle.side_by_side(
        "epochs trained, stopped_epoch", got
    )
    semantics.number("epochs trained on rank 0", len(got[0][0]), vs=("by its own values", per_rank_stop[0] + 1))
