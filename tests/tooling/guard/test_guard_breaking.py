"""``CollectiveGuard`` on modules written the way users write them: correct ones run unchanged, and a few
hazards the facts do not cover become one clear error on every rank.

Correct modules (Lightning's ``BoringModel`` with the progress bar, ``ModelCheckpoint`` and
``EarlyStopping``; torchmetrics objects logged with ``self.log`` / ``self.log_dict`` and ``self.all_gather``;
fit, test, validate and predict on one Trainer with two validation dataloaders and gradient accumulation;
shards of different ids and last-batch sizes; manual optimization; the module's own barriers) give the
same record with the guard as without it: every value each rank produced and how far the default process
group's sequence number moved (``pg_seq``: how many collectives the backend ran), so the guard raised no
false alarm, added no collective and removed none. ``checks`` (the guard's count of passed checks) is the
one field that differs.

Hazards (a barrier on rank 0 only, a metric's ``compute()`` on different batches per rank, a broadcast
whose ``src`` is the rank itself, a collective in ``predict_step`` over unequal predict shards) raise
``CollectiveMismatch`` on every rank, naming each rank's side, before any collective pairs wrongly: the
process-group timeout (10 s) would otherwise end them with gloo's own error, and the world's timeout
(60 s) is above both. Scenarios: tests/support/guard_breaking.py.

The hazards read recorded worlds (the fixture ``failed_world``, tests/support/guard_recordings.py): what each rank
posted at the check that differed, stored under tests/recordings/guard/ by one live run, and every rank's error
computed from it here by the guard's own verdict (``_exchange.verdict``). The correct modules' runs are live claims
(the guard changed nothing in a real world, added and removed no collective): two worlds each, in the integration
run (``pytest -m integration``); test_guard_twins.py keeps one such pair in the default run.
"""

import pytest

from ddpprobe.probes.data import sample_value
from tests.support import guard_breaking, oracle
from tests.tooling.guard.test_guard_hazards import _guard_errors, _line

#: The process-group timeout and the world's timeout (seconds).
LIMITS = {"pg_timeout": 10, "timeout": 60}
WAIT_ALONE = "would wait in a collective the other ranks do not call"
#: The uneven-batches diagnosis, wrong where every rank reached the same batch.
UNEVEN = "The ranks ran different numbers of batches"


def _twins(run_world, scenario, world_size: int, **params) -> list:
    """Records of ``scenario`` without the guard, after checking the guarded run's agree but for ``checks``."""
    plain = run_world(scenario, world_size, guard=False, **params, **LIMITS).records
    guarded_ = run_world(scenario, world_size, guard=True, **params, **LIMITS).records
    assert [r["checks"] for r in plain] == [None] * world_size
    assert all(r["checks"] > 0 for r in guarded_), oracle.side_by_side("checks", [r["checks"] for r in guarded_])
    assert all(isinstance(r["pg_seq"], int) and r["pg_seq"] > 0 for r in plain), [r["pg_seq"] for r in plain]
    without = [{k: v for k, v in r.items() if k != "checks"} for r in plain]
    with_guard = [{k: v for k, v in r.items() if k != "checks"} for r in guarded_]
    assert with_guard == without, (
        oracle.side_by_side("with the guard", with_guard) + "\n" + oracle.side_by_side("without", without)
    )
    return without


# ---------------------------------------------------------------------------------------------
# Correct modules: the same run with the guard
# ---------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_boring_model_with_progress_bar_checkpoint_and_early_stopping_fits_the_same_with_the_guard(
    run_world, world_size
):
    """Lightning's ``BoringModel`` (plus a synced ``val_loss`` and a step/epoch ``train_loss`` on the
    progress bar), 2 epochs with validation, the progress bar on (it reads the metrics on rank 0 only),
    ``log_every_n_steps=1``, a ``CSVLogger``, ``ModelCheckpoint`` and ``EarlyStopping`` monitoring
    ``val_loss`` (their broadcasts, barriers and ``reduce_boolean_decision`` checked): the same weights,
    metrics, best checkpoint and stop with the guard as without it."""
    without = _twins(run_world, guard_breaking.boring_fit, world_size)
    assert [r["global_step"] for r in without] == [2 * 4] * world_size, without  # 2 epochs x limit_train_batches
    assert all(r["best_model_path"].endswith(".ckpt") and "val_loss" in r["callback_metrics"] for r in without)


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_torchmetrics_objects_log_dict_and_all_gather_give_the_same_values_with_the_guard(run_world, world_size):
    """``BinaryAccuracy`` logged with ``self.log(key, metric)`` (train on step and epoch, validation), a
    ``MetricCollection`` with ``self.log_dict``, a logged ``MeanMetric``, ``sync_dist=True`` scalars and
    ``self.all_gather`` of each rank's ids in ``on_validation_epoch_end``, through fit (with the sanity
    check) and a later ``trainer.validate``: the same metrics, gathered ids and weights with the guard as
    without it. Every rank gathers every sample id (DistributedSampler pads ``n`` to a multiple of W)."""
    n = 5 * world_size + 1
    without = _twins(run_world, guard_breaking.metrics_fit, world_size, n=n, batch_size=2)
    for r in without:
        assert set(sum(r["gathered"][-1], [])) == set(range(n)), r["gathered"]
        assert {"acc", "val_precision", "val_recall", "mean_value", "value_sync"} <= set(r["validate_metrics"]), r


def _chunks(ids: list, size: int) -> list:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


@pytest.mark.integration
@pytest.mark.parametrize("num_sanity_val_steps", [2, 0])
@pytest.mark.parametrize("world_size", [2, 3])
def test_fit_test_validate_predict_on_one_trainer_give_the_same_values_with_the_guard(
    run_world, world_size, num_sanity_val_steps
):
    """fit with two validation dataloaders, ``limit_val_batches=2``, ``accumulate_grad_batches=2``,
    ``check_val_every_n_epoch=2`` and ``num_sanity_val_steps`` default or 0, then test, validate and
    predict on the same Trainer (one guard instance, one session per stage): the same values, returned
    dicts and predictions with the guard as without it. Predict shards ``IdDataset(5)`` without padding
    (``UnrepeatedDistributedSamplerWrapper``: rank ``r`` predicts ids ``r, r + W, ...``): at W=2 rank 0
    runs 2 batches and rank 1 one, which the guard must not take for uneven batches (no collective pairs
    predict batches)."""
    without = _twins(run_world, guard_breaking.stages, world_size, num_sanity_val_steps=num_sanity_val_steps)
    # 12 samples in batches of 2, an optimizer step every 2 batches and at the epoch's end, 4 epochs
    batches = -(-12 // world_size // 2)
    assert [r["global_step"] for r in without] == [4 * -(-batches // 2)] * world_size, without
    expected = [_chunks(list(range(r, 5, world_size)), 2) for r in range(world_size)]
    assert [[b["id"] for b in r["predictions"]] for r in without] == expected, without
    assert all(len(r["validate_returned"]) == 2 for r in without), without


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_distributed_sampler_shards_with_a_cat_metric_give_the_same_values_with_the_guard(run_world, world_size):
    """``IdDataset(3W + 1)`` sharded by DistributedSampler (different ids per rank, one padded sample) in
    batches of 2, a ``CatMetric`` of the ids and a ``MeanMetric`` computed on every rank, a step and epoch
    ``sync_dist`` log: the same values with the guard as without it, the ``CatMetric`` holding every
    rank's ids."""
    without = _twins(run_world, guard_breaking.shards, world_size, n=3 * world_size + 1, batch_size=2)
    every_id = sorted(sum((r["seen_ids"] for r in without), []))
    assert [r["computed"]["cat"] for r in without] == [every_id] * world_size, without


@pytest.mark.integration
def test_ranks_with_different_last_batch_sizes_and_metric_state_sizes_give_the_same_values_with_the_guard(run_world):
    """Rank 0 validates ids 0-4, rank 1 ids 5-10 (no DistributedSampler) in batches of 2: 3 batches each,
    the last of 1 sample on rank 0 and 2 on rank 1, so the ``CatMetric`` states have 5 and 6 rows at
    ``compute()`` (torchmetrics gathers their sizes, then pads): the same values with the guard as without
    it, the ``CatMetric`` holding ids 0-10 and the ``MeanMetric`` their mean value on every rank."""
    without = _twins(run_world, guard_breaking.shards, 2, sizes=[5, 6], batch_size=2)
    assert [len(r["seen_ids"]) for r in without] == [5, 6], without
    mean = sum(sample_value(i) for i in range(11)) / 11
    assert [r["computed"] for r in without] == [{"cat": list(map(float, range(11))), "mean": mean}] * 2, without


@pytest.mark.integration
@pytest.mark.parametrize("barriers", [False, True], ids=["manual_optimization", "with_own_barriers"])
def test_manual_optimization_and_the_modules_own_barriers_fit_the_same_with_the_guard(run_world, barriers):
    """Manual optimization (``manual_backward``, ``optimizer.step``) with a synced loss, and with every
    rank also calling ``self.trainer.strategy.barrier()`` in each ``training_step`` and epoch end: the
    same weights and metrics with the guard as without it."""
    without = _twins(run_world, guard_breaking.manual_fit, 2, barriers=barriers)
    assert [r["global_step"] for r in without] == [2 * 2] * 2, without  # 8 samples: 2 batches per rank, 2 epochs


# ---------------------------------------------------------------------------------------------
# Hazards: one CollectiveMismatch on every rank
# ---------------------------------------------------------------------------------------------


def _mismatch(failed_world, world_size: int, scenario, **params) -> dict:
    """Each rank's ``CollectiveMismatch`` text, from the recorded world of ``scenario`` (``failed_world``)."""
    failure = failed_world(scenario, world_size, **params, **LIMITS)
    return _guard_errors(failure, "CollectiveMismatch", list(range(world_size)))


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_barrier_on_rank_0_only_raises_collective_mismatch_on_every_rank(failed_world, world_size):
    """``if self.global_rank == 0: self.trainer.strategy.barrier()`` in ``validation_step``: every rank
    raises ``CollectiveMismatch`` at batch 0, naming rank 0's barrier (its line in the user's file and the
    call made there, ``DDPStrategy.barrier()``) and
    the other ranks at the end of batch 0, and saying rank 0 would wait alone (not that the ranks ran
    different numbers of batches: every rank reached batch 0). Recorded: the ranks' entries at batch 0."""
    errors = _mismatch(failed_world, world_size, guard_breaking.hazard, hazard="rank0_barrier")
    for message in errors.values():
        _line(0, "is about to barrier at guard_breaking.py", message)
        _line(0, ", run by `DDPStrategy.barrier()`", message)
        for rank in range(1, world_size):
            _line(rank, "is at on_validation_batch_end (batch 0, epoch 0)", message)
        assert WAIT_ALONE in message and UNEVEN not in message, message


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_metric_computed_on_alternate_batches_per_rank_raises_collective_mismatch_on_every_rank(
    failed_world, world_size
):
    """A ``MeanMetric``'s ``compute()`` when ``batch_idx % 2 == rank`` (rank 0 on even batches, rank 1 on
    odd ones, rank 2 never): every rank raises ``CollectiveMismatch`` at batch 0, naming rank 0's
    ``MeanMetric`` state sync and the other ranks at the end of batch 0. Recorded: the ranks' entries at batch 0."""
    errors = _mismatch(failed_world, world_size, guard_breaking.hazard, hazard="alternate_compute")
    for message in errors.values():
        _line(0, "(MeanMetric state sync at compute())", message)
        for rank in range(1, world_size):
            _line(rank, "is at on_validation_batch_end (batch 0, epoch 0)", message)
        assert WAIT_ALONE in message and UNEVEN not in message, message


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_broadcast_whose_source_is_each_ranks_own_raises_collective_mismatch_naming_each_src(
    failed_world, world_size
):
    """``self.trainer.strategy.broadcast(obj, src=self.global_rank)``: the same op, dtype and call site on
    every rank, but every rank sends and none receives (gloo blocks until the process-group timeout).
    Every rank raises ``CollectiveMismatch`` naming each rank's ``src`` and saying the ranks name different
    source ranks. Recorded: the ranks' entries at the broadcast."""
    errors = _mismatch(failed_world, world_size, guard_breaking.hazard, hazard="broadcast_own_rank", n=2 * world_size)
    for message in errors.values():
        for rank in range(world_size):
            _line(rank, "is about to broadcast_object_list object at guard_breaking.py", message)
            _line(rank, ", run by `DDPStrategy.broadcast()`", message)
            _line(rank, f"[src={rank}]", message)
        assert "name different source or destination ranks" in message, message


def test_a_collective_in_predict_step_over_unequal_predict_shards_raises_collective_mismatch_on_every_rank(
    failed_world,
):
    """``self.all_gather`` in ``predict_step`` over ``IdDataset(5)`` in batches of 2: Lightning's predict
    shards are unpadded (rank 0: 2 batches, rank 1: 1), so rank 0's second all_gather has no partner.
    Every rank raises ``CollectiveMismatch`` naming rank 0's all_gather and rank 1 at the predict epoch's
    end (recorded: the ranks' entries there); the same predict without the all_gather runs unchanged (below)."""
    errors = _mismatch(failed_world, 2, guard_breaking.predict_gather, n=5, batch_size=2)
    for message in errors.values():
        _line(0, "is about to all_gather", message)
        _line(1, "is at on_predict_epoch_end", message)


@pytest.mark.integration
def test_the_same_predict_over_unequal_predict_shards_without_the_all_gather_runs_unchanged_with_the_guard(run_world):
    """The predict of the test above without the ``self.all_gather``: rank 0 predicts 2 batches, rank 1 one, and
    the guard, which does not compare predict batches, changes nothing."""
    without = _twins(run_world, guard_breaking.predict_gather, 2, n=5, batch_size=2, gather=False)
    assert [r["predictions"] for r in without] == [[[0, 2], [4]], [[1, 3]]], without


@pytest.mark.integration
def test_mid_epoch_validation_differentiable_all_gather_and_step_checkpoints_fit_the_same_with_the_guard(run_world):
    """``val_check_interval=0.5`` (validation inside the training epoch), a loss over
    ``self.all_gather(out, sync_grads=True)`` (its backward all_gather runs inside ``loss.backward()``, on
    every rank), a user's callback gathering the weights in ``on_validation_epoch_end`` and a checkpoint
    every step: the same weights, metrics, gathered weights and checkpoints with the guard as without it."""
    without = _twins(run_world, guard_breaking.gather_grad_fit, 2)
    # 16 samples: 4 batches per rank and epoch, validated after batches 2 and 4, for 2 epochs, after the sanity check
    assert [len(r["gathered"]) for r in without] == [1 + 2 * 2] * 2, without
    assert [r["global_step"] for r in without] == [2 * 4] * 2, without


@pytest.mark.integration
@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_shards_of_different_lengths_cut_to_equal_batch_counts_by_limit_batches_run_the_same_with_the_guard(
    run_world, stage
):
    """Rank 0 holds 6 samples (3 batches of 2), rank 1 10 (5 batches), cut to 3 batches each by
    ``limit_train_batches`` / ``limit_val_batches``: at batch 2 rank 0's loader is exhausted and rank 1's is
    not, yet both loops stop there, so the guard's "no batch after this one" comparison must follow the
    limit, not the loader. The same values with the guard as without it."""
    if stage == "fit":
        without = _twins(run_world, guard_breaking.limited_fit, 2, sizes=[6, 10], limit=3)
        assert [r["global_step"] for r in without] == [2 * 3] * 2, without
    else:
        without = _twins(run_world, guard_breaking.shards, 2, sizes=[6, 10], batch_size=2, limit=3)
        assert [len(r["seen_ids"]) for r in without] == [6, 6], without


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_keys_logged_on_rank_0_only_with_rank_zero_only_run_the_same_with_the_guard(run_world, world_size):
    """A key logged on rank 0 only with ``rank_zero_only=True`` (never synced, so no collective to
    pair), between keys every rank logs with ``sync_dist=True``, in ``validation_step`` and
    ``on_validation_epoch_end``: the same values with the guard as without it, only rank 0 holding the
    rank-0 keys."""
    without = _twins(run_world, guard_breaking.rank_zero_log, world_size, n=4 * world_size)
    assert [{"rank0", "rank0_end"} <= set(r["callback_metrics"]) for r in without] == [True] + [False] * (
        world_size - 1
    ), without


@pytest.mark.integration
def test_shards_of_different_lengths_stopped_by_max_steps_at_the_short_ranks_last_batch_fit_the_same_with_the_guard(
    run_world,
):
    """Rank 0 holds 6 samples (3 batches of 2), rank 1 10 (5 batches), ``max_steps=3``: both ranks stop
    after batch 2, where rank 0's loader is exhausted and rank 1's is not. The guard counts the step that
    reaches ``max_steps`` as the last batch on every rank: the same weights with the guard as without it."""
    without = _twins(run_world, guard_breaking.limited_fit, 2, sizes=[6, 10], max_steps=3)
    assert [r["global_step"] for r in without] == [3, 3], without


@pytest.mark.parametrize("max_steps", [4, -1])
def test_shards_of_different_lengths_not_stopped_by_max_steps_still_raise_at_the_short_ranks_last_batch(
    failed_world, max_steps
):
    """The same shards with ``max_steps`` beyond the short rank's 3 batches (or none): rank 1 would run a
    batch rank 0 does not, so every rank raises ``CollectiveMismatch`` at ``on_train_batch_start`` of batch
    2, rank 0's last (the ``max_steps`` rule does not hide uneven batches). Recorded: the ranks' entries there."""
    errors = _mismatch(failed_world, 2, guard_breaking.limited_fit, sizes=[6, 10], max_steps=max_steps)
    for message in errors.values():
        _line(0, "is at on_train_batch_start (batch 2, epoch 0, this rank's last batch)", message)
        _line(1, "is at on_train_batch_start (batch 2, epoch 0)", message)
        assert UNEVEN in message, message
