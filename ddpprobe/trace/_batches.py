"""The batches a rank's loops ran (the trace's ``batch`` events) and the samples they held."""

from __future__ import annotations

import hashlib
from typing import Optional

import torch

#: Batch fields taken as a sample's identity.
ID_FIELDS = ("id", "ids", "idx", "index", "indices", "sample_id")


def _leaves(batch) -> list:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _leaves(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _leaves(v)]
    return []


def describe_batch(batch) -> dict:
    """``{"size", "ids", "hashes"}`` of a batch: ``ids`` from an id field (``ID_FIELDS``) of a dict batch,
    else one SHA-1 (12 hex digits) per sample over its rows of every tensor whose first dimension is
    the batch size; ``size`` None when the batch holds no tensor."""
    leaves = [t for t in _leaves(batch) if t.dim() > 0]
    if not leaves:
        return {"size": None, "ids": None, "hashes": None}
    size = int(leaves[0].shape[0])
    if isinstance(batch, dict):
        for field in ID_FIELDS:
            ids = batch.get(field)
            if isinstance(ids, torch.Tensor) and ids.dim() == 1 and not ids.is_floating_point():
                return {"size": size, "ids": [int(i) for i in ids], "hashes": None}
    rows = [t.detach().cpu().contiguous() for t in leaves if t.shape[0] == size]
    hashes = []
    for j in range(size):
        digest = hashlib.sha1()
        for t in rows:
            digest.update(t[j].numpy().tobytes() if t.dtype != torch.bfloat16 else t[j].float().numpy().tobytes())
        hashes.append(digest.hexdigest()[:12])
    return {"size": size, "ids": None, "hashes": hashes}


def batch_recorder(trace):
    """A Lightning ``Callback`` that writes a ``batch`` event to ``trace`` (a ``CollectiveTrace``) at the start
    of every batch of every loop.

    The class derives from the chosen package's ``Callback`` (``ddpprobe._lightning.pl``), so it is built at
    the first call, not when this module loads: loading the trace imports no Lightning, and the audit can
    still choose ``lightning.pytorch`` from the user's module afterwards."""
    global _recorder_class
    if _recorder_class is None:
        from ddpprobe._lightning import pl

        class _BatchRecorder(pl.Callback):
            """Writes a ``batch`` event at the start of every batch of every loop."""

            def __init__(self, trace):
                self.trace = trace
                self.samplers: set = set()

            def _record(self, trainer, stage: str, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
                fields = {
                    "stage": stage,
                    "sanity": bool(getattr(trainer, "sanity_checking", False)),
                    "epoch": int(getattr(trainer, "current_epoch", 0)),
                    "batch_idx": batch_idx,
                    "dataloader_idx": dataloader_idx,
                    **describe_batch(batch),
                }
                if (stage, dataloader_idx) not in self.samplers:
                    self.samplers.add((stage, dataloader_idx))
                    fields["sampler"] = _sampler_name(trainer, stage, dataloader_idx)
                self.trace.write("batch", **fields)

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                from ddpprobe.trace import _gradients

                _gradients.install(trainer.strategy.model)  # before the batch's backward: its buckets are reported
                self._record(trainer, "train", batch, batch_idx)

            def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
                self._record(trainer, "val", batch, batch_idx, dataloader_idx)

            def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
                self._record(trainer, "test", batch, batch_idx, dataloader_idx)

            def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
                self._record(trainer, "predict", batch, batch_idx, dataloader_idx)

        _recorder_class = _BatchRecorder

    return _recorder_class(trace)


_recorder_class = None


def _sampler_name(trainer, stage: str, dataloader_idx: int) -> Optional[str]:
    attr = {
        "train": "train_dataloader",
        "val": "val_dataloaders",
        "test": "test_dataloaders",
        "predict": "predict_dataloaders",
    }[stage]
    try:
        loaders = getattr(trainer, attr)
        if isinstance(loaders, (list, tuple)):
            loaders = loaders[dataloader_idx]
        elif isinstance(loaders, dict):
            loaders = list(loaders.values())[dataloader_idx]
        if isinstance(getattr(loaders, "dataset", None), torch.utils.data.IterableDataset):
            return "IterableDataset (no sampler)"
        sampler = getattr(loaders, "sampler", None)
        batch_sampler = getattr(loaders, "batch_sampler", None)
        inner = getattr(batch_sampler, "sampler", None)
        if inner is not None and type(sampler).__name__ == "SequentialSampler" and inner is not sampler:
            sampler = inner
        return type(sampler).__name__ if sampler is not None else None
    except Exception:  # noqa: BLE001
        return None


def batch_samples(batches: list) -> list:
    """The samples of ``batch`` events, in order: ``("id", 3)`` from ``ids``, ``("hash", "ab12...")`` from
    ``hashes``."""
    out = []
    for batch in batches:
        if batch.get("ids") is not None:
            out += [("id", i) for i in batch["ids"]]
        elif batch.get("hashes") is not None:
            out += [("hash", h) for h in batch["hashes"]]
    return out


def sample_label(sample: tuple) -> str:
    """A sample of :func:`batch_samples` as the report writes it: ``"3"``, or ``"#ab12cd"`` for a hash."""
    return str(sample[1]) if sample[0] == "id" else f"#{sample[1][:6]}"
