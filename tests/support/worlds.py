"""Skipping a tooling test whose world cannot run on this machine (nccl needs one CUDA device per rank)."""

import pytest

from ddpprobe.launch import cuda_device_count
from ddpprobe.plugin.runif import world_skip_reason


def skip_unless_runnable(backend: str, world_size: int) -> None:
    """``pytest.skip`` with ddpprobe's reason when a ``world_size``-rank world of ``backend`` cannot run here."""
    reason = world_skip_reason(backend, world_size, cuda_device_count() if backend == "nccl" else 0)
    if reason:
        pytest.skip(reason)
