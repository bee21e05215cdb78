"""A module the audit refuses: its class derives from classes of both Lightning packages
(``pytorch_lightning`` and ``lightning.pytorch``), which keep separate state, so no one Trainer runs it
as written. ``python -m ddpprobe audit examples.mixed_packages_module:make_model --data
examples.mixed_packages_module:make_data`` exits with code 2 and says to import from one package."""

from __future__ import annotations

import lightning.pytorch
import pytorch_lightning
from torch.utils.data import DataLoader

from ddpprobe.probes.data import IdDataset


class MixedModule(pytorch_lightning.LightningModule, lightning.pytorch.Callback):
    """A ``pytorch_lightning`` LightningModule that is also a ``lightning.pytorch`` Callback."""


def make_model() -> MixedModule:
    return MixedModule()


def make_data() -> DataLoader:
    return DataLoader(IdDataset(4), batch_size=2)
