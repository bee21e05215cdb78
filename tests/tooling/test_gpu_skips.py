"""The NCCL and GPU checks, proven on a machine without a GPU: CUDA device counts are faked, so the
launcher's refusal and the pytest plugin's skip reasons are tested everywhere, not only where they
would fire for real. (ddpprobe/launch/_world.py ``_check_backend``; ddpprobe/pytest_plugin.py
``backend_skip_reason``, ``gpu_skip_reason`` and the ``gpu`` marker.)"""

import pytest
import torch

from ddpprobe import run_world
from ddpprobe import pytest_plugin
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests the launcher's GPU checks and skip reasons, not a fact about DDP")

pytest_plugins = ["pytester"]


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
    """The plugin counts devices only when ``torch.cuda.is_available()``: a build that reports devices
    it cannot use counts as 0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert pytest_plugin.cuda_device_count() == 0

    _fake_cuda(monkeypatch, 3)
    assert pytest_plugin.cuda_device_count() == 3


@pytest.mark.parametrize(
    "backend, world_size, devices, expected",
    [
        ("gloo", 3, 0, None),
        ("nccl", 2, 2, None),
        ("nccl", 2, 4, None),
        ("nccl", 3, 2, "backend nccl with world size 3 needs 3 CUDA devices, found 2"),
        ("nccl", 1, 0, "backend nccl with world size 1 needs 1 CUDA devices, found 0"),
    ],
)
def test_backend_skip_reason_names_the_world_size_and_the_devices_found(backend, world_size, devices, expected):
    """A backend-agnostic fact skips under nccl only when the world needs more devices than exist."""
    assert pytest_plugin.backend_skip_reason(backend, world_size, devices) == expected


@pytest.mark.parametrize(
    "backend, min_gpus, devices, expected",
    [
        ("gloo", 1, 8, "GPU-only fact: run with --backend nccl on a machine with >= 1 CUDA device(s)"),
        ("nccl", 2, 1, "GPU-only fact needs >= 2 CUDA device(s), found 1"),
        ("nccl", 2, 2, None),
        ("nccl", 1, 4, None),
    ],
)
def test_gpu_skip_reason_asks_for_nccl_then_for_enough_devices(backend, min_gpus, devices, expected):
    """A ``@pytest.mark.gpu(min_gpus=N)`` fact needs ``--backend nccl`` first, then ``N`` devices."""
    assert pytest_plugin.gpu_skip_reason(backend, min_gpus, devices) == expected


GPU_FACT = """
import pytest

@pytest.mark.gpu(min_gpus={min_gpus})
def test_needs_gpus():
    assert False, "a GPU-only fact ran on a machine that cannot run it"
"""

FIXTURE_FACT = """
from tests.support import scenarios

def test_world_too_big(run_world):
    run_world(scenarios.identity, {world_size})
    assert False, "a world larger than the CUDA devices ran under nccl"
"""


def _here() -> int:
    return pytest_plugin.cuda_device_count()


def test_the_gpu_marker_skips_with_its_reason_under_gloo(pytester):
    """Under the default gloo backend a ``gpu`` fact is skipped (not failed), and the report says how
    to run it."""
    pytester.makepyfile(GPU_FACT.format(min_gpus=1))

    result = pytester.runpytest("-p", "ddpprobe.pytest_plugin", "-rs", "--backend", "gloo")

    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*GPU-only fact: run with --backend nccl on a machine with >= 1 CUDA device(s)*"])


def test_the_gpu_marker_skips_under_nccl_when_this_machine_has_too_few_devices(pytester):
    """Under ``--backend nccl`` a fact asking for one more GPU than this machine has is skipped with
    the count found here (0 on a CPU-only machine)."""
    found = _here()
    pytester.makepyfile(GPU_FACT.format(min_gpus=found + 1))

    result = pytester.runpytest("-p", "ddpprobe.pytest_plugin", "-rs", "--backend", "nccl")

    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*GPU-only fact needs >= {found + 1} CUDA device(s), found {found}*"])


def test_the_run_world_fixture_skips_a_world_larger_than_the_devices_under_nccl(pytester):
    """Under ``--backend nccl`` the ``run_world`` fixture skips a fact whose world needs more CUDA
    devices than this machine has, with the reason, instead of failing it."""
    found = _here()
    pytester.makepyfile(FIXTURE_FACT.format(world_size=found + 1))

    result = pytester.runpytest("-p", "ddpprobe.pytest_plugin", "-rs", "--backend", "nccl")

    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [f"*backend nccl with world size {found + 1} needs {found + 1} CUDA devices, found {found}*"]
    )
