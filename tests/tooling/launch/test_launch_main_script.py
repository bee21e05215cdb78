"""A script that calls ``run_world`` at top level, without ``if __name__ == "__main__":``, works: no rank
runs the script again (ddpprobe/launch/_world.py ``_main_not_rerun``)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.not_a_fact("tests the launcher, not a fact about DDP")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SCRIPT = """\
from ddpprobe import run_world
from tests.support import scenarios

print("records", [r["rank_sum"] for r in run_world(scenarios.identity, 2, timeout=60, start_method={method!r}).records])
"""


@pytest.mark.integration
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("as_module", [False, True], ids=["script", "module"])
def test_an_unguarded_script_calling_run_world_at_top_level_gets_its_records(tmp_path, method, as_module):
    """``python script.py`` and ``python -m script`` whose top level calls ``run_world`` print the
    world's records and exit 0, with either start method, instead of every rank dying with
    multiprocessing's "bootstrapping phase" error (the rank re-imported the script as ``__mp_main__`` and
    called ``run_world`` again)."""
    (tmp_path / "unguarded.py").write_text(SCRIPT.format(method=method))
    command = [sys.executable, "-m", "unguarded"] if as_module else [sys.executable, "unguarded.py"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count("records [1.0, 1.0]") == 1, proc.stdout
    assert "bootstrapping phase" not in proc.stderr, proc.stderr[-3000:]
