"""Run pytest under torchrun, as a user does on a multi-GPU node: ``torchrun --standalone --nproc-per-node=N
-m pytest ...`` from the repository root, one pytest process per rank, each rank's stdout captured by the
torchrun agent (``--log-dir``, ``--redirects=3``). Used by the integration tests of external worlds
(ddpprobe/launch/_external.py) and of the guard in such a world."""

from __future__ import annotations

import glob
import os
import pathlib
import subprocess
import sys

#: The repository root: torchrun starts pytest there, so ``tests/...`` paths and ``conftest.py`` resolve.
ROOT = pathlib.Path(__file__).resolve().parents[2]


def pytest_under_torchrun(log_dir, pytest_args: list, nproc: int = 2, timeout: float = 240) -> tuple:
    """``torchrun --standalone --nproc-per-node=nproc -m pytest -p no:xdist -p no:cacheprovider -q -rs
    *pytest_args``, on the loopback interface, without the caller's ``PYTEST_*``/``DDPPROBE_*`` variables.

    Args:
        log_dir: a fresh folder for the agent's per-rank logs.
        pytest_args: test ids, ``-k`` expressions and other pytest arguments.
        timeout: seconds the whole run may take (``subprocess.TimeoutExpired`` past it).

    Returns:
        ``(completed_process, outputs)``: the agent's ``CompletedProcess`` (text) and each rank's pytest stdout,
        ordered by rank.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DDPPROBE_"))}
    # The ranks' pytest sessions make their own basetemp (pytest-of-<user>/pytest-<n>) in the temporary folder:
    # one beside log_dir, so nothing of theirs is left in the caller's.
    tmp = pathlib.Path(log_dir).with_name(pathlib.Path(log_dir).name + "-tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", TMPDIR=str(tmp))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command += [f"--log-dir={log_dir}", "--redirects=3", "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider"]
    command += ["-q", "-rs", *pytest_args]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    paths = sorted(glob.glob(os.path.join(str(log_dir), "*", "attempt_0", "*", "stdout.log")))
    outputs = [open(path, encoding="utf-8").read() for path in paths]
    return proc, outputs
