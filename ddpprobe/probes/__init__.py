"""Room 2 — probes: LightningModules and scenarios that record what each rank saw, logged and printed.

A scenario is a top-level function ``scenario(info: RankInfo, **params) -> dict`` that the launcher
runs in every rank; its dict is that rank's record. Importing this package imports every probe module
in it, so the launcher's forkserver loads them all once.
"""

import importlib
import pkgutil

from ddpprobe.probes.data import IdDataset, sample_pred, sample_target, sample_value
from ddpprobe.probes.validation import log_spec

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
del _module

__all__ = ["IdDataset", "log_spec", "sample_pred", "sample_target", "sample_value"]
