"""The one-process reference of a ``fit``'s first step (rank side): the distributed run saves the initial weights
(after DDP's broadcast) and each rank's first training batch; the reference world loads those weights and steps
once on the ranks' batches put together, so its gradient is one process's on the W*b samples the ranks ran
(ddpprobe/contract/_single.py compares the two)."""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl

#: Files in a world's trace folder: the weights every rank starts from, and rank r's first training batch.
INITIAL_WEIGHTS = "initial.pt"
FIRST_BATCH = "first_batch_rank{rank}.pt"


class FirstBatchSaver(pl.Callback):
    """Saves, into ``folder``, rank 0's weights at ``on_fit_start`` (DDP has broadcast them) and this rank's first
    training batch (``torch.save``; a batch that cannot be saved is left out, and no reference runs)."""

    def __init__(self, folder: str, rank: int):
        self.folder = folder
        self.rank = rank
        self.saved = False

    def on_fit_start(self, trainer, pl_module):
        if self.rank == 0:
            torch.save(pl_module.state_dict(), os.path.join(self.folder, INITIAL_WEIGHTS))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        if self.saved:
            return
        self.saved = True
        try:
            torch.save(batch, os.path.join(self.folder, FIRST_BATCH.format(rank=self.rank)))
        except Exception:  # noqa: BLE001 - a batch torch cannot pickle: no reference run
            pass


def joined(batches: list):
    """The ranks' batches as one batch: tensors concatenated along dimension 0, dicts key by key, lists and
    tuples of containers element by element, lists of plain values (strings, numbers) one after the other.

    Raises:
        TypeError: the batches do not have one structure (no one-process batch can be made).
    """
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches, dim=0) if first.dim() > 0 else first
    if isinstance(first, dict):
        return {k: joined([b[k] for b in batches]) for k in first}
    if isinstance(first, (list, tuple)):
        if all(isinstance(x, (torch.Tensor, dict, list, tuple)) for x in first):
            parts = [joined([b[i] for b in batches]) for i in range(len(first))]
            return type(first)(parts) if isinstance(first, list) else tuple(parts)
        return type(first)(x for b in batches for x in b)
    if all(b == first for b in batches):
        return first
    raise TypeError(f"batches of type {type(first).__name__} cannot be joined")


def reference_loaders(folder: str, world_size: int):
    """``{"train_dataloaders": loader}`` whose one batch joins the ``world_size`` saved first batches, or None
    when a batch is missing or cannot be joined."""
    paths = [os.path.join(folder, FIRST_BATCH.format(rank=r)) for r in range(world_size)]
    if not all(os.path.exists(p) for p in paths):
        return None
    try:
        batch = joined([torch.load(p, weights_only=False) for p in paths])
    except Exception:  # noqa: BLE001 - no one-process batch: no reference
        return None
    return {"train_dataloaders": DataLoader([batch], batch_size=None)}


#: Trainer arguments of the reference run: one optimizer step, no validation.
REFERENCE_TRAINER = {"max_steps": 1, "limit_val_batches": 0, "num_sanity_val_steps": 0}
