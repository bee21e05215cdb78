"""The sampler probes of facts in tests/facts/test_samplers_rewrapped.py, test_sharding.py,
test_several_dataloaders.py, test_user_samplers.py and test_rank_state_seeds.py: what Lightning does to a
sampler it does not know, to a custom batch sampler, to ``overfit_batches``' training sampler and to a
shuffling validation loader.

``SeenModule`` is a ``Linear(2, 1)`` trained with SGD on ``RegressionDataset`` (ddpprobe/probes/training.py)
that records the sample ids of every batch each loop gives it: ``train_ids[epoch]``,
``val_ids[key]`` (key ``"sanity"`` for the sanity check, else the epoch) and ``predict_ids``.

The user's samplers here:

- ``torch.utils.data.WeightedRandomSampler(weights, n, generator=torch.Generator().manual_seed(seed))``: the
  same draws on every rank, so what Lightning does with them can be computed from torch alone;
- ``EpochSeededWeightedSampler``: the same, with a ``set_epoch(e)`` that reseeds its generator with
  ``seed + 1 + e`` and records ``e`` in ``epochs_set`` (how a user makes a custom sampler re-draw per epoch);
- ``ReversedBatchSampler``: a ``BatchSampler`` subclass that yields each batch in reverse order.

Lightning wraps a sampler that is neither ``RandomSampler`` nor ``SequentialSampler`` in
``DistributedSamplerWrapper`` (``UnrepeatedDistributedSamplerWrapper`` for predict) and rebuilds a custom
batch sampler around a ``DistributedSampler`` (pytorch_lightning/trainer/connectors/data_connector.py
``_get_distributed_sampler``; pytorch_lightning/utilities/data.py ``_dataloader_init_kwargs_resolve_sampler``).
"""

from __future__ import annotations

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, WeightedRandomSampler

from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, only_loader, recorded_warnings
from ddpprobe.probes.training import RegressionDataset, RegressionProbe

#: The user samplers ``user_sampler`` builds.
SAMPLERS = ("weighted", "epoch_seeded", "random_subclass")


class EpochSeededWeightedSampler(WeightedRandomSampler):
    """``WeightedRandomSampler(weights, num_samples, replacement=True)`` with its own generator seeded
    ``seed``; ``set_epoch(e)`` reseeds it with ``seed + 1 + e`` (so even ``set_epoch(0)`` changes the draws)
    and appends ``e`` to ``epochs_set``."""

    def __init__(self, weights, num_samples: int, seed: int):
        super().__init__(weights, num_samples, replacement=True, generator=torch.Generator().manual_seed(seed))
        self.seed = seed
        self.epochs_set: list = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs_set.append(int(epoch))
        self.generator.manual_seed(self.seed + 1 + int(epoch))


class RandomSubclassSampler(RandomSampler):
    """A ``RandomSampler`` subclass (what Lightning replaces by a plain ``DistributedSampler``)."""


class ReversedBatchSampler(BatchSampler):
    """A ``BatchSampler`` whose batches come out in reverse order (``[2, 0]`` for ``[0, 2]``)."""

    def __iter__(self):
        for batch in super().__iter__():
            yield list(reversed(batch))


def user_sampler(kind: str, dataset, weights=None, seed: int = 0):
    """The sampler ``kind`` (one of ``SAMPLERS``) over ``dataset``: ``"weighted"`` (a seeded
    ``WeightedRandomSampler`` drawing ``len(dataset)`` ids with replacement), ``"epoch_seeded"``
    (``EpochSeededWeightedSampler``), ``"random_subclass"`` (``RandomSubclassSampler``).

    Raises:
        ValueError: an unknown ``kind``; the message lists the choices.
    """
    if kind == "weighted":
        return WeightedRandomSampler(weights, len(dataset), generator=torch.Generator().manual_seed(seed))
    if kind == "epoch_seeded":
        return EpochSeededWeightedSampler(weights, len(dataset), seed)
    if kind == "random_subclass":
        return RandomSubclassSampler(dataset)
    raise ValueError(f"sampler={kind!r}; use one of {SAMPLERS}")


class SeenModule(RegressionProbe):
    """``RegressionProbe`` that also records validation batches by key (``"sanity"`` or the epoch) and
    predicts its batches' ids."""

    def __init__(self, lr: float = 0.05):
        super().__init__(lr)
        self.val_seen: dict = {}
        self.predict_ids: list = []

    def validation_step(self, batch, batch_idx):
        key = "sanity" if self.trainer.sanity_checking else str(self.current_epoch)
        self.val_seen.setdefault(key, []).append(batch_ids(batch))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self.predict_ids.append(batch_ids(batch))
        return batch["id"]


def _sampler_fields(loader) -> dict:
    """Class names of a loader's sampler, its batch sampler and the batch sampler's sampler, and the
    ``DistributedSampler``'s ``shuffle`` flag (None where there is none)."""
    batch_sampler = loader.batch_sampler
    inner = getattr(batch_sampler, "sampler", None)
    distributed = next((s for s in (loader.sampler, inner) if hasattr(s, "num_replicas")), None)
    return {
        "sampler": type(loader.sampler).__name__,
        "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
        "batch_sampler_sampler": type(inner).__name__ if inner is not None else None,
        "batch_size": getattr(batch_sampler, "batch_size", None),
        "drop_last": getattr(batch_sampler, "drop_last", None),
        "shuffle": getattr(distributed, "shuffle", None),
    }


def _string_keys(d: dict) -> dict:
    return {str(k): v for k, v in d.items()}


def fit_sampled(
    info: RankInfo,
    n: int,
    batch_size: int,
    max_epochs: int = 2,
    sampler: str = None,
    weights=None,
    seed: int = 0,
    overfit_batches: float = 0.0,
    val_n: int = 0,
    val_shuffle: bool = False,
    val_sampler: str = None,
    num_sanity_val_steps: int = 0,
) -> dict:
    """Scenario: ``trainer.fit`` a ``SeenModule`` over ``RegressionDataset(n)`` whose training loader has
    the user's ``sampler`` (``user_sampler``; None: the loader's default), and, when ``val_n`` > 0, a
    validation loader over ``RegressionDataset(val_n)`` with ``shuffle=val_shuffle`` or the user's
    ``val_sampler``.

    Record keys: ``train_ids`` (``{epoch: [ids per batch]}``), ``val_ids`` (``{"sanity" or epoch: [ids per
    batch]}``), ``train`` and ``val`` (``_sampler_fields`` of the loaders Lightning used), ``epochs_set``
    and ``val_epochs_set`` (the epochs the user's sampler got through ``set_epoch``, or None),
    ``warnings``.
    """
    train_set = RegressionDataset(n)
    given = user_sampler(sampler, train_set, weights, seed) if sampler else None
    train = DataLoader(train_set, batch_size=batch_size, sampler=given)
    val = None
    given_val = None
    if val_n:
        val_set = RegressionDataset(val_n)
        given_val = user_sampler(val_sampler, val_set, weights, seed) if val_sampler else None
        val = DataLoader(
            val_set, batch_size=batch_size, sampler=given_val, shuffle=val_shuffle if not given_val else None
        )
    model = SeenModule()
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(
            info,
            max_epochs=max_epochs,
            overfit_batches=overfit_batches,
            num_sanity_val_steps=num_sanity_val_steps,
            limit_val_batches=1.0 if val_n else 0,
        )
        trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    return {
        "train_ids": _string_keys(model.train_ids),
        "val_ids": model.val_seen,
        "train": _sampler_fields(trainer.train_dataloader),
        "val": _sampler_fields(only_loader(trainer.val_dataloaders)) if val_n else None,
        "epochs_set": getattr(given, "epochs_set", None),
        "val_epochs_set": getattr(given_val, "epochs_set", None),
        "warnings": warnings,
    }


def evaluate_sampled(
    info: RankInfo, n: int, batch_size: int, sampler: str, weights=None, seed: int = 0, stage: str = "validate"
) -> dict:
    """Scenario: ``trainer.validate`` or ``trainer.predict`` a ``SeenModule`` over ``RegressionDataset(n)``
    through a loader with the user's ``sampler``.

    Record keys: ``seen`` (ids per batch), ``loader`` (``_sampler_fields``), ``epochs_set``.

    Raises:
        ValueError: ``stage`` not ``"validate"`` or ``"predict"``.
    """
    dataset = RegressionDataset(n)
    given = user_sampler(sampler, dataset, weights, seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=given)
    model = SeenModule()
    trainer = ddp_trainer(info)
    if stage == "validate":
        trainer.validate(model, dataloaders=loader, verbose=False)
        seen, used = model.val_seen.get("0", []), only_loader(trainer.val_dataloaders)
    elif stage == "predict":
        trainer.predict(model, dataloaders=loader, return_predictions=False)
        seen, used = model.predict_ids, only_loader(trainer.predict_dataloaders)
    else:
        raise ValueError(f"stage={stage!r}; use 'validate' or 'predict'")
    return {"seen": seen, "loader": _sampler_fields(used), "epochs_set": getattr(given, "epochs_set", None)}


def validate_with_batch_sampler(info: RankInfo, n: int, batch_size: int, drop_last: bool) -> dict:
    """Scenario: ``trainer.validate`` a ``SeenModule`` over ``RegressionDataset(n)`` through
    ``DataLoader(batch_sampler=ReversedBatchSampler(SequentialSampler, batch_size, drop_last))``.

    Record keys: ``seen`` (ids per batch), ``loader`` (``_sampler_fields``), ``same_batch_sampler``
    (whether Lightning kept the user's object).
    """
    dataset = RegressionDataset(n)
    given = ReversedBatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=drop_last)
    model = SeenModule()
    trainer = ddp_trainer(info)
    trainer.validate(model, dataloaders=DataLoader(dataset, batch_sampler=given), verbose=False)
    used = only_loader(trainer.val_dataloaders)
    return {
        "seen": model.val_seen.get("0", []),
        "loader": _sampler_fields(used),
        "same_batch_sampler": used.batch_sampler is given,
    }


class _CombinedSeenModule(RegressionProbe):
    """Training batches are ``{"a": batch, "b": batch}``; records ``{"a": ids, "b": ids}`` per step."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.combined: list = []

    def training_step(self, batch, batch_idx):
        self.combined.append({key: batch_ids(part) for key, part in sorted(batch.items())})
        return super().training_step(batch["a"], batch_idx)


def fit_combined(info: RankInfo, n_a: int, n_b: int, batch_size: int, mode: str = "max_size_cycle") -> dict:
    """Scenario: one epoch of ``trainer.fit`` over ``CombinedLoader({"a": ..., "b": ...}, mode)``: ``a`` a
    plain loader over ``RegressionDataset(n_a)``, ``b`` a loader over ``RegressionDataset(n_b)`` with a
    ``RandomSampler`` subclass.

    Record keys: ``steps`` (``[{"a": ids, "b": ids}]`` per training step), ``samplers``
    (``{"a": class name, "b": class name}`` of the samplers Lightning put in), ``shuffle`` (theirs).
    """
    from ddpprobe._lightning import pl

    b_set = RegressionDataset(n_b)
    loaders = {
        "a": DataLoader(RegressionDataset(n_a), batch_size=batch_size),
        "b": DataLoader(b_set, batch_size=batch_size, sampler=RandomSubclassSampler(b_set)),
    }
    combined = pl.utilities.CombinedLoader(loaders, mode=mode)
    model = _CombinedSeenModule()
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=combined)
    used = trainer.train_dataloader
    inner = used.iterables if hasattr(used, "iterables") else used
    return {
        "steps": model.combined,
        "samplers": {k: type(dl.sampler).__name__ for k, dl in sorted(inner.items())},
        "shuffle": {k: getattr(dl.sampler, "shuffle", None) for k, dl in sorted(inner.items())},
    }


def validate_lengths(info: RankInfo, lengths: list, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.validate`` a ``SeenModule`` with ``use_distributed_sampler=False`` over the first
    ``lengths[rank]`` samples of ``RegressionDataset(max(lengths) or 1)`` (an empty loader where it is 0).

    Record keys: ``seen`` (ids per batch), ``warnings``, ``raised`` (class name or None), ``message``.
    """
    from torch.utils.data import Subset

    subset = Subset(RegressionDataset(max(max(lengths), 1)), range(lengths[info.rank]))
    model = SeenModule()
    raised = message = None
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, use_distributed_sampler=False)
        try:
            trainer.validate(model, dataloaders=DataLoader(subset, batch_size=batch_size), verbose=False)
        except RuntimeError as exc:
            raised, message = type(exc).__name__, str(exc)
    return {"seen": model.val_seen.get("0", []), "warnings": warnings, "raised": raised, "message": message}


class DrawingDataset(RegressionDataset):
    """``RegressionDataset`` whose item also draws one number from each generator a DataLoader worker
    holds: ``"numpy"`` (``numpy.random.rand()``), ``"stdlib"`` (``random.random()``), ``"torch"``
    (``torch.rand(())``), and carries the worker's id (``"worker"``, -1 in the main process)."""

    def item(self, i: int) -> dict:
        import random

        import numpy

        worker = torch.utils.data.get_worker_info()
        return {
            **super().item(i),
            "numpy": torch.tensor(float(numpy.random.rand()), dtype=torch.float64),
            "stdlib": torch.tensor(random.random(), dtype=torch.float64),
            "torch": torch.rand((), dtype=torch.float64),
            "worker": torch.tensor(worker.id if worker is not None else -1),
        }


class _DrawsModule(SeenModule):
    def __init__(self):
        super().__init__()
        self.draws: list = []

    def validation_step(self, batch, batch_idx):
        self.draws.append(
            {"worker": int(batch["worker"][0]), **{k: float(batch[k][0]) for k in ("numpy", "stdlib", "torch")}}
        )


def worker_draws(info: RankInfo, seed: int, workers: bool, n: int = 4, num_workers: int = 2) -> dict:
    """Scenario: ``seed_everything(seed, workers=workers)``, then ``trainer.validate`` over
    ``DrawingDataset(n * world_size)`` with ``batch_size=1`` and ``num_workers`` workers per rank.

    Record keys: ``draws`` (per batch: ``{"worker", "numpy", "stdlib", "torch"}``).
    """
    from ddpprobe.probes.common import seed_everything

    seed_everything(seed, workers=workers)
    model = _DrawsModule()
    loader = DataLoader(DrawingDataset(n * info.world_size), batch_size=1, num_workers=num_workers)
    ddp_trainer(info).validate(model, dataloaders=loader, verbose=False)
    return {"draws": model.draws}
