"""``CollectiveGuard`` raises no false alarm on correct runs that use more of Lightning: gradient
accumulation with a partial last group, validation twice an epoch over part of the validation set,
``ReduceLROnPlateau`` on a synced monitor with ``LearningRateMonitor``, two optimizers (manual
optimization), manual optimization stopped by ``max_steps`` over shards of different lengths, a
``LightningDataModule`` validated every second epoch on part of its batches, then ``trainer.test`` and
``trainer.predict`` on the same Trainer.

Each runs at W = 2 and 3 without the guard and with it, and gives the same record with it: every value
each rank produced (weights, logged and monitored values, learning rates, predictions) and how far the
default process group's sequence number moved (``pg_seq``), so the guard raised nothing, added no
collective and removed none; ``checks`` (the guard's count of passed checks) is the one field that differs.
Each test also checks that the run did what its name says (the steps it made, the learning rate halved,
the predictions made), so a scenario that stopped early cannot pass. Scenarios:
tests/support/guard_correct.py.

These are live claims (a real world, unchanged by the guard), two worlds each: in the integration run
(``pytest -m integration``), but for the two where a peer outlasts the guard's timeout in one of Lightning's slow
steps, which stay in the default run (the guard's waiting is live behaviour). The one hazard here reads its recorded
world (the fixture ``failed_world``, tests/support/guard_recordings.py).
"""

import pytest

from tests.support import guard_correct
from tests.tooling.guard.test_guard_breaking import UNEVEN, _mismatch, _twins
from tests.tooling.guard.test_guard_hazards import _line


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_accumulation_with_a_partial_last_group_mid_epoch_validation_and_plateau_scheduling_fit_the_same_with_the_guard(
    run_world, world_size
):
    """7 batches per rank accumulated by 3 (groups of 3, 3, 1: the last group steps the optimizer at the
    epoch's end, pytorch_lightning/loops/training_epoch_loop.py ``_should_accumulate``), validated twice an
    epoch on half the validation batches, ``ReduceLROnPlateau`` monitoring the synced ``v`` (which grows
    every epoch, so the rate halves at the end of epochs 1 and 2), ``LearningRateMonitor`` logging every
    step: 3 optimizer steps an epoch, 9 in all, the same weights, values and learning rates with the guard."""
    without = _twins(run_world, guard_correct.accumulate_plateau, world_size)
    assert [r["global_step"] for r in without] == [9] * world_size, without
    for r in without:  # halved at the end of epochs 1 and 2; the monitor logged 0.1, then 0.05 (as float32)
        assert r["lr"] == pytest.approx(0.025), r["lr"]
        assert sorted(set(round(v, 6) for v in r["lrs"]["lr-SGD"])) == [0.05, 0.1], r["lrs"]


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_two_optimizers_stepped_in_turn_fit_the_same_with_the_guard(run_world, world_size):
    """Two layers, an SGD and an Adam optimizer stepped in turn in ``training_step`` (manual optimization),
    2 epochs of 4 batches per rank: 16 optimizer steps (``global_step`` counts both), the same weights and
    losses with the guard."""
    without = _twins(run_world, guard_correct.two_optimizers, world_size)
    assert [r["global_step"] for r in without] == [16] * world_size, without


@pytest.mark.integration
@pytest.mark.parametrize("sizes", [[6, 10], [6, 10, 8]], ids=["W=2", "W=3"])
def test_manual_optimization_stopped_by_max_steps_at_the_short_ranks_last_batch_fits_the_same_with_the_guard(
    run_world, sizes
):
    """Rank 0 holds 6 samples (3 batches of 2), the others 10 or 8; two optimizer steps a batch under
    manual optimization and ``max_steps=6``: every rank stops after batch 2, where rank 0's loader is
    exhausted and the others' are not. Whether a batch reaches ``max_steps`` shows only at its end under
    manual optimization (``training_step`` makes the steps), so the guard compares the last batch there:
    the same weights with the guard as without it (before, ``CollectiveMismatch`` at batch 2's start)."""
    without = _twins(run_world, guard_correct.two_optimizers, len(sizes), sizes=sizes, max_steps=6)
    assert [r["global_step"] for r in without] == [6] * len(sizes), without


def test_manual_optimization_not_stopped_by_max_steps_over_shards_of_different_lengths_still_raises(failed_world):
    """The same shards at W = 2 with ``max_steps=8``: after batch 2 rank 0 has no batch left and rank 1
    would run batch 3 alone, so every rank raises ``CollectiveMismatch`` at the end of batch 2, before
    rank 1's next gradient all_reduce, naming rank 0's last batch and the uneven batch counts. Recorded: the
    ranks' entries at the end of batch 2."""
    errors = _mismatch(failed_world, 2, guard_correct.two_optimizers, sizes=[6, 10], max_steps=8)
    for message in errors.values():
        _line(0, "is at on_train_batch_end (batch 2, epoch 0, this rank's last batch)", message)
        _line(1, "is at on_train_batch_end (batch 2, epoch 0)", message)
        assert UNEVEN in message, message


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_datamodule_fit_validated_every_second_epoch_then_tested_and_predicted_gives_the_same_with_the_guard(
    run_world, world_size
):
    """A ``LightningDataModule`` (``prepare_data`` runs on local rank 0 only, ``setup`` on every rank per
    stage), 4 epochs on three quarters of the training batches (``limit_train_batches=0.75``: 4 of 6 per
    rank), validated at epochs 1 and 3 (``check_val_every_n_epoch=2``) on 2 batches, then ``trainer.test``
    and ``trainer.predict`` on the same Trainer: the same weights, test values and predictions with the
    guard."""
    without = _twins(run_world, guard_correct.datamodule_stages, world_size)
    assert [r["global_step"] for r in without] == [16] * world_size, without
    assert [r["prepared"] for r in without] == [3] + [0] * (world_size - 1), without
    assert all(r["set_up"] == ["fit", "test", "predict"] for r in without), without
    assert all("t" in r["tested"] and len(r["predicted"]) == 6 for r in without), without


@pytest.mark.waits_for_timeout
def test_a_checkpoint_written_slower_than_the_guard_timeout_fits_the_same_with_the_guard(run_world):
    """``ModelCheckpoint`` every epoch through a writer 3 s slower than Lightning's (a slow file system),
    under ``CollectiveGuard(timeout=1)`` and a process-group timeout of 10 s: rank 1 waits for rank 0's
    write at the check of ``Trainer.save_checkpoint``'s barrier for 3 s, longer than the guard's timeout.
    Rank 0 noted that it is writing a checkpoint (``on_save_checkpoint``), so rank 1 waits on, within the
    process-group timeout, as it would in the barrier without the guard: the same run, both checkpoints."""
    without = _twins(run_world, guard_correct.slow_steps, 2, guard_timeout=1.0, write_s=3.0)
    assert all(r["files"] == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"] for r in without), without


@pytest.mark.waits_for_timeout
def test_a_prepare_data_slower_than_the_guard_timeout_fits_the_same_with_the_guard(run_world):
    """``prepare_data`` on local rank 0 takes 3 s under ``CollectiveGuard(timeout=1)``: the other ranks
    wait for it in Lightning's own barrier (``_InfiniteBarrier``, pytorch_lightning/trainer/connectors/
    data_connector.py ``prepare_data``), before ``setup`` where the guard's first check is, so the guard
    never waits for it: the same run with the guard."""
    _twins(run_world, guard_correct.slow_steps, 2, guard_timeout=1.0, prepare_s=3.0)
