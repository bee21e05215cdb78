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
