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

#: Seconds the ranks may take to meet in ``init_process_group`` (the rendezvous and gloo's connections),
#: whatever the process-group timeout: ranks start and build their Trainer at their own pace (seconds apart
#: on a loaded machine), and a hang fact's timeout of a few seconds is about its collectives, not the start.
RENDEZVOUS_TIMEOUT_S = 60.0


def ddp_trainer(info: RankInfo, **overrides):
    """A ``pytorch_lightning.Trainer`` that joins the launcher's world with ``strategy="ddp"``.

    Equivalent to ``Trainer(strategy="ddp", accelerator=..., devices=..., num_nodes=...)`` except that the
    strategy object carries the world's backend and its process-group timeout
    (``DDPStrategy(process_group_backend=info.backend, timeout=info.pg_timeout)``), so a stuck
    collective raises inside the rank instead of after Lightning's default 30 minutes. The process
    group is created with ``RENDEZVOUS_TIMEOUT_S`` (at least) and given ``info.pg_timeout`` for its
    collectives right after (``torch.distributed.distributed_c10d._set_pg_timeout``, where torch has it):
    see ``_collective_timeout_after_init``.
    Progress bar, model summary, checkpointing and the logger are off unless ``overrides`` turn them on.

    Args:
        info: the rank's ``RankInfo``.
        **overrides: any ``Trainer`` argument, e.g. ``logger=CSVLogger(".")`` or ``max_epochs=2``.
    """
    kwargs = dict(
        strategy=_collective_timeout_after_init(info.backend, info.pg_timeout),
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


def _collective_timeout_after_init(backend: str, pg_timeout: float):
    """``DDPStrategy(process_group_backend=backend)`` whose process group waits up to ``RENDEZVOUS_TIMEOUT_S``
    for the ranks to meet and then ``pg_timeout`` seconds per collective.

    The strategy stays a ``DDPStrategy`` (the trace names its calls ``DDPStrategy.barrier`` ...): only this
    instance's ``setup_distributed`` (pytorch_lightning/strategies/ddp.py, where ``init_process_group`` runs)
    is wrapped. With a torch without ``_set_pg_timeout`` the group keeps ``pg_timeout`` for both."""
    from torch.distributed import distributed_c10d

    set_timeout = getattr(distributed_c10d, "_set_pg_timeout", None)
    short = datetime.timedelta(seconds=pg_timeout)
    if set_timeout is None:
        return pl.strategies.DDPStrategy(process_group_backend=backend, timeout=short)
    strategy = pl.strategies.DDPStrategy(
        process_group_backend=backend, timeout=datetime.timedelta(seconds=max(pg_timeout, RENDEZVOUS_TIMEOUT_S))
    )
    setup_distributed = strategy.setup_distributed

    def setup_then_shorten():
        setup_distributed()
        set_timeout(short)
        strategy._timeout = short  # what the strategy reports, and passes to any group it makes later

    strategy.setup_distributed = setup_then_shorten
    return strategy


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
