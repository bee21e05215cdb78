"""Collective hazards in callbacks: ``ModelCheckpoint(monitor=...)`` and ``EarlyStopping(monitor=...)`` on
a key that only rank 0 logs.

Both callbacks take one decision for the whole world with ``trainer.strategy.reduce_boolean_decision``,
a collective (a barrier and an all_reduce, ``_sync_ddp``), so they must run the same way on every rank.
A key logged under ``if self.global_rank == 0`` (with or without ``rank_zero_only=True``: neither syncs
it) is in rank 0's ``callback_metrics`` only. On every other rank the callback finds no value and
raises Lightning's own error (``ModelCheckpoint._save_topk_checkpoint``: ``MisconfigurationException``
"could not find the monitored key", once a validation loop has run; ``EarlyStopping
._validate_condition_metric`` with ``strict=True``: ``RuntimeError`` "... which is not available"),
while rank 0 goes on into ``reduce_boolean_decision`` (``ModelCheckpoint`` via ``file_exists``,
``EarlyStopping`` via ``_run_early_stopping_check``) and waits there for peers that never come.
Lightning's docs warn about it at ``self.log``'s ``rank_zero_only``: "you won't be able to use this
metric as a monitor in callbacks".

The probe is ddpprobe/probes/hazards.py (``monitor_rank0_key``).
Sources: pytorch_lightning/callbacks/model_checkpoint.py ``_save_topk_checkpoint``,
``_update_best_and_save``, ``file_exists``; pytorch_lightning/callbacks/early_stopping.py
``_validate_condition_metric``, ``_run_early_stopping_check``; pytorch_lightning/strategies/parallel.py
``ParallelStrategy.reduce_boolean_decision``; pytorch_lightning/core/module.py ``LightningModule.log``.
"""

import math
import time

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hazards
from tests.support import gloo, oracle

#: What each callback's error says on a rank without the key (Lightning's own text).
MISSING_KEY = {
    "checkpoint": (
        "MisconfigurationException",
        f"`ModelCheckpoint(monitor='{hazards.MONITORED}')` could not find the monitored key in the returned metrics",
    ),
    "early_stopping": (
        "RuntimeError",
        f"Early stopping conditioned on metric `{hazards.MONITORED}` which is not available",
    ),
}
#: The monitored value per epoch (mode="min"): ModelCheckpoint's best is epoch 1 of 3; EarlyStopping
#: (patience 1) stops after epoch 1 of 4, where the value gets worse.
VALUES = {"checkpoint": [5.0, 3.0, 4.0], "early_stopping": [5.0, 6.0, 4.0, 3.0]}
N_PER_RANK, BATCH_SIZE = 2, 2
PG_TIMEOUT_S, WORLD_TIMEOUT_S = 2, 20


@pytest.mark.parametrize("rank_zero_only", [False, True], ids=["plain_log", "rank_zero_only"])
@pytest.mark.parametrize("callback", sorted(MISSING_KEY))
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_callback_monitoring_a_key_only_rank_0_logs_raises_on_every_other_rank_and_leaves_rank_0_waiting(
    run_world, semantics, world_size, callback, rank_zero_only
):
    """``if self.global_rank == 0: self.log("val_score", v)`` (plain, or with ``rank_zero_only=True``:
    the same outcome) with ``ModelCheckpoint(monitor="val_score")`` or ``EarlyStopping(monitor=
    "val_score")``: at the end of the first epoch every rank but rank 0 raises Lightning's "key not
    found" error, and rank 0, which found its key, is left in ``reduce_boolean_decision`` and never
    finishes. ddpprobe reports ``RankFailed`` naming ranks 1..W-1 with Lightning's message. Rank 0 is
    found in ``reduce_boolean_decision`` either way the world ends, which is a matter of timing, not of
    Lightning: ended there by the launcher once its peers had failed ("did not finish", its stack read),
    or, when its process-group timeout came first, raising gloo's timeout from there (the next fact)."""
    with pytest.raises(RankFailed) as failure:
        run_world(
            hazards.monitor_rank0_key,
            world_size,
            callback=callback,
            values=VALUES[callback],
            rank_zero_only=rank_zero_only,
            n_per_rank=N_PER_RANK,
            batch_size=BATCH_SIZE,
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )

    err = failure.value
    exc_type, message = MISSING_KEY[callback]
    others = list(range(1, world_size))
    raised = sorted(r for r in err.ranks if r != 0)
    semantics.number("ranks that raised Lightning's error", str(raised), vs=("rank 0", "never finishes"))
    assert raised == others, f"{err.ranks}\n{err}"
    assert {r: err.exc_types[r] for r in others} == {r: exc_type for r in others}, err.exc_types
    for rank in others:
        assert message in err.rank_errors[rank], err.rank_errors[rank]
    where = gloo.where_waiting(err, 0)
    assert "reduce_boolean_decision" in where, f"rank 0:\n{where}"
    if 0 in err.ranks:  # its process-group timeout came before the launcher ended it
        assert gloo.error_kind(err.rank_errors[0]) in (gloo.TIMED_OUT, gloo.PEER_GONE), err.rank_errors[0]
    else:
        assert err.rank_errors[0] == "did not finish", err.rank_errors


@run_if(backend="gloo")  # the text of gloo's timeout; NCCL reports its own (see ..._nccl.py)
@pytest.mark.parametrize("callback", sorted(MISSING_KEY))
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.waits_for_timeout
def test_rank_0_left_in_reduce_boolean_decision_raises_at_the_process_group_timeout(
    run_world, semantics, world_size, callback
):
    """Where rank 0 waits, shown by keeping the other ranks in the world: they record Lightning's error
    and stay alive (``hold_s``) instead of raising. Rank 0 then raises on its own when the
    process-group timeout (here 2 s) expires, with a traceback through the callback and
    ``reduce_boolean_decision``'s barrier (``_sync_ddp``) and gloo's own message naming the timeout
    ("Timed out waiting 2000ms for recv operation to complete"); ddpprobe reports ``RankFailed``
    naming rank 0, before the world's timeout."""
    hold_s = PG_TIMEOUT_S + 5
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        run_world(
            hazards.monitor_rank0_key,
            world_size,
            callback=callback,
            values=VALUES[callback],
            hold_s=hold_s,
            n_per_rank=N_PER_RANK,
            batch_size=BATCH_SIZE,
            timeout=WORLD_TIMEOUT_S,
            pg_timeout=PG_TIMEOUT_S,
        )
    elapsed = time.monotonic() - start

    err = failure.value
    semantics.number("rank 0 raised after (s)", round(elapsed, 1), vs=("process-group timeout (s)", PG_TIMEOUT_S))
    assert err.ranks == [0], f"{err.ranks}\n{err}"
    traceback = err.tracebacks[0]
    hook = "model_checkpoint.py" if callback == "checkpoint" else "early_stopping.py"
    assert hook in traceback and "reduce_boolean_decision" in traceback and "barrier" in traceback, traceback
    assert gloo.error_kind(err.rank_errors[0]) == gloo.TIMED_OUT, err.rank_errors[0]
    assert f"Timed out waiting {PG_TIMEOUT_S * 1000}ms" in err.rank_errors[0], err.rank_errors[0]
    assert elapsed >= PG_TIMEOUT_S, f"reported after {elapsed:.1f}s"


@pytest.mark.parametrize("callback", sorted(MISSING_KEY))
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_logging_the_monitored_key_lets_checkpoint_and_early_stopping_decide_together(
    run_world, semantics, world_size, callback
):
    """The fix: log the monitored key on every rank (``sync_dist=True`` when the ranks' values differ).
    Every rank's callback finds it and enters ``reduce_boolean_decision`` together: ``ModelCheckpoint``
    keeps the best epoch's checkpoint (written once, by rank 0) with the same ``best_model_score`` on
    every rank; ``EarlyStopping`` stops every rank after the first epoch whose value got worse."""
    values = VALUES[callback]
    world = run_world(
        hazards.monitor_rank0_key,
        world_size,
        callback=callback,
        values=values,
        every_rank=True,
        n_per_rank=N_PER_RANK,
        batch_size=BATCH_SIZE,
    )

    got = [
        {key: rec[key] for key in ("epochs_run", "files", "best_model_score", "stopped_epoch", "should_stop")}
        for rec in world.records
    ]
    if callback == "checkpoint":
        best = oracle.top1_checkpoint_epochs([values] * world_size, all)[-1]
        oracle.assert_distinct(best_epoch=best, last_epoch=len(values) - 1)
        step = (best + 1) * math.ceil(N_PER_RANK / BATCH_SIZE)
        expected = {
            "epochs_run": list(range(len(values))),
            "files": [f"rank0/checkpoints/epoch={best}-step={step}.ckpt"],
            "best_model_score": values[best],
            "stopped_epoch": None,
            "should_stop": False,
        }
        semantics.number("best_model_score", got[0]["best_model_score"], vs=("best value", values[best]))
    else:
        decisions = [oracle.early_stopping_local_decisions(values, mode="min", patience=1)] * world_size
        stop = oracle.first_epoch_where(decisions, any)
        oracle.assert_distinct(stop_epoch=stop, last_epoch=len(values) - 1)
        expected = {
            "epochs_run": list(range(stop + 1)),
            "files": [],
            "best_model_score": None,
            "stopped_epoch": stop,
            "should_stop": True,
        }
        semantics.number("stopped_epoch", got[0]["stopped_epoch"], vs=("epochs", len(values)))
    assert got == [expected] * world_size, oracle.side_by_side("got", got) + f"   expected {expected}"
