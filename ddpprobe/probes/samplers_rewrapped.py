"""The training samplers Lightning replaces or re-wraps: a custom sampler that yields an order, a
``RandomSampler`` with replacement, and a random custom sampler with or without a seed.

``fit_with_sampler`` runs one epoch of ``SamplerProbe`` (it records the sample ids of every
``training_step`` batch) over ``IdDataset(n)`` through a ``DataLoader`` whose sampler the scenario picks:

==========================  =========================================================================
``sampler``                 the user's ``DataLoader(sampler=...)``
==========================  =========================================================================
``"ordered"``               ``OrderedSampler(n)``: the ids from the last to the first (a curriculum,
                            or the order of a length-grouped sampler)
``"ordered_shard"``         ``OrderedShardSampler(n, rank, W)``: this rank's share of that order,
                            ``order[rank::W]`` (the user's own distributed sampler; a ``Sampler``,
                            not a ``DistributedSampler``)
``"replacement"``           ``RandomSampler(dataset, replacement=True, num_samples=num_samples)``
``"replacement_shard"``     the same with ``num_samples // W`` draws and a generator seeded with the
                            rank (the user's own share of the draws)
``"python_random"``         ``PythonRandomSampler(n)``: a permutation drawn with Python's ``random``
                            module at every ``iter()``, without a seed of its own
``"shuffle"``               none; ``DataLoader(shuffle=True)`` (a ``RandomSampler``)
==========================  =========================================================================

For training Lightning always asks for a shuffling sampler (pytorch_lightning/trainer/connectors/
data_connector.py ``_process_dataloader``: ``is_shuffled = True`` for the training stage) and
``_get_distributed_sampler`` makes it: a ``RandomSampler`` or ``SequentialSampler`` becomes
``DistributedSampler(dataset, shuffle=True, seed=PL_GLOBAL_SEED or 0)`` (its own arguments, such as
``replacement`` and ``num_samples``, are dropped); any other sampler is wrapped in
lightning_fabric/utilities/distributed.py ``DistributedSamplerWrapper(sampler, shuffle=True, ...)``, which
lists the user's sampler once per epoch on each rank (``_DatasetSamplerWrapper.reset``) and deals out
*positions* of that list like a shuffling ``DistributedSampler``.
"""

from __future__ import annotations

import inspect
import os
import random
from typing import Optional

import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, recorded_warnings, seed_everything
from ddpprobe.probes.data import IdDataset

#: The samplers a scenario may give its training ``DataLoader`` (see the module docstring).
SAMPLERS = ("ordered", "ordered_shard", "replacement", "replacement_shard", "python_random", "shuffle")


def ordered_ids(n: int) -> list:
    """The order ``OrderedSampler(n)`` yields: ``[n-1, n-2, ..., 0]``."""
    return list(range(n - 1, -1, -1))


class OrderedSampler(Sampler):
    """Yields ``ordered_ids(n)``, the same order at every epoch; ``len`` is ``n``."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(ordered_ids(self.n))

    def __len__(self) -> int:
        return self.n


class OrderedShardSampler(Sampler):
    """This rank's share of ``ordered_ids(n)``: ``ordered_ids(n)[rank::world_size]``, in that order."""

    def __init__(self, n: int, rank: int, world_size: int):
        self.ids = ordered_ids(n)[rank::world_size]

    def __iter__(self):
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


class PythonRandomSampler(Sampler):
    """A permutation of ``range(n)`` drawn with ``random.shuffle`` (the process's global Python RNG) at
    every ``iter()``; each draw is kept in ``self.draws``. Python reseeds that RNG from the OS in every
    new or forked process, so without ``seed_everything`` each rank draws its own permutation."""

    def __init__(self, n: int):
        self.n = n
        self.draws: list = []

    def __iter__(self):
        ids = list(range(self.n))
        random.shuffle(ids)
        self.draws.append(ids)
        return iter(ids)

    def __len__(self) -> int:
        return self.n


def sampler_option(value: bool) -> dict:
    """``{"use_distributed_sampler": value}``, or ``{"replace_sampler_ddp": value}`` for a Lightning release
    before 2.0, where the ``Trainer`` argument had that name."""
    if "use_distributed_sampler" in inspect.signature(pl.Trainer.__init__).parameters:
        return {"use_distributed_sampler": value}
    return {"replace_sampler_ddp": value}


def training_loader(trainer):
    """The ``DataLoader`` a ``Trainer`` trained on (1.x holds it inside a ``CombinedLoader``'s ``loaders``)."""
    loader = trainer.train_dataloader
    return getattr(loader, "loaders", loader)


def user_sampler(kind: str, dataset, info: RankInfo, num_samples: Optional[int]):
    """The sampler ``kind`` (one of ``SAMPLERS``) over ``dataset`` for this rank; ``None`` for ``"shuffle"``.

    Raises:
        ValueError: an unknown ``kind``, or a replacement sampler without ``num_samples``.
    """
    n = len(dataset)
    if kind in ("replacement", "replacement_shard") and not num_samples:
        raise ValueError(f"sampler={kind!r} needs num_samples (the draws per epoch), got {num_samples!r}")
    if kind == "ordered":
        return OrderedSampler(n)
    if kind == "ordered_shard":
        return OrderedShardSampler(n, info.rank, info.world_size)
    if kind == "replacement":
        return RandomSampler(dataset, replacement=True, num_samples=num_samples)
    if kind == "replacement_shard":
        generator = torch.Generator().manual_seed(info.rank)
        return RandomSampler(dataset, replacement=True, num_samples=num_samples // info.world_size, generator=generator)
    if kind == "python_random":
        return PythonRandomSampler(n)
    if kind == "shuffle":
        return None
    raise ValueError(f"sampler={kind!r}; use one of {SAMPLERS}")


class SamplerProbe(pl.LightningModule):
    """A ``Linear(2, 1)`` trained with SGD on ``x / 100``; records ``seen_ids`` (the ids of every
    ``training_step`` batch, in order)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen_ids: list = []

    def training_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        return self.layer(batch["x"] / 100.0).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_with_sampler(
    info: RankInfo,
    n: int,
    sampler: str,
    batch_size: int = 2,
    num_samples: Optional[int] = None,
    seed: Optional[int] = None,
    use_distributed_sampler: bool = True,
) -> dict:
    """Scenario: one epoch of ``trainer.fit(SamplerProbe())`` over ``IdDataset(n)`` with the user's
    ``sampler`` (``SAMPLERS``) and ``Trainer(use_distributed_sampler=...)``.

    Args:
        seed: ``seed_everything(seed)`` before the loader is built, or ``None`` for no global seed
            (``PL_GLOBAL_SEED`` removed, so Lightning's ``DistributedSampler`` seed is 0).

    Record keys: ``seen_ids`` (per-batch id lists), ``sampler`` (class name of the sampler in the loader
    Lightning trained on), ``shuffle`` and ``seed`` (that sampler's, or ``None``), ``same_sampler``
    (whether it is the user's object), ``listed`` (for ``"python_random"``: the permutations the user's
    sampler drew on this rank, in order; else ``None``), ``warnings``.
    """
    if seed is None:
        os.environ.pop("PL_GLOBAL_SEED", None)
    else:
        seed_everything(seed)
    dataset = IdDataset(n)
    given = user_sampler(sampler, dataset, info, num_samples)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=given, shuffle=sampler == "shuffle", num_workers=0)
    model = SamplerProbe()
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, max_epochs=1, **sampler_option(use_distributed_sampler))
        trainer.fit(model, train_dataloaders=loader)
    used = training_loader(trainer).sampler
    return {
        "seen_ids": model.seen_ids,
        "sampler": type(used).__name__,
        "shuffle": getattr(used, "shuffle", None),
        "seed": getattr(used, "seed", None),
        "same_sampler": given is not None and used is given,
        "listed": given.draws if isinstance(given, PythonRandomSampler) else None,
        "warnings": warnings,
    }
