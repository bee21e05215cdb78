"""Callbacks that monitor a metric under DDP: ``EarlyStopping``, ``ModelCheckpoint`` and ``SpikeDetection``.

A metric logged with ``sync_dist=False`` has a different value on each rank, so each rank's callback
sees a different number. Both callbacks still take one decision for the whole world, by reducing the
ranks' decisions with ``trainer.strategy.reduce_boolean_decision`` (an all_reduce of 0/1): a rank
that stopped or saved alone would leave its peers waiting in a collective. They reduce in opposite
directions: ``EarlyStopping`` stops when *any* rank wants to, ``ModelCheckpoint`` saves a better
checkpoint only when *every* rank sees an improvement. What is not reduced stays rank-local:
``best_model_score`` is each rank's own number, and ``EarlyStopping``'s stopping reason is recorded
only where the criterion was met. Files are written by global rank 0 alone, into rank 0's ``dirpath``.
``SpikeDetection`` decides per rank and stops every rank if any rank saw a spike
(lightning_fabric/utilities/spike.py ``reduce_boolean_decision(is_spike, all=False)``); ``ModelCheckpoint``
with a step-level monitor keeps the top-k steps of the synced value, and without a monitor the last epoch's
checkpoint, rank 0 writing them.

Here rank ``r`` logs ``values[r][epoch]`` (``MonitoredRegressor``, ddpprobe/probes/callbacks.py); the
expected epochs come from the callbacks' rules applied to that table (tests/support/oracle.py), on tables where
"any", "all" and "rank 0 decides alone" give different answers.
Sources: pytorch_lightning/strategies/parallel.py ``ParallelStrategy.reduce_boolean_decision``;
pytorch_lightning/callbacks/early_stopping.py ``_run_early_stopping_check``,
``_evaluate_stopping_criteria``; pytorch_lightning/callbacks/model_checkpoint.py ``setup``,
``check_monitor_top_k``, ``_update_best_and_save``; pytorch_lightning/strategies/strategy.py
``Strategy.save_checkpoint``; pytorch_lightning/loops/fit_loop.py ``on_advance_end``, ``done``.
"""

import math

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import callbacks, stopping_checkpoints_and_schedules
from tests.support import oracle


def _rank0_alone(decisions):
    return decisions[0]


@pytest.mark.parametrize(
    "world_size, decisions", [(1, [True]), (2, [True, False]), (3, [False, True, False]), (3, [True, True, True])]
)
def test_reduce_boolean_decision_is_all_by_default_and_any_with_all_false(run_world, semantics, world_size, decisions):
    """``reduce_boolean_decision(d)`` all-reduces ``int(d)`` with SUM and returns ``sum == W`` (``all``) by
    default and with ``all=True``, ``sum > 0`` (``any``) with ``all=False``; every rank gets the same
    answer."""
    world = run_world(callbacks.reduce_decision, world_size, decisions=decisions)

    expected = {"default": all(decisions), "all_true": all(decisions), "all_false": any(decisions)}
    got = [rec["reduced"] for rec in world.records]
    semantics.number("default reduction", got[0]["default"], vs=("any", any(decisions)))
    assert [rec["decision"] for rec in world.records] == decisions
    assert got == [expected] * world_size, oracle.side_by_side("reduced", got) + f"  expected {expected}"


# values[r][epoch] each rank logs; the EarlyStopping arguments; max_epochs = 3.
EARLY_STOPPING_CASES = {
    # mode="min", stop below 5: rank 1 crosses at epoch 1, rank 0 at epoch 2, rank 2 never.
    "stopping_threshold": (
        [[9.0, 8.0, 4.0], [9.0, 4.0, 3.0], [9.0, 8.0, 7.0]],
        {"stopping_threshold": 5.0, "patience": 100},
    ),
    # mode="min", patience 1: rank 1 worsens at epoch 1, rank 2 at epoch 2, rank 0 always improves.
    "patience": ([[9.0, 8.0, 7.0], [9.0, 10.0, 11.0], [9.0, 8.0, 9.0]], {"patience": 1}),
}
MAX_EPOCHS = 3


def _expected_stop(values, options):
    decisions = [oracle.early_stopping_local_decisions(row[:MAX_EPOCHS], mode="min", **options) for row in values]
    return decisions, {
        "any": oracle.first_epoch_where(decisions, any),
        "all": oracle.first_epoch_where(decisions, all),
        "rank0_alone": oracle.first_epoch_where(decisions, _rank0_alone),
    }


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("criterion", sorted(EARLY_STOPPING_CASES))
def test_early_stopping_stops_every_rank_at_the_first_epoch_any_rank_wants_to_stop(
    run_world, semantics, world_size, criterion
):
    """``EarlyStopping`` monitoring a metric logged with ``sync_dist=False``: each rank evaluates its own
    value, then ``_run_early_stopping_check`` reduces with ``reduce_boolean_decision(should_stop,
    all=False)``. So every rank stops after the first epoch at which *any* rank's own criterion holds,
    not when all do, nor when rank 0 does. On every rank: the epochs run are 0..stop,
    ``stopped_epoch == stop``, ``trainer.should_stop`` is True and ``trainer.current_epoch`` (completed
    epochs) is ``stop + 1``. Each rank's callback saw its own, unsynced value."""
    table, options = EARLY_STOPPING_CASES[criterion]
    values = table[:world_size]
    world = run_world(callbacks.early_stopping, world_size, values=values, max_epochs=MAX_EPOCHS, **options)

    _, stops = _expected_stop(values, options)
    as_epochs = {rule: MAX_EPOCHS if stop is None else stop for rule, stop in stops.items()}
    for rule in ("all", "rank0_alone"):
        oracle.assert_distinct(stop_epoch_with_any=as_epochs["any"], **{f"stop_epoch_with_{rule}": as_epochs[rule]})
    stop = stops["any"]
    assert stop is not None
    expected = {
        "epochs_run": list(range(stop + 1)),
        "stopped_epoch": stop,
        "should_stop": True,
        "current_epoch": stop + 1,
    }
    got = [{key: rec[key] for key in expected} for rec in world.records]
    semantics.number("stopped epoch", got[0]["stopped_epoch"], vs=("when all ranks want to stop", as_epochs["all"]))
    assert got == [expected] * world_size, oracle.side_by_side("stop", got) + f"  expected {expected} ({stops})"
    seen = [rec["seen"] for rec in world.records]
    assert seen == [row[: stop + 1] for row in values], oracle.side_by_side("monitored seen", seen)


@run_if(lightning=">=2.6")  # EarlyStopping.stopping_reason arrived in 2.6 (PR #21188)
def test_only_the_ranks_whose_own_value_met_the_criterion_record_a_stopping_reason(run_world, semantics):
    """After the reduced stop, ``EarlyStopping.stopping_reason`` is set only on the ranks whose own value
    met the criterion (``_evaluate_stopping_criteria`` sets it before the reduction): here rank 1
    (below the threshold at the stop epoch) says ``STOPPING_THRESHOLD`` while ranks 0 and 2, stopped
    by rank 1's decision, keep ``NOT_STOPPED``. ``stopping_reason_message`` is whatever this rank's
    own check said that epoch, so on ranks 0 and 2 it is the "improved" message, not a reason to stop."""
    values, options = EARLY_STOPPING_CASES["stopping_threshold"]
    world = run_world(callbacks.early_stopping, 3, values=values, max_epochs=MAX_EPOCHS, **options)

    decisions, stops = _expected_stop(values, options)
    stop = stops["any"]
    expected = ["STOPPING_THRESHOLD" if d[stop] else "NOT_STOPPED" for d in decisions]
    assert expected.count("NOT_STOPPED") >= 1 and expected.count("STOPPING_THRESHOLD") >= 1
    got = [rec["stopping_reason"] for rec in world.records]
    semantics.number(
        "ranks with a stopping reason", sum(r != "NOT_STOPPED" for r in got), vs=("ranks stopped", len(got))
    )
    assert got == expected, oracle.side_by_side("stopping_reason", got) + f"  expected {expected}"
    messages = [rec["stopping_reason_message"] or "" for rec in world.records]
    for rank, reason in enumerate(expected):
        stops_here = "Signaling Trainer to stop" in messages[rank]
        assert stops_here == (reason != "NOT_STOPPED"), oracle.side_by_side("message", messages)
        if reason == "NOT_STOPPED":
            assert "improved" in messages[rank], oracle.side_by_side("message", messages)


# values[r][epoch] each rank logs, mode="min", save_top_k=1.
CHECKPOINT_CASES = [
    # Rank 0 improves every epoch, rank 1 worsens every epoch (W=2).
    (2, [[5.0, 4.0, 3.0], [6.0, 7.0, 8.0]]),
    # Every rank improves at epoch 1; at epoch 2 rank 0 improves, rank 1 worsens, rank 2 improves (W=3).
    (3, [[5.0, 4.0, 3.0], [6.0, 5.0, 7.0], [8.0, 7.0, 6.0]]),
]
N_PER_RANK, BATCH_SIZE = 4, 2


def _checkpoint_name(epoch: int) -> str:
    """ModelCheckpoint's default file name ``{epoch}-{step}``: ``step`` is the global step after ``epoch``."""
    steps_per_epoch = math.ceil(N_PER_RANK / BATCH_SIZE)
    return f"epoch={epoch}-step={(epoch + 1) * steps_per_epoch}.ckpt"


@pytest.mark.parametrize("world_size, values", CHECKPOINT_CASES)
def test_model_checkpoint_saves_only_when_every_rank_improves_and_keeps_a_rank_local_best_score(
    run_world, semantics, world_size, values
):
    """``ModelCheckpoint(monitor=..., save_top_k=1)`` on an unsynced metric: the first epoch always saves
    (fewer than ``save_top_k`` checkpoints, no reduction); later, ``check_monitor_top_k`` reduces each
    rank's "better than my stored score" with ``reduce_boolean_decision`` (``all``), so one rank that
    worsens vetoes a save even while rank 0 improves. Every rank then stores *its own* value:
    ``best_model_score`` differs between ranks (rank ``r`` keeps ``values[r][last saved epoch]``), while
    ``best_model_path`` is the same file on every rank."""
    world = run_world(
        callbacks.model_checkpoint, world_size, values=values, n_per_rank=N_PER_RANK, batch_size=BATCH_SIZE
    )

    saved = oracle.top1_checkpoint_epochs(values, all)
    last = saved[-1]
    oracle.assert_distinct(last_saved_with_all=last, last_saved_with_any=oracle.top1_checkpoint_epochs(values, any)[-1])
    oracle.assert_distinct(
        last_saved_with_all=last, last_saved_by_rank0_alone=oracle.top1_checkpoint_epochs(values, _rank0_alone)[-1]
    )
    scores = [rec["best_model_score"] for rec in world.records]
    semantics.number("rank 0's best_model_score", scores[0], vs=("rank 1's", scores[1]))
    assert scores == [row[last] for row in values], (
        oracle.side_by_side("best_model_score", scores) + f"  expected each rank's value at epoch {last}"
    )
    best_path = f"rank0/checkpoints/{_checkpoint_name(last)}"
    paths = [rec["best_model_path"] for rec in world.records]
    assert paths == [best_path] * world_size, oracle.side_by_side("best_model_path", paths)
    assert [rec["best_k_models"] for rec in world.records] == [{best_path: row[last]} for row in values]
    assert [rec["seen"] for rec in world.records] == [row[:MAX_EPOCHS] for row in values]


@pytest.mark.parametrize("world_size, values", CHECKPOINT_CASES)
def test_only_global_rank_0_writes_checkpoints_into_rank_0s_dirpath(run_world, semantics, world_size, values):
    """Each rank passes its own folder as ``ModelCheckpoint(dirpath=...)``; ``ModelCheckpoint.setup``
    broadcasts rank 0's, so every rank ends with ``dirpath == "rank0/checkpoints"``. Every rank calls
    ``trainer.save_checkpoint`` at each save, but ``Strategy.save_checkpoint`` hands the checkpoint to
    ``CheckpointIO`` on global rank 0 only: rank 0's ``CheckpointIO`` is asked to write each saved
    epoch's file, the others' never. The files left: rank 0's folder holds the last saved checkpoint
    (binary, listed as ``<N bytes>``; earlier ones were removed by ``save_top_k=1``), the other ranks'
    folders are empty."""
    world = run_world(
        callbacks.model_checkpoint, world_size, values=values, n_per_rank=N_PER_RANK, batch_size=BATCH_SIZE
    )

    saved = oracle.top1_checkpoint_epochs(values, all)
    assert [rec["dirpath_given"] for rec in world.records] == [f"rank{r}/checkpoints" for r in range(world_size)]
    assert [rec["dirpath"] for rec in world.records] == ["rank0/checkpoints"] * world_size
    writes = [rec["saved"] for rec in world.records]
    semantics.number(
        "checkpoint writes on rank 0", len(writes[0]), vs=("on the other ranks", sum(map(len, writes[1:])))
    )
    expected_writes = [[f"rank0/checkpoints/{_checkpoint_name(e)}" for e in saved]] + [[]] * (world_size - 1)
    assert writes == expected_writes, oracle.side_by_side("CheckpointIO writes", writes)

    files = [sorted(rank.files) for rank in world]
    assert files == [[f"checkpoints/{_checkpoint_name(saved[-1])}"]] + [[]] * (world_size - 1), oracle.side_by_side(
        "files", files
    )
    content = world[0].files[f"checkpoints/{_checkpoint_name(saved[-1])}"]
    assert content.startswith("<") and content.endswith(" bytes>"), content[:80]


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


@pytest.mark.mirrors("tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp", row=61)
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


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors("tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp", row=61)
def test_a_step_level_monitor_keeps_the_top_k_steps_on_two_gpus(run_world, semantics):
    """test_callbacks.py::test_a_step_level_monitor_keeps_the_top_k_steps_of_the_synced_value_and_rank_0_writes_them
    over NCCL. Mirrors tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp."""
    test_a_step_level_monitor_keeps_the_top_k_steps_of_the_synced_value_and_rank_0_writes_them(run_world, semantics)


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


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors(
    "tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_model_checkpoint_ddp_monitor_none"
)
def test_without_a_monitor_rank_0_keeps_the_last_checkpoint_on_two_gpus(run_world, semantics):
    """test_callbacks.py::test_without_a_monitor_every_rank_names_the_last_epochs_checkpoint_and_rank_0_keeps_only_it
    over NCCL. Mirrors test_checkpoint_callback_frequency.py::test_model_checkpoint_ddp_monitor_none."""
    test_without_a_monitor_every_rank_names_the_last_epochs_checkpoint_and_rank_0_keeps_only_it(run_world, semantics)


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
