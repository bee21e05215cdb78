"""Expected values, computed without Lightning: from the data and from the rules the facts are about.

Every fact compares what the ranks recorded with a number computed here (or by scikit-learn), never
with a number copied from an earlier run.
"""

from __future__ import annotations

import math
from collections import Counter

from ddpprobe.probes import sample_pred, sample_target, sample_value


def padded_indices(n: int, world_size: int) -> list:
    """The index list ``DistributedSampler(shuffle=False, drop_last=False)`` deals out.

    It is padded to a multiple of ``world_size`` by repeating indices from the start:
    ``[0, 1, ..., n-1, 0, 1, ...]`` with ``ceil(n / world_size) * world_size`` entries.
    Source: torch/utils/data/distributed.py ``DistributedSampler.__iter__``.
    """
    total = math.ceil(n / world_size) * world_size
    indices = list(range(n))
    while len(indices) < total:
        indices += list(range(n))[: total - len(indices)]
    return indices


def shard(n: int, world_size: int, rank: int) -> list:
    """Sample ids rank ``rank`` gets: every ``world_size``-th padded index starting at ``rank``."""
    return padded_indices(n, world_size)[rank::world_size]


def duplicates(n: int, world_size: int) -> Counter:
    """``{sample_id: extra copies}`` that padding adds (empty when ``n`` divides by ``world_size``)."""
    return Counter(padded_indices(n, world_size)) - Counter(range(n))


def batches(ids: list, batch_size: int) -> list:
    """``ids`` cut into consecutive batches of ``batch_size`` (the last one may be shorter)."""
    return [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def values(ids) -> list:
    return [sample_value(i) for i in ids]


def targets(ids) -> list:
    return [sample_target(i) for i in ids]


def preds(ids) -> list:
    return [sample_pred(i) for i in ids]


def assert_distinct(**semantics: float) -> None:
    """Fail if two competing semantics give the same number on the chosen data (to 1e-6).

    A fact whose data cannot tell two semantics apart proves nothing about which one Lightning uses.
    """
    names = list(semantics)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert abs(semantics[a] - semantics[b]) > 1e-6, (
                f"data do not discriminate: {a} = {b} = {semantics[a]}; choose other sizes"
            )


def side_by_side(label: str, per_rank: list) -> str:
    """``"label: rank 0 -> x  rank 1 -> y"`` for failure messages."""
    return f"{label}: " + "  ".join(f"rank {r} -> {v}" for r, v in enumerate(per_rank))


def distributed_sampler_ids(
    n: int, world_size: int, rank: int, epoch: int = 0, shuffle: bool = True, seed: int = 0
) -> list:
    """Sample ids rank ``rank`` gets from torch's own ``DistributedSampler`` over ``n`` samples after
    ``set_epoch(epoch)`` (``drop_last=False``): with ``shuffle`` a permutation drawn from a generator
    seeded ``seed + epoch``, padded from its start, then every ``world_size``-th entry from ``rank``.

    torch's sampler is the oracle here, not Lightning. Source: torch/utils/data/distributed.py
    ``DistributedSampler.__iter__``.
    """
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return [int(i) for i in sampler]


def batch_norm_update(running_mean: list, running_var: list, rows: list, momentum: float) -> tuple:
    """One training-mode batch-norm update of the running statistics, per channel, in float64.

    ``rows`` is the batch, a list of per-sample feature lists (B >= 2 samples, C channels).
    ``new = (1 - momentum) * old + momentum * batch_stat`` where the batch statistic is the mean for
    ``running_mean`` and the *unbiased* variance (divided by B - 1) for ``running_var``.
    Returns ``(new_mean, new_var)``, two lists of C floats.
    Source: torch/nn/modules/batchnorm.py ``_BatchNorm`` (``momentum``, ``running_var`` docs).
    """
    b = len(rows)
    if b < 2:
        raise ValueError(f"batch_norm_update needs at least 2 samples, got {b}")
    new_mean, new_var = [], []
    for c in range(len(rows[0])):
        column = [row[c] for row in rows]
        mu = sum(column) / b
        var = sum((v - mu) ** 2 for v in column) / (b - 1)
        new_mean.append((1 - momentum) * running_mean[c] + momentum * mu)
        new_var.append((1 - momentum) * running_var[c] + momentum * var)
    return new_mean, new_var


def rank_batches(n: int, world_size: int, batch_size: int) -> list:
    """``[rank][batch] -> list of sample ids`` for ``DistributedSampler(shuffle=False)`` shards cut into batches."""
    return [batches(shard(n, world_size, r), batch_size) for r in range(world_size)]


def log_reduce(reduce_fx: str, logged: list) -> float:
    """What one rank's epoch-level ``self.log(..., reduce_fx=...)`` accumulates from its logged values.

    ``logged`` is the rank's list of ``(value, batch_size)`` pairs, one per ``self.log`` call.
    ``"mean"``: the ``batch_size``-weighted mean ``sum(v * b) / sum(b)``; ``"sum"``: ``sum(v)`` (batch
    sizes ignored); ``"max"``/``"min"``: over the values.
    Source: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultMetric.update``.
    """
    if reduce_fx == "mean":
        return sum(v * b for v, b in logged) / sum(b for _, b in logged)
    if reduce_fx == "sum":
        return sum(v for v, _ in logged)
    if reduce_fx == "max":
        return max(v for v, _ in logged)
    if reduce_fx == "min":
        return min(v for v, _ in logged)
    raise ValueError(f"reduce_fx={reduce_fx!r}: use 'mean', 'sum', 'max' or 'min'")


def sync_reduce(reduce_fx: str, per_rank_logged: list) -> float:
    """The cross-rank epoch value ``sync_dist=True`` is meant to give: ``log_reduce`` over the
    ``(value, batch_size)`` pairs of all ranks together (``per_rank_logged[r]`` is rank ``r``'s list).

    For ``"mean"`` Lightning all-reduces the weighted sum and the batch-size count with the mean op and
    divides them, which equals this only when the count's mean is exact (see ``floored_sync_mean``).
    Source: result.py ``_ResultMetric.compute``; lightning_fabric/utilities/distributed.py ``_sync_ddp``.
    """
    return log_reduce(reduce_fx, [pair for logged in per_rank_logged for pair in logged])


def floored_sync_mean(per_rank_logged: list) -> float:
    """What ``_ResultMetric.compute`` gives for ``reduce_fx="mean", sync_dist=True``: the all-rank mean of
    the weighted sums divided by the all-rank mean of the integer batch-size counts, the latter
    truncated to an integer (``(sum(v*b) / W) / floor(sum(b) / W)``).

    Source: result.py ``_ResultMetric.compute`` (``cumulated_batch_size`` is an int64 tensor) and
    ``_sync_ddp`` (gloo: ``result.copy_(result / world_size)`` into the int tensor).
    """
    world_size = len(per_rank_logged)
    weighted = sum(v * b for logged in per_rank_logged for v, b in logged)
    count = sum(b for logged in per_rank_logged for _, b in logged)
    return (weighted / world_size) / (count // world_size)


def early_stopping_local_decisions(
    values: list, mode: str = "min", stopping_threshold=None, patience: int = 3, min_delta: float = 0.0
) -> list:
    """Per epoch, whether ``EarlyStopping`` on one rank, seeing only this rank's ``values``, wants to stop.

    The rule of pytorch_lightning/callbacks/early_stopping.py ``_evaluate_stopping_criteria`` (without
    the divergence threshold): stop when the value is not finite or beats ``stopping_threshold``;
    otherwise an improvement by more than ``min_delta`` resets the wait count, and anything else
    increments it, stopping once it reaches ``patience``. Returns a list of bools, one per epoch.
    """
    better = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
    best = math.inf if mode == "min" else -math.inf
    delta = min_delta if mode == "max" else -min_delta
    wait, decisions = 0, []
    for value in values:
        if not math.isfinite(value) or (stopping_threshold is not None and better(value, stopping_threshold)):
            decisions.append(True)
        elif better(value - delta, best):
            best, wait = value, 0
            decisions.append(False)
        else:
            wait += 1
            decisions.append(wait >= patience)
    return decisions


def first_epoch_where(decisions_per_rank: list, combine) -> "int | None":
    """The first epoch ``e`` at which ``combine([d[e] for d in decisions_per_rank])`` holds, else None.

    ``combine`` is the rule that turns the ranks' decisions into one: ``any``, ``all``, or e.g.
    ``lambda ds: ds[0]`` for "rank 0 decides alone".
    """
    for epoch in range(min(len(d) for d in decisions_per_rank)):
        if combine([d[epoch] for d in decisions_per_rank]):
            return epoch
    return None


def top1_checkpoint_epochs(values: list, combine, mode: str = "min") -> list:
    """Epochs at which ``ModelCheckpoint(save_top_k=1, monitor=..., mode=mode)`` saves, when rank ``r``
    monitors ``values[r][epoch]`` and the ranks' "improved" decisions are merged with ``combine``.

    The rule of pytorch_lightning/callbacks/model_checkpoint.py ``check_monitor_top_k``: the first
    epoch always saves (fewer than ``save_top_k`` checkpoints exist; no decision is reduced); later,
    each rank compares its value with the score it stored at the last save (strictly better), and the
    ranks' decisions are reduced. After a save every rank stores its own current value.
    """
    better = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
    best = [row[0] for row in values]
    saved = [0]
    for epoch in range(1, min(len(row) for row in values)):
        if combine([better(row[epoch], best[r]) for r, row in enumerate(values)]):
            saved.append(epoch)
            best = [row[epoch] for row in values]
    return saved


def unrepeated_shard(n: int, world_size: int, rank: int) -> list:
    """Sample ids rank ``rank`` gets from an *unpadded* round-robin deal of ``n`` samples: ``rank, rank+W, ...``
    below ``n``. Ranks get ``ceil`` or ``floor(n / W)`` samples; nothing is repeated or dropped.

    The rule of pytorch_lightning/overrides/distributed.py ``UnrepeatedDistributedSampler.__iter__``
    (``indices[rank:total_size:num_replicas]`` with ``total_size = len(dataset)``).
    """
    return list(range(rank, n, world_size))


def drop_last_shard(n: int, world_size: int, rank: int) -> list:
    """Sample ids rank ``rank`` gets from ``DistributedSampler(shuffle=False, drop_last=True)``: the first
    ``floor(n / W) * W`` indices dealt round-robin; the last ``n % W`` samples are seen by no rank.

    Source: torch/utils/data/distributed.py ``DistributedSampler.__init__`` (``num_samples``) and ``__iter__``.
    """
    total = (n // world_size) * world_size
    return list(range(total))[rank::world_size]


def best_threshold_scores(ids, label: int) -> dict:
    """F1, precision and recall of label column ``label`` at the threshold with the best F1 over the samples
    ``ids`` (duplicates count as often as they occur), by scikit-learn's ``precision_recall_curve``
    (predict ``score >= threshold``; ties go to the lowest threshold, the first maximum).

    Returns ``{"f1", "precision", "recall", "threshold", "ties"}``; ``ties`` is how many thresholds reach the
    best F1 (a fact whose data tie cannot tell the tie rule from the threshold rule). The scores and labels
    are the multi-label probe's fixed data (ddpprobe/probes/multilabel.py ``sample_scores``/``sample_labels``).
    """
    import numpy as np
    from sklearn.metrics import precision_recall_curve

    from ddpprobe.probes.multilabel import sample_labels, sample_scores

    y_true = [sample_labels(i)[label] for i in ids]
    y_score = [sample_scores(i)[label] for i in ids]
    precision, recall, thresholds = precision_recall_curve(y_true, y_score)
    precision, recall = precision[: len(thresholds)], recall[: len(thresholds)]
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(total), where=total > 0)
    k = int(np.argmax(f1))
    return {
        "f1": float(f1[k]),
        "precision": float(precision[k]),
        "recall": float(recall[k]),
        "threshold": float(thresholds[k]),
        "ties": int(np.isclose(f1, f1[k], rtol=0, atol=1e-12).sum()),
    }


def best_threshold_on_grid(ids, label: int, grid) -> dict:
    """Like :func:`best_threshold_scores`, but trying only the thresholds in ``grid`` (what a binned
    precision-recall curve can choose), scored with scikit-learn's ``f1_score``/``precision_score``/
    ``recall_score`` (``zero_division=0``)."""
    from sklearn.metrics import f1_score, precision_score, recall_score

    from ddpprobe.probes.multilabel import sample_labels, sample_scores

    y_true = [sample_labels(i)[label] for i in ids]
    y_score = [sample_scores(i)[label] for i in ids]
    best = None
    for threshold in grid:
        y_pred = [int(s >= threshold) for s in y_score]
        f1 = f1_score(y_true, y_pred, zero_division=0)
        if best is None or f1 > best["f1"]:
            best = {
                "f1": f1,
                "precision": precision_score(y_true, y_pred, zero_division=0),
                "recall": recall_score(y_true, y_pred, zero_division=0),
                "threshold": float(threshold),
            }
    return best


def best_threshold_per_batch_mean(n: int, world_size: int, batch_size: int, label: int, name: str) -> float:
    """What logging each batch's best-threshold ``name`` (f1, precision, recall or threshold) with
    ``sync_dist=True`` gives: the batch-size-weighted mean over every batch of every rank's padded shard.
    A batch whose column has no positive scores 0 (every threshold gives F1 0; the lowest is chosen)."""
    total, count = 0.0, 0
    for rank_batches_ in rank_batches(n, world_size, batch_size):
        for batch in rank_batches_:
            total += best_threshold_on_grid(batch, label, sorted({_score(i, label) for i in batch}))[name] * len(batch)
            count += len(batch)
    return total / count


def _score(sample_id: int, label: int) -> float:
    from ddpprobe.probes.multilabel import sample_scores

    return sample_scores(sample_id)[label]


def modulo_shard(n: int, world_size: int, rank: int) -> list:
    """Sample ids a user's own sharding "sample ``i`` goes to rank ``i % world_size``" gives rank ``rank``,
    in order: ``[rank, rank + W, ...]``. No padding, so ranks hold ``ceil`` or ``floor(n / W)`` samples."""
    return list(range(rank, n, world_size))


def round_robin(streams: list) -> list:
    """Interleave ``streams`` (lists of batches, one per ``DataLoader`` worker) the way a multi-worker
    ``DataLoader`` over an ``IterableDataset`` hands out their batches: one batch from each worker in
    turn, skipping workers that are exhausted. Source: torch/utils/data/dataloader.py
    ``_MultiProcessingDataLoaderIter._try_put_index`` (cycles ``_worker_queue_idx_cycle`` over active workers)."""
    out, position = [], [0] * len(streams)
    while any(p < len(s) for p, s in zip(position, streams)):
        for w, stream in enumerate(streams):
            if position[w] < len(stream):
                out.append(stream[position[w]])
                position[w] += 1
    return out


def rank_and_worker_shard(n: int, world_size: int, rank: int, num_workers: int, worker: int) -> list:
    """Sample ids ``DataLoader`` worker ``worker`` of rank ``rank`` yields when an ``IterableDataset``
    shards by rank *and* worker: ``i`` with ``i % (W * K) == rank * K + worker`` (``K = num_workers``)."""
    return list(range(rank * num_workers + worker, n, world_size * num_workers))


def paired_sync_dist_means(per_rank: list) -> tuple:
    """What each key logged with ``sync_dist=True`` (``reduce_fx="mean"``) holds on each rank when the
    ranks' keys differ, by the rule "the i-th all_reduce on each rank is reduced together".

    ``per_rank[r]`` lists rank ``r``'s keys in the order its epoch values are computed (the order the
    keys were first logged, ``validation_step`` keys before ``on_validation_epoch_end`` keys), each as
    ``(key, weighted_sum, count)``: ``sum(value * batch_size)`` and ``sum(batch_size)`` on that rank.
    Every such key costs two syncs, the weighted sum (float) and then the count (int64), and each sync
    is an all_reduce with SUM divided by the world size ``W``; the count is floored by that division.
    So the ``i``-th key on every rank gets ``(sum_r S_r,i / W) / floor(sum_r C_r,i / W)``, whatever
    each rank calls it.

    Returns ``(values, left_alone)``: ``values[r]`` is ``{key: value}`` for rank ``r``'s keys whose
    syncs paired (the first ``k`` keys of every rank, ``k`` the fewest any rank has); ``left_alone`` the
    ranks with more than ``k`` keys, whose next all_reduce no peer enters (they never finish).
    Source: result.py ``_ResultCollection.metrics``, ``_ResultMetric.compute``;
    lightning_fabric/utilities/distributed.py ``_sync_ddp``.
    """
    paired = min(len(keys) for keys in per_rank)
    world_size = len(per_rank)
    values = [{} for _ in per_rank]
    for i in range(paired):
        summed = sum(keys[i][1] for keys in per_rank) / world_size
        count = sum(keys[i][2] for keys in per_rank) // world_size
        for rank, keys in enumerate(per_rank):
            values[rank][keys[i][0]] = summed / count
    return values, [rank for rank, keys in enumerate(per_rank) if len(keys) > paired]


def pairing_means(per_rank_values: list) -> dict:
    """Every number a key could end up with when each rank contributes one of its logged values to an
    all-rank mean: ``{"r0=a r1=b": mean, ...}`` over every choice of one ``(name, value)`` from each
    rank's list ``per_rank_values[r]`` (equal batch counts on every rank).

    Pass the result to ``assert_distinct`` to prove that every pairing gives a different number, so a
    fact can tell which key's value ended up where.
    """
    import itertools

    out = {}
    for combo in itertools.product(*per_rank_values):
        label = " ".join(f"r{rank}={name}" for rank, (name, _) in enumerate(combo))
        out[label] = sum(value for _, value in combo) / len(combo)
    return out
