"""What every probe shares: a DDP Trainer built from the rank's ``RankInfo``, and recorders that turn
what Lightning holds (metric dicts, warnings) into JSON-ready records."""

from __future__ import annotations

import contextlib
import datetime
import inspect
import warnings

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.data import IdDataset


def ddp_trainer(info: RankInfo, **overrides):
    """A ``pytorch_lightning.Trainer`` that joins the launcher's world with ``strategy="ddp"``.

    Equivalent to ``Trainer(strategy="ddp", accelerator=..., devices=..., num_nodes=...)`` except that the
    strategy object carries the world's backend and its process-group timeout
    (``DDPStrategy(process_group_backend=info.backend, timeout=info.pg_timeout)``), so a stuck
    collective raises inside the rank instead of after Lightning's default 30 minutes.
    Progress bar, model summary, checkpointing and the logger are off unless ``overrides`` turn them on.

    Args:
        info: the rank's ``RankInfo``.
        **overrides: any ``Trainer`` argument, e.g. ``logger=CSVLogger(".")`` or ``max_epochs=2``.
    """
    kwargs = dict(
        strategy=pl.strategies.DDPStrategy(
            process_group_backend=info.backend, timeout=datetime.timedelta(seconds=info.pg_timeout)
        ),
        accelerator=info.accelerator,
        devices=info.devices,
        num_nodes=info.num_nodes,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=info.rank_dir,
    )
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


def only_loader(loaders):
    """The one ``DataLoader`` in a Trainer's ``val_dataloaders`` / ``test_dataloaders`` after a run.

    pytorch-lightning 2.x holds the user's loader as given (one loader here); 1.x holds a list with one
    loader per dataloader (pytorch_lightning/trainer/trainer.py ``val_dataloaders``, 1.9.5).

    Raises:
        ValueError: a list holding other than exactly one loader.
    """
    if isinstance(loaders, (list, tuple)):
        (loader,) = loaders
        return loader
    return loaders


def seed_everything(seed: int, workers: bool = False) -> int:
    """``pytorch_lightning.seed_everything(seed, workers)`` without its "Seed set to" log line where the
    installed release can be asked (``verbose=False``, added in 2.4); earlier releases always log it
    (to stderr). Returns the seed."""
    if "verbose" in inspect.signature(pl.seed_everything).parameters:
        return pl.seed_everything(seed, workers=workers, verbose=False)
    return pl.seed_everything(seed, workers=workers)


def id_loader(n: int, batch_size: int, shuffle: bool = False, dataset=IdDataset):
    """A ``DataLoader`` over ``dataset(n)`` (an ``IdDataset`` or a subclass; no workers).

    Lightning swaps in a ``DistributedSampler`` (pytorch_lightning/trainer/connectors/data_connector.py
    ``_update_dataloader``)."""
    return DataLoader(dataset(n), batch_size=batch_size, shuffle=shuffle, num_workers=0)


def rank_and_world_size() -> tuple:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` where none is initialised (a
    DataLoader worker's or a single process's view)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def floats(metrics) -> dict:
    """``{name: tensor or number}`` -> ``{name: float}``, sorted by name."""
    return {k: float(v) for k, v in sorted(dict(metrics).items())}


def trainer_metrics(trainer) -> dict:
    """The three metric dicts a Trainer holds after a run, as floats."""
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "logged_metrics": floats(trainer.logged_metrics),
        "progress_bar_metrics": floats(trainer.progress_bar_metrics),
    }


@contextlib.contextmanager
def recorded_warnings():
    """Record every warning raised inside the block (duplicates included) as ``{"category", "message"}``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records: list = []
        try:
            yield records
        finally:
            records.extend({"category": w.category.__name__, "message": str(w.message)} for w in caught)


def batch_ids(batch) -> list:
    """The sample ids in a batch of ``IdDataset`` items, as a list of ints."""
    return [int(i) for i in batch["id"]]


def validate_catching(info: RankInfo, model, n: int, batch_size: int) -> dict:
    """``trainer.validate(model)`` over ``IdDataset(n)``, recording instead of raising what Lightning raises.

    Returns:
        ``{"raised": exception class name or None, "message": its text or None}``.
    """
    try:
        ddp_trainer(info).validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    except Exception as exc:  # noqa: BLE001 - what Lightning raises is the record
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "message": None}
