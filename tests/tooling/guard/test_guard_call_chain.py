"""The guard names the call the user wrote, not the innermost library frame.

A collective made through a library call on rank 0 only (``CallsModule``, tests/tooling/trace/
call_modules.py: a metric method, strategy methods, a ``Trainer`` method, ``LightningModule.all_gather``,
``torch.distributed`` itself, a property read followed by a reduce on every rank) raises
``CollectiveMismatch`` on every rank, and rank 0's side names the public call made at its line (``run by
`MeanMetric.compute()```, ``run by reading `Trainer.callback_metrics```) and that line; the other ranks,
in the epoch sync Lightning makes on its own, are named by Lightning's loop step (``run by Lightning's
`_FitLoop...```). The names are the libraries' public names, written out here. Source:
ddpprobe/trace/_classify.py ``CallClassifier.chain``, ddpprobe/trace/_words.py ``describe_collective``.

Recorded worlds (the fixture ``failed_world``, tests/support/guard_recordings.py): the call chain each rank's
classifier named is in the entry it posted live, stored under tests/recordings/guard/; the errors and their words
are computed from those entries here, by the guard's own verdict.
"""

import pytest

from tests.tooling.guard.test_guard_hazards import LIMITS, _guard_errors, _line
from tests.tooling.trace import call_modules
from tests.tooling.trace.call_modules import line_of

#: call made on rank 0 only -> what rank 0's side says before its line, and after it (the op of a metric's
#: sync is torchmetrics' choice, not checked).
RANK_0_SIDE = {
    "metric": ("(MeanMetric state sync at compute())", ", run by `MeanMetric.compute()`"),
    "strategy_barrier": ("is about to barrier", ", run by `DDPStrategy.barrier()`"),
    "strategy_broadcast": ("is about to broadcast_object_list object", ", run by `DDPStrategy.broadcast()` [src=0]"),
    "trainer": ("is about to barrier", ", run by `Trainer.save_checkpoint()`"),
    "all_gather": ("is about to all_gather float32 [1]", ", run by `LightningModule.all_gather()`"),
    "direct": ("is about to all_reduce float32 [1] (your code)", ""),
}
#: The other ranks' side: the epoch sync of ``train_v`` that Lightning's fit loop makes on its own.
OWN_SYNC = "barrier (self.log epoch sync of 'train_v', logged in training_step) at call_modules.py"
OWN_STEP = ", run by Lightning's `_"


def _mismatch(failed_world, world_size: int, **params) -> dict:
    """Each rank's ``CollectiveMismatch`` text, from the recorded world of ``call_modules.guarded``."""
    failure = failed_world(call_modules.guarded, world_size, n=4 * world_size, **params, **LIMITS)
    return _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("call", list(RANK_0_SIDE))
def test_a_call_on_rank_0_only_is_named_by_its_public_name_at_the_users_line(failed_world, world_size, call):
    """``if self.global_rank == 0: <call>`` in ``on_train_epoch_end``: every rank raises
    ``CollectiveMismatch``; rank 0's side names the public call and the user's line, the other ranks'
    side the epoch sync Lightning's loop makes on its own (a method of one of its loop classes). Recorded: the
    ranks' entries at that check."""
    for message in _mismatch(failed_world, world_size, calls=[call]).values():
        before, after = RANK_0_SIDE[call]
        _line(0, f"{before} at {line_of(call)}{after}", message)
        for rank in range(1, world_size):
            _line(rank, OWN_SYNC, message)
            _line(rank, OWN_STEP, message)
        assert "None" not in message, message


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_property_read_on_rank_0_only_then_a_reduce_names_the_read_and_the_reduce(failed_world, world_size):
    """``if self.global_rank == 0: dict(self.trainer.callback_metrics)``, then
    ``self.trainer.strategy.reduce(...)`` on every rank (tests/facts/test_hidden_collectives_metrics_properties.py:
    without the guard the two sums swap silently). Every rank raises ``CollectiveMismatch``: rank 0's
    side is the epoch sync of ``train_v`` run by reading ``Trainer.callback_metrics`` at the read's line,
    the others' the barrier run by ``DDPStrategy.reduce()`` at the reduce's line. Recorded: the ranks' entries."""
    messages = _mismatch(failed_world, world_size, calls=["property"], everywhere=["strategy_reduce"])
    for message in messages.values():
        read = "barrier (self.log epoch sync of 'train_v', logged in training_step)"
        _line(0, f"{read} at {line_of('property')}, run by reading `Trainer.callback_metrics`", message)
        for rank in range(1, world_size):
            _line(rank, f"barrier at {line_of('strategy_reduce')}, run by `DDPStrategy.reduce()`", message)


def _line_in(cls, method: str, text: str) -> str:
    """``"file.py:N in method"``: the line of ``cls.method`` that holds ``text``."""
    import inspect
    import os

    lines, start = inspect.getsourcelines(getattr(cls, method))
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"{os.path.basename(inspect.getsourcefile(cls))}:{start + offset} in {method}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_boring_model_saving_a_checkpoint_on_rank_0_only_names_trainer_save_checkpoint(failed_world, world_size):
    """Lightning's ``BoringModel`` with a user's ``if self.global_rank == 0: self.trainer.save_checkpoint(...)``
    in ``on_train_epoch_end`` (``BoringSavesOnRankZero``): without the guard rank 0 waits alone in the
    checkpoint's barrier (pytorch_lightning/trainer/trainer.py ``save_checkpoint``). With it every rank
    raises ``CollectiveMismatch``; rank 0's side is the barrier at the user's line, run by
    ``Trainer.save_checkpoint()``, the others are at the guard's state check of the end of ``fit``
    (``on_fit_end``), the first point they reach where they make no collective. Recorded: the ranks' entries."""
    failure = failed_world(call_modules.boring, world_size, **LIMITS)
    line = _line_in(call_modules.BoringSavesOnRankZero, "on_train_epoch_end", "save_checkpoint")
    for message in _guard_errors(failure, "CollectiveMismatch", list(range(world_size))).values():
        _line(0, f"is about to barrier at {line}, run by `Trainer.save_checkpoint()`", message)
        for rank in range(1, world_size):
            _line(rank, "is at the state check of end (on_fit_end", message)


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_step_sync_logged_on_rank_0_only_is_named_against_the_others_gradient_bucket(failed_world, world_size):
    """``if self.global_rank == 0: self.log("step_v", ..., on_step=True, sync_dist=True)`` in
    ``training_step``: rank 0 syncs the step value, the others go on to the batch's backward, where DDP
    all-reduces the first gradient bucket from C++. Without the guard's comm hook the others' side is
    invisible and the guard can only time out; with it every rank raises ``CollectiveMismatch``: rank 0's
    side is the step sync run by ``LightningModule.log()`` at its line, the others' DDP's gradient
    all_reduce of bucket 0 in Lightning's backward. Recorded: the ranks' entries, the buckets' from the guard's
    comm hook."""
    for message in _mismatch(failed_world, world_size, calls=["log"]).values():
        sync = "barrier (self.log step sync of 'step_v', logged in training_step)"
        _line(0, f"{sync} at {line_of('log')}, run by `LightningModule.log()`", message)
        for rank in range(1, world_size):
            _line(rank, "(DistributedDataParallel's gradient all_reduce of bucket 0), run by Lightning's `_", message)


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_readme_style_module_computing_accuracy_on_rank_0_only_names_the_metrics_compute(failed_world, world_size):
    """A module written from the README (tests/tooling/trace/newcomer.py): ``if self.trainer.is_global_zero:
    print(self.accuracy.compute())`` in ``on_validation_epoch_end``. Every rank raises ``CollectiveMismatch``
    in the sanity check's validation; rank 0's side is the ``MulticlassAccuracy`` state sync at its line,
    run by ``MulticlassAccuracy.compute()``; the others have gone on to a barrier Lightning makes on its
    own after the sanity check (named by its loop step, ``run by Lightning's `_FitLoop...```). Recorded: the
    ranks' entries."""
    from tests.tooling.trace import newcomer

    failure = failed_world(newcomer.fit, world_size, **LIMITS)
    line = _line_in(newcomer.LitClassifier, "on_validation_epoch_end", ".compute()")
    for message in _guard_errors(failure, "CollectiveMismatch", list(range(world_size))).values():
        _line(0, f"(MulticlassAccuracy state sync at compute()) at {line}", message)
        _line(0, ", run by `MulticlassAccuracy.compute()`", message)
        for rank in range(1, world_size):
            _line(rank, "is about to barrier, run by Lightning's `_FitLoop.", message)
