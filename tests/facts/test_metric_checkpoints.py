"""Metric state in checkpoints: a torchmetrics metric made ``persistent(True)`` and saved by
``ModelCheckpoint`` during a DDP ``fit`` holds rank 0's state only, and every rank of a new DDP run loads it.

``Metric.state_dict`` copies the rank's local, unsynced state, and the checkpoint file is rank 0's
(``Strategy.save_checkpoint`` writes on global rank 0 only). A new run loads the file on every rank, so
every rank starts from rank 0's state, and ``compute()``, which sums the ranks' states, counts it W times.
Lightning 1.x restored metric states on rank 0 only (and synced them before saving under fault-tolerant
training); 2.0 dropped that logic (Lightning #12193), and nothing replaced it. The fix, written in the
module's ``on_save_checkpoint`` / ``on_load_checkpoint``, is the control here.

``SumMetric`` of the training batches' ``value`` (``id ** 2``), N = 10, batch 2, one epoch; each rank's
shuffled ``DistributedSampler`` shard (seed 0, padded) from ``oracle.distributed_sampler_ids``. The probe
is ddpprobe/probes/metric_checkpoints.py. Sources: torchmetrics/metric.py ``Metric.state_dict``,
``Metric._load_from_state_dict``, ``Metric.persistent``; pytorch_lightning/strategies/strategy.py
``Strategy.save_checkpoint``, ``lightning_module_state_dict``; pytorch_lightning/trainer/connectors/
checkpoint_connector.py ``dump_checkpoint``, ``restore_model``.
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import metric_checkpoints as checkpoints
from tests.support import oracle

N, BATCH_SIZE = 10, 2


def _rank_sums(world_size: int) -> list:
    """Each rank's sum of ``value`` over its shuffled training shard (padding included)."""
    return [
        sum(oracle.values(oracle.distributed_sampler_ids(N, world_size, r, shuffle=True, seed=0)))
        for r in range(world_size)
    ]


def _run_both(run_world, tmp_path, world_size: int, fix: bool):
    params = dict(ckpt_dir=str(tmp_path), fix=fix, n=N, batch_size=BATCH_SIZE)
    fitted = run_world(checkpoints.fit_and_checkpoint, world_size, **params)
    loaded = run_world(checkpoints.load_and_compute, world_size, **params)
    return fitted, loaded


@run_if(lightning=">=2.0")  # 1.x reset the metrics of every rank but 0 after loading
@pytest.mark.fresh_world("the second world loads the checkpoint file the first one writes")
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_persistent_metric_checkpointed_in_ddp_holds_rank_0s_state_and_a_new_run_computes_it_w_times(
    run_world, semantics, tmp_path, world_size
):
    """Saved during ``fit``: the checkpoint's ``total.sum_value`` is rank 0's local sum (110 at W = 2),
    not the sum of all ranks (285). Loaded by ``trainer.validate(ckpt_path=...)`` in a new world: every
    rank holds rank 0's sum, and ``compute()`` on every rank gives W times it (220), neither the all-rank
    sum nor rank 0's."""
    fitted, loaded = _run_both(run_world, tmp_path, world_size, fix=False)

    own = _rank_sums(world_size)
    oracle.assert_distinct(rank0=own[0], all_ranks=sum(own), w_times_rank0=world_size * own[0])
    local = [rec["fit_local_state"] for rec in fitted.records]
    assert local == pytest.approx(own), oracle.side_by_side("state at the end of fit", local) + f"  expected {own}"
    saved = [rec["saved_state"] for rec in fitted.records]
    semantics.number("checkpointed state", saved[0], vs=("all ranks together", sum(own)))
    assert saved == pytest.approx([own[0]] * world_size), oracle.side_by_side("in the file", saved)
    after = [rec["loaded_state"] for rec in loaded.records]
    assert after == pytest.approx([own[0]] * world_size), oracle.side_by_side("state after loading", after)
    computed = [rec["computed"] for rec in loaded.records]
    semantics.number("compute() after loading", computed[0], vs=("all ranks together", sum(own)))
    assert computed == pytest.approx([world_size * own[0]] * world_size), (
        oracle.side_by_side("compute()", computed) + f"  expected W x rank 0's {world_size * own[0]}, all {sum(own)}"
    )


@run_if(lightning="<2.0")
@pytest.mark.fresh_world("the second world loads the checkpoint file the first one writes")
@pytest.mark.parametrize("world_size", [2, 3])
def test_before_2_0_a_checkpointed_metric_is_restored_on_rank_0_only_so_compute_gives_rank_0s_state(
    run_world, semantics, tmp_path, world_size
):
    """Lightning 1.x reset every ``Metric`` of every rank but 0 after loading a checkpoint
    (checkpoint_connector.py ``restore_model``; it synced the states before saving only under fault-tolerant
    training): the file holds rank 0's local sum, rank 0 restores it, the others hold 0, and ``compute()``
    gives rank 0's local sum (110 at W = 2), not the all-rank 285. Checked on 1.9.5."""
    fitted, loaded = _run_both(run_world, tmp_path, world_size, fix=False)

    own = _rank_sums(world_size)
    oracle.assert_distinct(rank0=own[0], all_ranks=sum(own), w_times_rank0=world_size * own[0])
    saved = [rec["saved_state"] for rec in fitted.records]
    assert saved == pytest.approx([own[0]] * world_size), oracle.side_by_side("in the file", saved)
    after = [rec["loaded_state"] for rec in loaded.records]
    assert after == pytest.approx([own[0]] + [0.0] * (world_size - 1)), oracle.side_by_side("after loading", after)
    computed = [rec["computed"] for rec in loaded.records]
    semantics.number("compute() after loading", computed[0], vs=("all ranks together", sum(own)))
    assert computed == pytest.approx([own[0]] * world_size), oracle.side_by_side("compute()", computed)


@pytest.mark.fresh_world("the second world loads the checkpoint file the first one writes")
@pytest.mark.parametrize("world_size", [2, 3])
def test_saving_the_synced_state_and_loading_it_on_rank_0_only_restores_the_all_rank_value(
    run_world, semantics, tmp_path, world_size
):
    """The fix: ``on_save_checkpoint`` writes the state synced over all ranks (``metric.sync()`` /
    ``unsync()`` on every rank), and ``on_load_checkpoint`` drops the metric's keys on every rank but 0.
    The file holds the all-rank sum; after loading rank 0 holds it and the others the default 0, so
    ``compute()`` gives every rank the all-rank sum, the value ``compute()`` had at the end of ``fit``."""
    fitted, loaded = _run_both(run_world, tmp_path, world_size, fix=True)

    own = _rank_sums(world_size)
    oracle.assert_distinct(rank0=own[0], all_ranks=sum(own), w_times_all=world_size * sum(own))
    saved = [rec["saved_state"] for rec in fitted.records]
    assert saved == pytest.approx([sum(own)] * world_size), oracle.side_by_side("in the file", saved)
    after = [rec["loaded_state"] for rec in loaded.records]
    assert after == pytest.approx([sum(own)] + [0.0] * (world_size - 1)), oracle.side_by_side("after loading", after)
    computed = [rec["computed"] for rec in loaded.records]
    semantics.number("compute() after loading", computed[0], vs=("without the fix", world_size * own[0]))
    assert computed == pytest.approx([sum(own)] * world_size), oracle.side_by_side("compute()", computed)
