"""Deterministic data whose every item carries its sample id, so a rank's record says what it saw.

Sample ``i`` of an ``IdDataset(n)`` is the dict::

    {"id": i, "x": [i, i*i], "value": float(i * i), "target": TARGETS[i % 64], "pred": PREDS[i % 64]}

``value`` is the number the probes log; it is non-linear in ``i`` so that a mean over the padded
set, over the unique set, over one rank's shard and over batch means all differ.
``target``/``pred`` are fixed binary labels and predictions for the F1 facts.
"""

from __future__ import annotations

import random

import torch

#: Fixed binary targets and predictions (a seeded draw, the same in every process and version).
#: About 60% of targets are 1; predictions agree with the target 70% of the time.
_rng = random.Random(20240601)
TARGETS = [1 if _rng.random() < 0.6 else 0 for _ in range(64)]
PREDS = [t if _rng.random() < 0.7 else 1 - t for t in TARGETS]
del _rng


def sample_value(sample_id: int) -> float:
    """The value a probe logs for sample ``sample_id``: ``id ** 2`` (a float)."""
    return float(sample_id * sample_id)


def sample_target(sample_id: int) -> int:
    """Binary target of sample ``sample_id``."""
    return TARGETS[sample_id % len(TARGETS)]


def sample_pred(sample_id: int) -> int:
    """Binary prediction the F1 probes make for sample ``sample_id``."""
    return PREDS[sample_id % len(PREDS)]


class IdDataset:
    """A map-style dataset of ``n`` samples; item ``i`` is a dict of tensors carrying ``id == i``.

    Args:
        n: number of samples (>= 1).

    Shapes per item: ``id`` () int64, ``x`` (2,) float32, ``value`` () float32, ``target`` and
    ``pred`` () int64. A ``DataLoader`` with ``batch_size=B`` stacks them to ``(B,)`` and ``(B, 2)``.

    A probe needing other fields subclasses it and overrides ``item(i)``; the size check, ``len`` and
    the index check stay here (errors name the subclass).

    Raises:
        ValueError: ``n`` is not a positive int.
        IndexError: an index outside ``0 .. n-1``.
    """

    def __init__(self, n: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{type(self).__name__}(n={n!r}): n must be a positive int number of samples")
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(f"sample id {i} out of range for {type(self).__name__}(n={self.n})")
        return self.item(i)

    def item(self, i: int) -> dict:
        """Sample ``i`` (already checked to be in range) as a dict of tensors."""
        return {
            "id": torch.tensor(i),
            "x": torch.tensor([float(i), float(i * i)]),
            "value": torch.tensor(sample_value(i)),
            "target": torch.tensor(sample_target(i)),
            "pred": torch.tensor(sample_pred(i)),
        }
