"""The other orders the audit runs the same samples in, to prove an equality instead of observing it (rank side).

Two orders, each a context manager that changes one sampler class for the length of one stage in one rank:

- ``"blocks"`` (a W=N world): ``DistributedSampler`` gives rank ``r`` the contiguous block
  ``indices[r * n:(r + 1) * n]`` of its padded index list instead of every W-th index ``indices[r::W]``
  (torch/utils/data/distributed.py ``DistributedSampler.__iter__``). The ranks run the same samples, the same
  repeats and the same number each, split another way: a whole-set value (a per-sample mean, a torchmetrics
  state synced at ``compute()``) is the same under both splits; a mean of per-rank F1 is not.
- ``"padded:<W>"`` (the single process): ``SequentialSampler`` yields ``DistributedSampler``'s padded list at W
  (``range(N)`` then its first ``ceil(N / W) * W - N`` indices again, ``drop_last=False``) in reverse order, so one
  process runs exactly the samples the W ranks ran, repeats included, in batches none of the ranks formed: a
  whole-set value (a per-sample mean, a torchmetrics state) equals the ranks' synced one, while an average of
  per-batch values that depend on which samples share a batch (per-batch F1) does not by construction.

Only the index order changes: no item is read, no random number drawn. A loader with another sampler (a
user's, a ``RandomSampler``) is left as it is, and the run records which samples ran as always.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

#: The orders :func:`sampler_order` knows.
ORDERS = ("", "blocks", "padded")


def padded_indices(length: int, world_size: int) -> list:
    """``DistributedSampler``'s index list for ``length`` samples at ``world_size`` ranks without shuffling:
    ``range(length)`` then repeats from its start up to a multiple of ``world_size``
    (torch/utils/data/distributed.py ``DistributedSampler.__iter__``, ``drop_last=False``)."""
    indices = list(range(length))
    total = math.ceil(length / world_size) * world_size if length else 0
    padding = total - length
    if padding and indices:
        indices += (indices * math.ceil(padding / len(indices)))[:padding]
    return indices


@contextlib.contextmanager
def sampler_order(order: str) -> Iterator[None]:
    """Run the block within ``order`` (module docstring): ``""`` (as Lightning samples), ``"blocks"`` or
    ``"padded:<W>"``.

    Raises:
        ValueError: an order not in :data:`ORDERS`.
    """
    if not order:
        yield
        return
    kind, _, size = order.partition(":")
    if kind not in ORDERS:
        raise ValueError(f"sampler order {order!r} is not one of {ORDERS}")
    from torch.utils.data import DistributedSampler, SequentialSampler

    if kind == "blocks":
        saved = {"__iter__": DistributedSampler.__iter__}
        DistributedSampler.__iter__ = _blocks_iter(DistributedSampler.__iter__)
        patched = [(DistributedSampler, saved)]
    else:
        world_size = int(size)
        patched = [
            (SequentialSampler, {"__iter__": SequentialSampler.__iter__, "__len__": SequentialSampler.__len__}),
            (DistributedSampler, {"__iter__": DistributedSampler.__iter__, "__len__": DistributedSampler.__len__}),
        ]
        SequentialSampler.__iter__ = lambda self: iter(padded_indices(len(self.data_source), world_size)[::-1])
        SequentialSampler.__len__ = lambda self: len(padded_indices(len(self.data_source), world_size))
        # The one-rank DDP world (the reference where the single process raised) samples through a one-rank
        # DistributedSampler: it runs the padded list too; any other split keeps its own order.
        DistributedSampler.__iter__ = _one_rank(DistributedSampler.__iter__, world_size, "iter")
        DistributedSampler.__len__ = _one_rank(DistributedSampler.__len__, world_size, "len")
    try:
        yield
    finally:
        for cls, methods in patched:
            for name, method in methods.items():
                setattr(cls, name, method)


def _one_rank(original, world_size: int, what: str):
    def method(self):
        if self.num_replicas != 1:
            return original(self)
        indices = padded_indices(len(self.dataset), world_size)
        return iter(indices[::-1]) if what == "iter" else len(indices)

    return method


def _blocks_iter(original):
    def __iter__(self):
        rank, replicas, samples = self.rank, self.num_replicas, self.num_samples
        try:
            # The sampler's own padded (or truncated) list, in its own order: a one-rank split of it.
            self.rank, self.num_replicas, self.num_samples = 0, 1, self.total_size
            indices = list(original(self))
        finally:
            self.rank, self.num_replicas, self.num_samples = rank, replicas, samples
        return iter(indices[rank * samples : (rank + 1) * samples])

    return __iter__
