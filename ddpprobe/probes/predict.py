"""The predict probe: what ``trainer.predict`` deals to each rank, returns, and hands a prediction writer.

``PredictProbe`` is a ``Linear(2, 1)`` with fixed weights ``PREDICT_WEIGHT`` and no bias, so the
prediction for sample ``i`` (``x = [i, i*i]``) is ``predicted_value(i) = i - 0.3 * i*i``: distinct for
every id and not monotonic in it, so predictions put in the wrong order or paired with the wrong id
show. Its ``predict_step`` records the ids of every batch and returns the batch's predictions, shape
``(B,)`` float32.

``RecordingWriter`` is a ``BasePredictionWriter`` that records, as JSON-ready lists, what Lightning
passes to ``write_on_batch_end`` (``prediction``, ``batch_indices``, ``batch_idx``, ``dataloader_idx``)
and ``write_on_epoch_end`` (``predictions``, ``batch_indices``), nested exactly as received.

``FileWriter`` is the recipe for collecting every rank's predictions: in ``write_on_epoch_end`` each
rank writes one JSON file ``predictions_rank<r>.json`` with the dataset indices and the predictions it
computed, paired by position; ``merge_rank_predictions`` (run wherever the files are readable, e.g. in
the launching process or on rank 0 after a barrier) puts them back in dataset order and fails on a
missing or repeated index.

Source: pytorch_lightning/callbacks/prediction_writer.py ``BasePredictionWriter``;
pytorch_lightning/loops/prediction_loop.py ``_PredictionLoop`` (``epoch_batch_indices``,
``current_batch_indices``, ``predictions``).
"""

from __future__ import annotations

import json
import os

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader, recorded_warnings

#: ``PredictProbe``'s ``Linear(2, 1)`` weight (1, 2); the bias is off.
PREDICT_WEIGHT = [[1.0, -0.3]]
#: ``write_interval`` values of ``BasePredictionWriter`` the scenarios accept.
WRITE_INTERVALS = ("batch", "epoch", "batch_and_epoch")


def predicted_value(sample_id: int) -> float:
    """What ``PredictProbe`` predicts for sample ``sample_id``: ``id - 0.3 * id ** 2`` (in float64 here;
    the probe computes it in float32)."""
    return PREDICT_WEIGHT[0][0] * sample_id + PREDICT_WEIGHT[0][1] * sample_id * sample_id


def to_json(obj):
    """Tensors (to nested lists), lists, tuples and dicts of them, as JSON-ready values of the same nesting."""
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    return obj


class PredictProbe(pl.LightningModule):
    """Predicts ``predicted_value(id)`` for every sample and records the ids of each ``predict_step`` batch."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor(PREDICT_WEIGHT))
        self.seen_ids: list = []

    def predict_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        return self.layer(batch["x"]).squeeze(-1)


class RecordingWriter(pl.callbacks.BasePredictionWriter):
    """Records what Lightning passes to the writer hooks (see the module docstring)."""

    def __init__(self, write_interval: str):
        super().__init__(write_interval)
        self.on_batch: list = []
        self.on_epoch: list = []

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.on_batch.append(
            {
                "prediction": to_json(prediction),
                "batch_indices": to_json(batch_indices),
                "batch_idx": batch_idx,
                "dataloader_idx": dataloader_idx,
            }
        )

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.on_epoch.append({"predictions": to_json(predictions), "batch_indices": to_json(batch_indices)})


class FileWriter(pl.callbacks.BasePredictionWriter):
    """The recipe: each rank writes ``predictions_rank<r>.json`` into ``output_dir`` at the end of predict.

    The file is ``{"indices": [...], "predictions": [...]}``: the dataset indices this rank's sampler
    dealt out and the predictions for them, flattened over batches in the same order. On
    pytorch-lightning 2.x ``batch_indices`` in ``write_on_epoch_end`` holds one list per dataloader
    (``[dataloader][batch][sample]``) while ``predictions`` for a single dataloader is ``[batch]``;
    the writer takes dataloader 0's indices so the two line up.
    """

    def __init__(self, output_dir: str = "."):
        super().__init__("epoch")
        self.output_dir = output_dir

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        (indices,) = batch_indices  # one dataloader: [[batch 0 indices], [batch 1 indices], ...]
        flat_indices = [int(i) for batch in indices for i in batch]
        flat_predictions = [float(p) for batch in predictions for p in batch.reshape(-1)]
        path = os.path.join(self.output_dir, f"predictions_rank{trainer.global_rank}.json")
        with open(path, "w") as f:
            json.dump({"indices": flat_indices, "predictions": flat_predictions}, f)


def merge_rank_predictions(rank_files: list, n: int) -> list:
    """The predictions of all ``n`` samples in dataset order, from what ``FileWriter`` wrote on every rank.

    Args:
        rank_files: the parsed ``predictions_rank<r>.json`` contents, one dict per rank (any order).
        n: the dataset size.

    Returns:
        A list of ``n`` predictions, entry ``i`` for dataset index ``i``.

    Raises:
        ValueError: an index written twice, a missing index, an index outside ``0 .. n-1``, or a file
            whose ``indices`` and ``predictions`` differ in length; the message names them.
    """
    merged: dict = {}
    for r, data in enumerate(rank_files):
        if len(data["indices"]) != len(data["predictions"]):
            raise ValueError(f"file {r}: {len(data['indices'])} indices but {len(data['predictions'])} predictions")
        for index, prediction in zip(data["indices"], data["predictions"]):
            if not 0 <= index < n:
                raise ValueError(f"file {r}: index {index} outside the dataset of {n} samples")
            if index in merged:
                raise ValueError(f"file {r}: index {index} was already written by another file")
            merged[index] = prediction
    missing = sorted(set(range(n)) - set(merged))
    if missing:
        raise ValueError(f"no file holds a prediction for indices {missing}")
    return [merged[i] for i in range(n)]


def predict(
    info: RankInfo, n: int, batch_size: int = 2, return_predictions=None, write_interval=None, write_files: bool = False
) -> dict:
    """Scenario: ``trainer.predict`` a ``PredictProbe`` over ``IdDataset(n)`` (``shuffle=False``).

    Args:
        n, batch_size: dataset size and the user's ``DataLoader`` batch size.
        return_predictions: passed to ``trainer.predict`` (``None`` is Lightning's default).
        write_interval: add a ``RecordingWriter(write_interval)`` (one of ``WRITE_INTERVALS``), or ``None``.
        write_files: add a ``FileWriter`` writing into the rank's working directory.

    Record keys: ``global_rank``, ``world_size``, ``sampler`` (class name of the sampler that deals out
    indices: for predict Lightning wraps it in a batch sampler, so it is read from there),
    ``batch_sampler`` (class name), ``seen_ids`` (per-batch id lists), ``returned`` (what ``trainer.predict``
    returned, as nested lists, or ``None``), ``writer_batch`` / ``writer_epoch`` (lists of what the
    writer hooks received), ``warnings``.

    Raises:
        ValueError: ``write_interval`` not in ``WRITE_INTERVALS``.
    """
    if write_interval is not None and write_interval not in WRITE_INTERVALS:
        raise ValueError(f"write_interval={write_interval!r}; use one of {WRITE_INTERVALS} or None")
    model = PredictProbe()
    writer = RecordingWriter(write_interval) if write_interval else None
    callbacks = [cb for cb in (writer, FileWriter(".") if write_files else None) if cb is not None]
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, callbacks=callbacks)
        returned = trainer.predict(model, dataloaders=id_loader(n, batch_size), return_predictions=return_predictions)
    loader = trainer.predict_dataloaders
    return {
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "sampler": type(getattr(loader.batch_sampler, "sampler", loader.sampler)).__name__,
        "batch_sampler": type(loader.batch_sampler).__name__,
        "seen_ids": model.seen_ids,
        "returned": to_json(returned),
        "writer_batch": writer.on_batch if writer else [],
        "writer_epoch": writer.on_epoch if writer else [],
        "warnings": warnings,
    }
