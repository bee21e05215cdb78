"""Nothing left behind: after a pytest run, no process it started is alive and the temporary folder holds
nothing it wrote.

Each test runs pytest in a child process with ``TMPDIR`` set to a fresh, empty folder (Python's
``tempfile``, torch and torchrun all honour it) and a marker variable that every process of the run
inherits: pytest-xdist's workers, the shared forkserver, the ranks forked from it (their environment is
the launcher's, ddpprobe/launch/_rank.py ``_set_environment``), warm worlds' ranks and torchrun's agents.
When the run has exited, no process carrying the marker may be alive, and the folder must be as empty as it
started (pytest's own ``--basetemp`` is put elsewhere: pytest keeps it on purpose).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.not_a_fact("checks that a run leaves no process and no temporary file, not a fact about DDP"),
]

ROOT = Path(__file__).resolve().parents[3]

#: The variable every process of the child run inherits (not ``DDPPROBE_*`` nor ``PYTEST_*``: the torchrun
#: helpers drop those from their agents' environment).
MARKER = "LEFT_BEHIND_CHECK"

#: Seconds a process of the run may take to end after pytest exited (a forkserver notices its clients left).
EXIT_GRACE_S = 10.0

#: What importing pytorch-lightning makes in the temporary folder whatever runs: torch's per-user compile
#: cache, ``torchinductor_<user>`` (torch/_inductor/runtime/cache_dir_utils.py ``default_cache_dir``), kept
#: and shared by every torch process of the user on purpose. Not the run's to remove.
TORCH_CACHE_PREFIX = "torchinductor_"


def _carriers(token: str) -> list:
    """``(pid, command line)`` of every process whose environment holds ``MARKER=token``."""
    found = []
    needle = f"{MARKER}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found.append((int(entry), fh.read().replace(b"\0", b" ").decode(errors="replace")[:200]))
        except OSError:
            continue  # gone, or not ours to read
    return found


def _run_pytest(tmp_path, args: list, timeout: float = 600) -> tuple:
    """Run ``python -m pytest args`` from the repository root with a fresh ``TMPDIR``; return
    ``(completed process, TMPDIR's entries afterwards, processes of the run still alive)``.

    The ``TMPDIR`` is a new folder directly in the system's temporary folder, not under ``tmp_path``: the
    forkserver's socket lives in it, and a Unix socket's path may not exceed 107 bytes (``AF_UNIX path too
    long`` under pytest's deeper folders). It is removed afterwards."""
    tmpdir = Path(tempfile.mkdtemp(prefix="ddpprobe-left-"))
    try:
        return _run_pytest_in(tmp_path, tmpdir, args, timeout)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _run_pytest_in(tmp_path, tmpdir: Path, args: list, timeout: float) -> tuple:
    tmp_path.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DDPPROBE_"))}
    env.update(TMPDIR=str(tmpdir), **{MARKER: token})
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--basetemp={tmp_path / 'basetemp'}"]
    proc = subprocess.run(command + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    deadline = time.monotonic() + EXIT_GRACE_S
    alive = _carriers(token)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = _carriers(token)
    for pid, _ in alive:  # leave the machine clean for the next test, then report them
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    left = sorted(
        str(p.relative_to(tmpdir))
        for p in tmpdir.rglob("*")
        if not p.relative_to(tmpdir).parts[0].startswith(TORCH_CACHE_PREFIX)
    )
    return proc, left, alive


def _output(proc) -> str:
    """The run's summary lines (which tests failed), then the end of its output."""
    text = proc.stdout + proc.stderr
    summary = [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR", "INTERNALERROR> E"))]
    return "\n".join(summary) + "\n...\n" + text[-6000:]


def test_a_run_of_facts_leaves_no_rank_forkserver_or_warm_world_process_and_no_temporary_file(tmp_path):
    """Worlds that finish, raise, die and hang (the launcher's own failure tests and the list-state facts),
    under two xdist workers (one shared forkserver), with warm worlds on and then off. The launcher's failure tests
    that start worlds are integration tests: ``-m`` runs them with the rest."""
    args = [
        "-n",
        "2",
        "-m",
        "integration or not integration",
        "tests/tooling/launch/test_launch_errors.py",
        "tests/facts/test_hidden_collectives_torchmetrics_list_states.py",
    ]
    for worlds in ("--warm-worlds", "--fresh-worlds"):
        proc, left, alive = _run_pytest(tmp_path / worlds.strip("-"), [worlds, *args])

        assert proc.returncode == 0, _output(proc)
        assert alive == [], f"processes of the run still alive after it exited ({worlds}): {alive}"
        assert left == [], f"files the run left in its temporary folder ({worlds}): {left[:20]}"


def test_the_torchrun_integration_tests_leave_no_torchelastic_folder_or_other_temporary_file(tmp_path):
    """The integration tests that start real torchrun agents (two agents as two nodes; pytest under torchrun):
    torchrun's agent makes a ``torchelastic_*`` log folder in the temporary folder unless given one."""
    args = [
        "-m",
        "integration",
        "-p",
        "no:xdist",
        "tests/facts/test_multinode.py",
        "tests/tooling/launch/test_external_world.py",
    ]
    proc, left, alive = _run_pytest(tmp_path, args)

    assert proc.returncode == 0, _output(proc)
    assert "passed" in proc.stdout and " skipped" not in proc.stdout.splitlines()[-1], _output(proc)
    assert alive == [], f"processes of the run still alive after it exited: {alive}"
    assert not [p for p in left if p.startswith("torchelastic_")], left
    assert left == [], f"files the run left in its temporary folder: {left[:20]}"
