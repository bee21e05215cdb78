"""The iterable probe: ranks that read a ``torch.utils.data.IterableDataset``, and ranks doing uneven work.

Lightning puts a ``DistributedSampler`` only into a ``DataLoader`` over a *map-style* dataset: for an
``IterableDataset`` there is no index to sample, so ``DataConnector._requires_distributed_sampler``
returns False (``has_iterable_dataset``) and every rank iterates whatever the dataset yields.
``IdIterable`` yields ``IdDataset``'s items in order and shards them only as asked:

=====================  ==============================================================================
``shard``              which samples one copy of the iterator yields (``W`` ranks, ``K`` loader workers)
=====================  ==============================================================================
``"none"``             all ``n`` samples (no sharding: what a plain iterable dataset does)
``"rank"``             sample ``i`` where ``i % W == rank`` (the user shards by rank; with ``K``
                       workers every worker of a rank yields that rank's whole shard)
``"rank_and_worker"``  sample ``i`` where ``i % (W * K) == rank * K + worker``: every sample once
``"rank_equal"``       ``"rank"`` cut to ``n // W`` samples, so every rank has the same number of
                       samples (the last ``n % W`` samples are dropped, like ``drop_last``)
=====================  ==============================================================================

Rank and worker are read when iteration starts, in the process that iterates (the rank, or a
``DataLoader`` worker forked from it): ``torch.distributed.get_rank()`` / ``get_world_size()`` and
``torch.utils.data.get_worker_info()``. Every item also carries ``worker``, the ``DataLoader`` worker
id that produced it (``-1`` in the rank's own process). ``SizedIdIterable`` is the same with ``__len__``.

``IterableProbe`` logs per batch, from ``validation_step`` or ``training_step``, the entries of its log
plan (``log_spec(...)`` dicts of ``ddpprobe.probes.log_plan``; values ``batch_mean`` and
``mean_metric``) and, when asked, the batch's sample count, and records each batch's sample ids and
workers.
"""

from __future__ import annotations

import torch
import torch.distributed
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchmetrics import MeanMetric

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import (
    batch_ids,
    ddp_trainer,
    floats,
    only_loader,
    rank_and_world_size,
    recorded_warnings,
    trainer_metrics,
)
from ddpprobe.probes.data import IdDataset
from ddpprobe.probes.log_plan import check_plan, log_entry

#: How ``IdIterable`` may shard (see the module docstring).
SHARDS = ("none", "rank", "rank_and_worker", "rank_equal")
#: What a log plan entry (``log_spec``) may log here, per batch.
VALUES = ("batch_mean", "mean_metric")


class IdIterable(IterableDataset):
    """An ``IterableDataset`` over ``IdDataset(n)``'s items in id order, sharded as ``shard`` says.

    Args:
        n: number of samples (>= 1).
        shard: one of ``SHARDS`` (see the module docstring).

    Items are ``IdDataset``'s dicts plus ``worker`` (() int64). No ``__len__``: like most streaming
    datasets, its length is unknown to the ``DataLoader`` and to Lightning.

    Raises:
        ValueError: ``n`` not a positive int, or an unknown ``shard``.
    """

    def __init__(self, n: int, shard: str = "none"):
        if shard not in SHARDS:
            raise ValueError(f"IdIterable(shard={shard!r}): use one of {SHARDS}")
        self.data = IdDataset(n)
        self.shard = shard

    def ids(self, rank: int, world_size: int, worker: int, num_workers: int) -> list:
        """The sample ids one copy of the iterator yields in rank ``rank`` and ``DataLoader`` worker
        ``worker`` of ``num_workers`` (``worker=0, num_workers=1`` without workers)."""
        n = self.data.n
        if self.shard == "none":
            return list(range(n))
        if self.shard == "rank":
            return list(range(rank, n, world_size))
        if self.shard == "rank_equal":
            return list(range(rank, n, world_size))[: n // world_size]
        return list(range(rank * num_workers + worker, n, world_size * num_workers))

    def __iter__(self):
        rank, world_size = rank_and_world_size()
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in self.ids(rank, world_size, worker, num_workers):
            yield {**self.data[i], "worker": torch.tensor(info.id if info is not None else -1)}


class SizedIdIterable(IdIterable):
    """``IdIterable`` with ``__len__`` (the number of samples one copy of the iterator yields in this
    process without workers), as a streaming dataset that knows its size would define it."""

    def __len__(self) -> int:
        return len(self.ids(*rank_and_world_size(), 0, 1))


class IterableProbe(pl.LightningModule):
    """Logs its log plan per batch and records which samples (and workers) each batch held.

    Args:
        plan: list of ``log_spec(...)`` dicts (values ``VALUES``, hook ``"step"``), logged from
            ``validation_step`` and ``training_step`` with ``batch_size=`` the batch's length.
        count: ``self.log`` options (e.g. ``{"reduce_fx": "sum", "sync_dist": True}``) for logging, as
            ``count``, the number of samples in the batch (a float tensor); ``None`` logs no count.

    ``training_step`` returns a loss with a real gradient (the squared output of a ``Linear(2, 1)``), so
    ``DistributedDataParallel`` all-reduces gradients in every backward; the optimizer's learning
    rate is 0, so the weights never change.

    Raises:
        ValueError: a plan entry this probe cannot log (see ``log_plan.check_plan``).
    """

    def __init__(self, plan=(), count=None):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.plan = check_plan(plan, type(self).__name__, values=VALUES, hooks=("step",), subgroup=False)
        self.count = count
        self.mean_metric = MeanMetric()
        self.seen_ids: list = []
        self.seen_workers: list = []

    def _step(self, batch):
        ids = batch_ids(batch)
        self.seen_ids.append(ids)
        self.seen_workers.append([int(w) for w in batch["worker"]])
        for entry in self.plan:
            if entry["what"] == "batch_mean":
                value = batch["value"].mean()
            else:
                self.mean_metric.update(batch["value"])
                value = self.mean_metric
            log_entry(self, entry, value, batch_size=len(ids))
        if self.count is not None:
            self.log("count", torch.tensor(float(len(ids))), batch_size=len(ids), **self.count)

    def validation_step(self, batch, batch_idx):
        self._step(batch)

    def training_step(self, batch, batch_idx):
        self._step(batch)
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _loader(n: int, batch_size: int, shard: str, num_workers: int, sized: bool = False) -> DataLoader:
    """A ``DataLoader`` over ``IdIterable(n, shard)`` (``SizedIdIterable`` if ``sized``); workers are forked
    from the rank (Linux's default start method, whatever start method started the rank itself)."""
    context = "fork" if num_workers else None
    dataset = (SizedIdIterable if sized else IdIterable)(n, shard)
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, multiprocessing_context=context)


def _record(trainer, model, warnings) -> dict:
    return {
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "seen_ids": model.seen_ids,
        "seen_workers": model.seen_workers,
        **trainer_metrics(trainer),
        "warnings": warnings,
    }


def validate_iterable(
    info: RankInfo,
    n: int,
    batch_size: int = 1,
    shard: str = "none",
    num_workers: int = 0,
    plan: list = (),
    count=None,
    sized: bool = False,
) -> dict:
    """Scenario: ``trainer.validate`` an ``IterableProbe(plan, count)`` over
    ``DataLoader(IdIterable(n, shard), batch_size, num_workers)`` (``SizedIdIterable`` with ``sized``).

    Record keys: ``global_rank``, ``world_size``, ``seen_ids`` (per-batch id lists), ``seen_workers``
    (per-batch lists of the ``DataLoader`` worker each sample came from, ``-1`` for none),
    ``callback_metrics``, ``logged_metrics``, ``progress_bar_metrics`` (name -> float), ``returned``
    (what ``trainer.validate`` returned), ``warnings`` (``{"category", "message"}`` each), ``sampler``
    (class name of the sampler in the loader Lightning used).
    """
    model = IterableProbe(plan=plan, count=count)
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        returned = trainer.validate(model, dataloaders=_loader(n, batch_size, shard, num_workers, sized), verbose=False)
    return {
        **_record(trainer, model, warnings),
        "returned": [floats(d) for d in returned],
        "sampler": type(only_loader(trainer.val_dataloaders).sampler).__name__,
    }


def fit_iterable(info: RankInfo, n: int, batch_size: int = 1, shard: str = "none", plan: list = (), count=None) -> dict:
    """Scenario: ``trainer.fit`` an ``IterableProbe(plan, count)`` for one epoch over
    ``DataLoader(IdIterable(n, shard), batch_size)`` (no validation loop, no workers).

    Record keys as ``validate_iterable`` (without ``returned`` and ``sampler``), plus ``global_step``
    (optimizer steps this rank completed).
    """
    model = IterableProbe(plan=plan, count=count)
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
        trainer.fit(model, train_dataloaders=_loader(n, batch_size, shard, 0))
    return {**_record(trainer, model, warnings), "global_step": trainer.global_step}
