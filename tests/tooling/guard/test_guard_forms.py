"""``CollectiveGuard`` on training scripts a new user writes from the README, one hazard each
(tests/support/guard_forms/): checked from the Trainer's first collective, not its first callback hook; no
let-through of the forms the guard missed; and the registry's cause and fix for the hazards it knows.

Each script runs as ``python train.py`` would, with ``Trainer(strategy="ddp", callbacks=[CollectiveGuard()])``,
on two gloo ranks of the project's launcher. The guard's timeout is short (3-5 s) and the process group's 10 s,
so a hazard the guard missed fails the test in seconds with gloo's error or a ``WorldTimeout``, not a hang.
Sources: ddpprobe/guard/_callback.py (``_start_early``, ``_lists``, ``_EvalBatches``), ddpprobe/trace/_patch.py
(aliases), ddpprobe/hazards/_guard.py (``recognise``).

The mismatches read recorded worlds (the fixture ``failed_world``, tests/support/guard_recordings.py): what each
rank posted at the check that differed, stored under tests/recordings/guard/ by one live run; the errors, their
cause and fix are computed from it here by the guard's own verdict. Live: the ``prepare_data`` barrier stopping
every rank within seconds (a claim about time). The runs that pass are live claims too, in the integration run.
"""

import inspect

import pytest

from ddpprobe import RankFailed
from ddpprobe.hazards import HAZARDS, fix_line
from tests.support.guard_forms import (
    all_to_all_lists,
    bound_aliases,
    broadcast_object_list_lengths,
    compute_on_rank_zero,
    datamodule_setup_collective,
    exact_evaluation,
    prepare_data_collective,
    progress_bar_compute,
    raw_all_reduce_order,
    sync_dist_on_rank_zero,
)
from tests.tooling.guard.test_guard_hazards import _guard_errors, _line

LIMITS = {"pg_timeout": 10, "timeout": 60}


def _at(module, method: str, text: str) -> str:
    """``"file.py:N in method"`` of the line of ``module``'s ``method`` (of its ``LitClassifier`` or datamodule)
    holding ``text``."""
    mine = [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    cls = next(c for c in mine if method in vars(c))
    lines, start = inspect.getsourcelines(getattr(cls, method))
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"{module.__name__.rsplit('.', 1)[-1]}.py:{start + offset} in {method}"


def _mismatch(failed_world, module, **params) -> dict:
    """Each rank's ``CollectiveMismatch`` text, from the recorded world of ``module.train`` at W = 2."""
    failure = failed_world(module.train, 2, **params, **LIMITS)
    return _guard_errors(failure, "CollectiveMismatch", [0, 1])


def _cause_and_fix(message: str, name: str) -> None:
    """The message names the registry entry ``name`` with its cause line, then gives its fix line."""
    assert f"\nCause ({name}): " in message, message
    assert fix_line(name) in message and "No proven fix applies" not in message, message


# --- from the start: hooks Lightning runs before a callback's setup -----------------------------------------


def test_a_collective_in_a_datamodules_setup_on_rank_0_only_is_a_mismatch_naming_the_hook_and_the_line(
    failed_world,
):
    """``LightningDataModule.setup`` runs before any callback's ``setup``: rank 0's ``dist.all_reduce`` there
    (under ``is_global_zero``) is checked against rank 1, at the guard's ``setup`` boundary, on both ranks.
    Recorded: the ranks' entries at that check."""
    for message in _mismatch(failed_world, datamodule_setup_collective).values():
        line = _at(datamodule_setup_collective, "setup", "all_reduce(")
        _line(0, f"is about to all_reduce int64 [1] (your code) at {line}", message)
        _line(1, "is at setup (epoch 0)", message)
        _cause_and_fix(message, "collective_on_some_ranks")


def test_a_barrier_in_prepare_data_stops_every_rank_within_seconds_naming_the_hook_and_the_line(run_world):
    """Lightning runs ``prepare_data`` on local rank 0 only, the others waiting in its own barrier without a timeout
    (``_InfiniteBarrier``, made from C++): the guard has every rank meet at a check at that barrier, so rank 0's
    ``dist.barrier()`` in ``prepare_data`` meets rank 1's arrival there, and both raise ``CollectiveMismatch`` at
    once, naming rank 0's line and Lightning's barrier: within seconds under a guard timeout of 50 s (before, the
    world waited out the guard's timeout). Without the guard both wait for the process group. Live: the time the
    world took is the claim."""
    import time

    guard_timeout = 50.0
    started = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        run_world(prepare_data_collective.train, 2, guard_timeout=guard_timeout, pg_timeout=60, timeout=120)
    elapsed = time.monotonic() - started
    errors = _guard_errors(failure.value, "CollectiveMismatch", [0, 1])
    line = _at(prepare_data_collective, "prepare_data", "dist.barrier()")
    for message in errors.values():
        _line(0, f"is about to barrier (your code) at {line}", message)
        _line(1, "is at Lightning's barrier after prepare_data (`_InfiniteBarrier`", message)
    assert elapsed < guard_timeout / 2, f"the world took {elapsed:.1f} s, the guard's timeout is {guard_timeout:g} s"


@pytest.mark.integration
def test_a_prepare_data_that_makes_no_collective_passes_lightnings_barrier_check_unchanged(run_world):
    """The same script without the barrier in ``prepare_data``: every rank meets at the check of Lightning's barrier
    (rank 1 waiting there while rank 0 prepares) and the fit runs to its end."""
    records = run_world(prepare_data_collective.train, 2, barrier=False, **LIMITS).records
    assert all(r["checks"] > 0 for r in records), records


# --- no let-through ---------------------------------------------------------------------------------------------


def test_raw_all_reduces_in_another_order_on_each_rank_differ_by_call_site(failed_world):
    """Same op, dtype and shape, in another order on rank 1: compared by the user's call site, every rank
    raises at the first of them, each side naming its own line. Recorded: the ranks' entries."""
    for message in _mismatch(failed_world, raw_all_reduce_order).values():
        first = _at(raw_all_reduce_order, "on_train_epoch_end", "dist.all_reduce(seen)")
        other = _at(raw_all_reduce_order, "on_train_epoch_end", "dist.all_reduce(correct)\n")
        _line(0, f"is about to all_reduce float32 [1] (your code) at {first}", message)
        assert first.split(":")[1] != other.split(":")[1]
        assert "from different lines of their code" in message, message


def test_broadcast_object_lists_of_different_lengths_are_a_mismatch_naming_each_length(failed_world):
    """Rank 0 broadcasts a list of 2 names, rank 1 passes a list of 1: the list's length is compared. Recorded:
    the ranks' entries."""
    for message in _mismatch(failed_world, broadcast_object_list_lengths).values():
        _line(0, "broadcast_object_list object (your code)", message)
        _line(0, "with lists [2]", message)
        _line(1, "with lists [1]", message)


def test_all_to_all_lists_that_differ_in_their_second_tensor_are_a_mismatch(failed_world):
    """Every tensor of both lists is compared (dtype, and shape less the split size): rank 1's float64 second
    tensor differs where its first agrees. Recorded: the ranks' entries."""
    for message in _mismatch(failed_world, all_to_all_lists).values():
        _line(0, "is about to all_to_all float32 [2]", message)
        _line(1, "'float64[]'", message)
        assert "'float64[]'" not in message.splitlines()[1], message


@pytest.mark.parametrize("alias", ["from_import", "distributed_c10d"])
def test_a_collective_through_a_name_bound_before_the_guard_is_checked(failed_world, alias):
    """``from torch.distributed import all_reduce`` at the script's top, or ``distributed_c10d.all_reduce``: the
    patch rebinds every alias of a collective, so rank 0's all_reduce alone is a mismatch on both ranks. Recorded:
    the ranks' entries (rank 0's from the patched alias, live)."""
    for message in _mismatch(failed_world, bound_aliases, alias=alias).values():
        _line(0, "is about to all_reduce float32 [1] (your code) at bound_aliases.py:", message)
        _cause_and_fix(message, "collective_on_some_ranks")


@pytest.mark.integration
def test_exact_evaluation_over_shards_of_5_and_3_batches_with_an_epoch_sync_only_passes_unchanged(run_world):
    """``use_distributed_sampler=False``, each rank its own shard (5 and 3 batches), the loss summed at the
    epoch's end only: no collective pairs batches, so uneven shards are right here. The guard passes it, and
    both ranks get the sum over all 32 samples, as without the guard."""
    guarded = run_world(exact_evaluation.train, 2, **LIMITS).records
    plain = run_world(exact_evaluation.train, 2, guard=False, **LIMITS).records
    for r in (0, 1):
        assert guarded[r]["val_loss_sum"] == plain[r]["val_loss_sum"], (guarded, plain)
        assert guarded[r]["val_loss_sum"] == pytest.approx(guarded[r]["expected"], rel=1e-5), guarded
        assert guarded[r]["checks"] > 0, guarded


# --- the registry's cause and fix in the guard's message ---------------------------------------------------------


def test_compute_on_rank_0_only_gets_the_metric_entrys_cause_and_fix(failed_world):
    """The first new user's case: rank 0's ``MulticlassAccuracy.compute()`` against Lightning's own barrier on
    rank 1 is the registry's ``metric_compute_on_some_ranks``, with its cause and fix. Recorded: the ranks'
    entries."""
    for message in _mismatch(failed_world, compute_on_rank_zero).values():
        _line(0, f"at {_at(compute_on_rank_zero, 'on_validation_epoch_end', '.compute()')}", message)
        _cause_and_fix(message, "metric_compute_on_some_ranks")
        assert "MulticlassAccuracy.compute() syncs its state on rank(s) [0] only" in message, message


def test_a_sync_dist_log_on_rank_0_only_gets_the_rank_0_only_entrys_cause_and_fix(failed_world):
    """The second case: ``self.log(..., sync_dist=True)`` under ``is_global_zero``: ``rank0_only_synced_log``.
    Recorded: the ranks' entries."""
    for message in _mismatch(failed_world, sync_dist_on_rank_zero).values():
        _line(0, "(self.log epoch sync of 'val_acc', logged in on_validation_epoch_end)", message)
        _cause_and_fix(message, "rank0_only_synced_log")


def test_the_progress_bars_hidden_read_is_named_with_the_read_entrys_cause_and_fix(failed_world):
    """The third case: ``compute()`` on every rank with the default progress bar. Rank 0's side is the bar's read
    of the logged metrics (``TQDMProgressBar.on_train_epoch_end`` reading ``Trainer.progress_bar_metrics``), as
    the audit's trace names it, and the cause names the bar, not the line that logged the key. Recorded: the
    ranks' entries."""
    assert HAZARDS["metrics_read_on_some_ranks"].fix is not None
    for message in _mismatch(failed_world, progress_bar_compute).values():
        _line(0, "run by `TQDMProgressBar.on_train_epoch_end` reading `Trainer.progress_bar_metrics`", message)
        _line(1, "run by `MulticlassAccuracy.compute()`", message)
        _cause_and_fix(message, "metrics_read_on_some_ranks")
        assert "): `TQDMProgressBar.on_train_epoch_end` reads `Trainer.progress_bar_metrics`" in message, message
