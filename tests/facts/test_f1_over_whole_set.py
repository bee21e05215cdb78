"""Seed question 2: how do you log F1, precision and recall over the *entire* validation set under DDP?

F1 is not decomposable: the F1 of a whole set is not the mean of its batches' (or ranks') F1. Four
ways side by side on one dataset, each checked against scikit-learn (and a fifth, (e), below):

(a) per-batch F1 logged with ``sync_dist=True``: Lightning averages batch F1s -> wrong;
(b) torchmetrics ``BinaryF1Score``/``BinaryPrecision``/``BinaryRecall`` objects passed to ``self.log``:
    their states (TP/FP/FN counts) are summed over ranks when ``compute()`` runs -> the global F1;
(c) ``self.all_gather`` of predictions and targets in ``on_validation_epoch_end`` -> the same;
(d) all-reduce (sum) of TP/FP/FN counts, constant memory -> the same.

"The global F1" here means over the samples the ranks evaluated, and ``DistributedSampler`` padding
adds duplicates when N does not divide by W. So (b)-(d) equal scikit-learn on the *padded* set, not
the single-process value; (e) gathers the sample ids too and drops duplicates, which gives the
single-process value. Sources: torchmetrics ``Metric.sync``/``Metric.compute`` (torchmetrics/metric.py);
pytorch_lightning/core/module.py ``LightningModule.all_gather``; the probe is ddpprobe/probes/f1.py.
"""

import pytest
from sklearn.metrics import f1_score, precision_score, recall_score

from ddpprobe.probes import f1
from tests.support import oracle


def _sklearn(ids) -> dict:
    y_true, y_pred = oracle.targets(ids), oracle.preds(ids)
    return {
        "f1": f1_score(y_true, y_pred, zero_division=0),
        "precision": precision_score(y_true, y_pred, zero_division=0),
        "recall": recall_score(y_true, y_pred, zero_division=0),
    }


def _batch_weighted_mean_f1(n, world_size, batch_size) -> float:
    """What (a) computes: each batch's F1 weighted by its size, averaged over every batch of every rank."""
    scores = [
        (f1_score(oracle.targets(b), oracle.preds(b), zero_division=0), len(b))
        for r in range(world_size)
        for b in oracle.batches(oracle.shard(n, world_size, r), batch_size)
    ]
    return sum(s * w for s, w in scores) / sum(w for _, w in scores)


@pytest.mark.parametrize("world_size, n, batch_size", [(2, 11, 3), (3, 16, 4)])
def test_f1_over_the_whole_validation_set_five_ways(run_world, semantics, world_size, n, batch_size):
    """(a) averaging per-batch F1 differs from the global F1; (b) metric objects, (c) all_gather and
    (d) all-reduced counts all equal scikit-learn on the padded set the ranks evaluated, on every rank;
    (e) dropping duplicate sample ids gives scikit-learn on the N unique samples (the single-process
    value), which differs from the padded one."""
    world = run_world(f1.f1_five_ways, world_size, n=n, batch_size=batch_size)

    padded = _sklearn(oracle.padded_indices(n, world_size))
    single = _sklearn(range(n))
    batch_mean = _batch_weighted_mean_f1(n, world_size, batch_size)
    oracle.assert_distinct(padded_f1=padded["f1"], single_process_f1=single["f1"], mean_of_batch_f1=batch_mean)
    oracle.assert_distinct(padded_precision=padded["precision"], single_process_precision=single["precision"])

    got0 = world[0].record["callback_metrics"]
    semantics.number("mean of batch F1", got0["a_f1"], vs=("metric-object F1", got0["b_f1"]))
    semantics.number("deduplicated F1", got0["e_f1"], vs=("scikit-learn F1 on the N samples", single["f1"]))
    for rank in world:
        got = rank.record["callback_metrics"]
        assert got["a_f1"] == pytest.approx(batch_mean, abs=1e-6), f"rank {rank.rank}: a_f1 {got['a_f1']}"
        for way in ("b", "c", "d"):
            for name, expected in padded.items():
                assert got[f"{way}_{name}"] == pytest.approx(expected, abs=1e-6), (
                    f"rank {rank.rank}: {way}_{name} = {got[f'{way}_{name}']}, sklearn on padded set = {expected}, "
                    f"single-process = {single[name]}"
                )
        for name, expected in single.items():
            assert got[f"e_{name}"] == pytest.approx(expected, abs=1e-6), f"rank {rank.rank}: e_{name}"


def test_metric_objects_need_no_sync_dist_and_trigger_no_sync_dist_warning(run_world, semantics):
    """Logging a torchmetrics object (b) emits no "recommended to use sync_dist=True" warning on any
    rank: the object syncs its own state, and Lightning knows it."""
    world = run_world(f1.f1_five_ways, 2, n=11, batch_size=3)
    semantics.number(
        "sync_dist warnings naming a metric object",
        sum(
            "sync_dist=True" in w["message"] and "'b_" in w["message"]
            for rank in world
            for w in rank.record["warnings"]
        ),
    )

    for rank in world:
        hints = [w["message"] for w in rank.record["warnings"] if "sync_dist=True" in w["message"]]
        assert not any("'b_" in h for h in hints), f"rank {rank.rank}: {hints}"
