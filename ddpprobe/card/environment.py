"""The machine and software a card was made on: the card's ``environment`` entry.

Versions are read from distribution metadata, so nothing here imports torch or Lightning; the Lightning
package is the one the facts ran (:func:`ddpprobe._lightning.chosen`: ``pytorch_lightning`` or the unified
``lightning``), named with its distribution and version.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Optional

from ddpprobe import _lightning


def distribution_version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution`` (``"2.13.0+cpu"``), None if it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def lightning_package() -> str:
    """The Lightning import package the facts run: ``"pytorch_lightning"`` or ``"lightning"``.

    Falls back to ``pytorch_lightning`` when the choice cannot be read (e.g. ``DDPPROBE_LIGHTNING``
    names a package that is not installed: the run has failed already and says why)."""
    try:
        return _lightning.chosen()
    except ValueError:
        return "pytorch_lightning"


def environment() -> dict:
    """Versions and hardware of this machine, as the card's ``environment`` entry (see ``schema.json``)."""
    from ddpprobe.launch import cuda_device_count

    package = lightning_package()
    return {
        "python": platform.python_version(),
        "torch": distribution_version("torch"),
        "lightning_package": package,
        "lightning_distribution": _lightning.PACKAGES[package][2],
        "lightning": _lightning.version(package),
        "torchmetrics": distribution_version("torchmetrics"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpu_count": int(cuda_device_count()),
    }
