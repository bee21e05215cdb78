"""The several-dataloaders probe: ``trainer.validate`` over two validation dataloaders at once.

Dataloader ``k`` reads a ``ShiftedIdDataset(sizes[k], first=firsts[k])``: samples ``first ..
first + size - 1`` of the ``IdDataset`` family (value ``id ** 2``), so the loaders' values never
overlap and a mean over the wrong loader shows. ``MultiLoaderProbe.validation_step(batch, batch_idx,
dataloader_idx)`` logs the batch mean of ``value`` per its log plan (``log_spec`` entries; a name
containing ``{dataloader_idx}`` is formatted with the loader's index) and records, per loader:

- ``seen_ids``: ``{dataloader_idx: [ids of each batch]}``;
- ``epoch_end_ids``: what ``on_validation_epoch_end`` holds in a dict of lists filled in
  ``validation_step``, per loader;
- ``epoch_end_callback_metrics``: ``self.trainer.callback_metrics`` read inside
  ``on_validation_epoch_end``, and ``epoch_end_calls``: how often that hook ran.

Source: pytorch_lightning/loops/evaluation_loop.py ``_EvaluationLoop.run`` (``_store_dataloader_outputs``
when the dataloader changes) and pytorch_lightning/trainer/connectors/logger_connector/result.py
``_ResultCollection.log`` (``add_dataloader_idx``, ``DATALOADER_SUFFIX``).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, floats, recorded_warnings, trainer_metrics
from ddpprobe.probes.data import IdDataset
from ddpprobe.probes.log_plan import check_plan, log_entry, logs_here


class ShiftedIdDataset(IdDataset):
    """``n`` samples of the ``IdDataset`` family starting at id ``first``: item ``i`` is ``IdDataset``'s
    sample ``first + i`` (``id``, ``x``, ``value``, ``target``, ``pred``; same shapes).

    Raises:
        ValueError: ``n`` is not a positive int, or ``first`` is not a non-negative int.
    """

    def __init__(self, n: int, first: int = 0):
        super().__init__(n)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"ShiftedIdDataset(first={first!r}): first must be a non-negative int sample id")
        self.first = first

    def item(self, i: int) -> dict:
        return super().item(self.first + i)


class MultiLoaderProbe(pl.LightningModule):
    """Logs the batch mean of ``value`` per its log plan from every validation dataloader (see the module
    docstring) and records what each rank saw per ``dataloader_idx``."""

    def __init__(self, logs=()):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.logs = check_plan(logs, type(self).__name__, values=("batch_mean",), hooks=("step",), subgroup=False)
        self.seen_ids: dict = {}
        self.outputs: dict = {}
        self.epoch_end_ids: dict = {}
        self.epoch_end_callback_metrics: dict = {}
        self.epoch_end_calls = 0

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        ids = batch_ids(batch)
        self.seen_ids.setdefault(dataloader_idx, []).append(ids)
        self.outputs.setdefault(dataloader_idx, []).extend(ids)
        batch_mean = batch["value"].mean()
        for entry in self.logs:
            if logs_here(entry, "step", self.global_rank):
                named = dict(entry, name=entry["name"].format(dataloader_idx=dataloader_idx))
                log_entry(self, named, batch_mean, batch_size=len(ids))

    def on_validation_epoch_end(self):
        self.epoch_end_calls += 1
        self.epoch_end_ids = {k: list(v) for k, v in self.outputs.items()}
        self.epoch_end_callback_metrics = floats(self.trainer.callback_metrics)
        self.outputs.clear()


def validate_loaders(
    info: RankInfo, sizes: list, firsts: list, batch_size: int = 2, logs: list = (), expect_error: bool = False
) -> dict:
    """Scenario: ``trainer.validate`` a ``MultiLoaderProbe`` over one ``DataLoader`` per entry of ``sizes``.

    Args:
        sizes: number of samples of each dataloader.
        firsts: first sample id of each dataloader (same length as ``sizes``).
        batch_size: every loader's batch size.
        logs: log plan (``log_spec`` entries logging ``batch_mean``).
        expect_error: record an exception from ``trainer.validate`` as ``error = {"type", "message"}``
            instead of failing the rank.

    Record keys: ``seen_ids`` / ``epoch_end_ids`` (``{str(dataloader_idx): ...}``, JSON keys are strings),
    ``epoch_end_callback_metrics``, ``epoch_end_calls``, ``callback_metrics``, ``logged_metrics``,
    ``progress_bar_metrics``, ``returned`` (one dict per dataloader), ``warnings``, ``error``.

    Raises:
        ValueError: ``sizes`` and ``firsts`` differ in length.
    """
    if len(sizes) != len(firsts):
        raise ValueError(f"sizes={sizes!r} and firsts={firsts!r} must have the same length (one per dataloader)")
    loaders = [
        DataLoader(ShiftedIdDataset(n, first), batch_size=batch_size, num_workers=0) for n, first in zip(sizes, firsts)
    ]
    model = MultiLoaderProbe(logs=logs)
    error, returned = None, []
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        try:
            returned = trainer.validate(model, dataloaders=loaders, verbose=False)
        except Exception as exc:  # noqa: BLE001 - recorded for the fact to assert on
            if not expect_error:
                raise
            error = {"type": type(exc).__name__, "message": str(exc)}
    return {
        "seen_ids": {str(k): v for k, v in model.seen_ids.items()},
        "epoch_end_ids": {str(k): v for k, v in model.epoch_end_ids.items()},
        "epoch_end_callback_metrics": model.epoch_end_callback_metrics,
        "epoch_end_calls": model.epoch_end_calls,
        **trainer_metrics(trainer),
        "returned": [floats(d) for d in returned],
        "warnings": warnings,
        "error": error,
    }
