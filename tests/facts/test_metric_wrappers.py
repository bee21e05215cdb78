"""torchmetrics wrappers under DDP: ``Running`` syncs only as its base metric says, and a
``MetricCollection``'s compute groups share updates, not syncs.

``Running(base, window)`` keeps the base metric's states of the last ``window`` updates and, in
``compute()``, merges them into the base metric and calls the *base's* ``compute()``, which syncs the
merged states when the base has ``sync_on_compute=True`` (the default) and not otherwise; the wrapper's own
``compute`` never syncs (``WrapperMetric._wrap_compute``), whatever its own ``sync_on_compute`` says
(torchmetrics #1899 asked for exactly this). A ``MetricCollection`` with ``compute_groups=True`` notices
that ``BinaryPrecision``, ``BinaryRecall`` and ``BinaryF1Score`` hold the same states (tp, fp, tn, fn)
and updates only the first of each group, the others sharing its state tensors; but ``compute()`` still
calls every metric's ``compute()``, and each syncs its own (shared) states: one all_gather of the states
per metric, not per group.

Each rank updates its metrics from its ``DistributedSampler`` shard (``oracle.shard``) in
``validation_step`` and calls ``compute()`` once in ``on_validation_epoch_end``; the probe counts the state
syncs (``Metric._sync_dist`` calls) and the backend's collectives (``trace.pg_seq``) of that call. The
probe is ddpprobe/probes/metric_wrappers.py.
Sources: torchmetrics/wrappers/running.py ``Running.compute``; torchmetrics/wrappers/abstract.py
``WrapperMetric``; torchmetrics/metric.py ``Metric._wrap_compute``, ``Metric._sync_dist``;
torchmetrics/collections.py ``MetricCollection.update``, ``_compute_and_reduce``, ``_merge_compute_groups``;
torchmetrics/utilities/distributed.py ``gather_all_tensors`` (a barrier, an all_gather of the sizes and one
of the values for each state of one or more dimensions).
"""

import pytest
from sklearn.metrics import f1_score, precision_score, recall_score

from ddpprobe.probes import metric_wrappers as wrappers
from tests.support import oracle

# ---------------------------------------------------------------------------------------------
# 1. Running(base, window): synced by the base's sync_on_compute only
# ---------------------------------------------------------------------------------------------

N_RUNNING, BATCH_SIZE, WINDOW = 12, 2, 2


def _window_sums(world_size: int) -> list:
    """Each rank's sum of ``value`` over its last ``WINDOW`` batches."""
    rows = oracle.rank_batches(N_RUNNING, world_size, BATCH_SIZE)
    return [sum(sum(oracle.values(batch)) for batch in batches[-WINDOW:]) for batches in rows]


@pytest.mark.parametrize("world_size", [2, 3])
def test_running_over_a_base_with_sync_on_compute_false_computes_each_ranks_own_window_without_a_collective(
    run_world, semantics, world_size
):
    """``Running(SumMetric(sync_on_compute=False), window=2).compute()``: each rank gets the sum over its
    own last two batches, with no state sync and no collective at all, although the ``Running`` object's
    own ``sync_on_compute`` is ``True``."""
    world = run_world(wrappers.running, world_size, sync_on_compute=False, window=WINDOW, n=N_RUNNING)

    own = _window_sums(world_size)
    oracle.assert_distinct(all_ranks=sum(own), **{f"rank{r}": v for r, v in enumerate(own)})
    got = [rec["computed"] for rec in world.records]
    semantics.number("rank 0's running sum", got[0], vs=("over all ranks", sum(own)))
    assert got == pytest.approx(own), oracle.side_by_side("computed", got) + f"  expected (own window) {own}"
    counts = [(rec["state_syncs"], rec["collectives"]) for rec in world.records]
    assert counts == [([], 0)] * world_size, oracle.side_by_side("(state syncs, collectives)", counts)
    assert [rec["wrapper_sync_on_compute"] for rec in world.records] == [True] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_running_over_a_default_base_syncs_the_windows_of_every_rank_in_one_state_sync(
    run_world, semantics, world_size
):
    """The control: with the base's default ``sync_on_compute=True``, ``compute()`` makes one state sync
    (the base's) and every rank gets the sum of all ranks' last-two-batch windows."""
    world = run_world(wrappers.running, world_size, sync_on_compute=True, window=WINDOW, n=N_RUNNING)

    own = _window_sums(world_size)
    got = [rec["computed"] for rec in world.records]
    semantics.number("running sum", got[0], vs=("rank 0's own window", own[0]))
    assert got == pytest.approx([sum(own)] * world_size), (
        oracle.side_by_side("computed", got) + f"  expected {sum(own)}"
    )
    syncs = [rec["state_syncs"] for rec in world.records]
    assert syncs == [["SumMetric"]] * world_size, oracle.side_by_side("state syncs", syncs)


# ---------------------------------------------------------------------------------------------
# 2. MetricCollection compute groups: shared updates, one state sync per metric
# ---------------------------------------------------------------------------------------------

N_COLLECTION = 14
SKLEARN = {"BinaryPrecision": precision_score, "BinaryRecall": recall_score, "BinaryF1Score": f1_score}


def _scores(ids) -> dict:
    return {name: float(fn(oracle.targets(ids), oracle.preds(ids))) for name, fn in SKLEARN.items()}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("compute_groups", [True, False])
def test_a_metric_collection_syncs_each_metric_once_per_compute_with_or_without_compute_groups(
    run_world, semantics, world_size, compute_groups
):
    """``MetricCollection([BinaryPrecision(), BinaryRecall(), BinaryF1Score()], compute_groups=...)``: with
    compute groups the three form one group (they share tp, fp, tn, fn), without they form none; either
    way one ``compute()`` makes three state syncs, one per metric, not one per group, and the same
    backend collectives (a barrier and two all_gathers per state). Grouped and ungrouped values agree with
    scikit-learn's precision, recall and F1 over all ranks' samples."""
    world = run_world(wrappers.collection, world_size, compute_groups=compute_groups, n=N_COLLECTION)

    whole = _scores(oracle.padded_indices(N_COLLECTION, world_size))
    own = [_scores(oracle.shard(N_COLLECTION, world_size, r)) for r in range(world_size)]
    for name in wrappers.COLLECTION:
        for r in range(world_size):
            oracle.assert_distinct(whole=whole[name], **{f"rank{r}_own": own[r][name]})
    got = [rec["computed"] for rec in world.records]
    assert got == [pytest.approx(whole, rel=1e-6)] * world_size, (
        oracle.side_by_side("computed", got) + f"  expected (all ranks) {whole}"
    )
    groups = [rec["groups"] for rec in world.records]
    expected_groups = {"0": list(wrappers.COLLECTION)} if compute_groups else {}
    assert groups == [expected_groups] * world_size, oracle.side_by_side("compute groups", groups)
    syncs = [rec["state_syncs"] for rec in world.records]
    semantics.number("state syncs per compute()", len(syncs[0]), vs=("compute groups", max(len(expected_groups), 1)))
    assert syncs == [list(wrappers.COLLECTION)] * world_size, oracle.side_by_side("state syncs", syncs)
    states = world.records[0]["states"]
    collectives = [rec["collectives"] for rec in world.records]
    assert collectives == [3 * sum(states.values())] * world_size, (
        oracle.side_by_side("collectives", collectives) + f"  expected 3 per state, states {states}"
    )
