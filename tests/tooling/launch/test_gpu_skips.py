"""The launcher's NCCL checks, proven on a machine without a GPU: CUDA device counts are faked, so the
refusal is tested everywhere, not only where it would fire for real (ddpprobe/launch ``_check_backend``
and ``cuda_device_count``). The skip reasons and the pytest plugin's refusals are in test_runif.py."""

import pytest
import torch

from ddpprobe import run_world
from ddpprobe.plugin.runif import RunEnvironment
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests the launcher's GPU checks and skip reasons, not a fact about DDP")


def _fake_cuda(monkeypatch, count: int) -> None:
    """Make torch report ``count`` CUDA devices (``is_available`` is true when ``count > 0``)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("devices, world_size", [(0, 1), (0, 2), (1, 2), (3, 4)])
def test_nccl_with_fewer_cuda_devices_than_ranks_raises_naming_both_counts(monkeypatch, devices, world_size):
    """``backend="nccl"`` needs one CUDA device per rank; with fewer, ``run_world`` raises a
    RuntimeError that names the world size and the number of devices, before any process starts."""
    _fake_cuda(monkeypatch, devices)

    with pytest.raises(RuntimeError) as error:
        run_world(scenarios.identity, world_size, backend="nccl")

    message = str(error.value)
    assert f"world_size={world_size}" in message and f"has {devices} CUDA device(s)" in message, message


def test_cuda_device_count_is_zero_when_cuda_is_unavailable_whatever_device_count_says(monkeypatch):
    """Devices count only when ``torch.cuda.is_available()``: a build that reports devices it cannot use
    counts as 0 (the count the launcher, the skip vocabulary and the card share)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert RunEnvironment.here().cuda_devices == 0

    _fake_cuda(monkeypatch, 3)
    assert RunEnvironment.here().cuda_devices == 3
