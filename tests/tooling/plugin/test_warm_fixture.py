"""The ``run_world`` fixture with ``--warm-worlds`` (ddpprobe/plugin/pytest_plugin.py, ddpprobe/plugin/_warm.py):
a plain call runs on a warm world; a test that fails a world by design, or a call with its own timeout, runs fresh
at once; a call whose warm world fails runs again fresh and the test sees the fresh world's error;
``--fresh-worlds`` keeps every world fresh."""

import json
import os

import pytest

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.not_a_fact("tests the run_world fixture's warm worlds, not a fact about DDP")

FACTS = """
import pytest

from ddpprobe import RankFailed
from tests.support import scenarios


def _raises_rank_failed(run):
    with pytest.raises(RankFailed):
        run(scenarios.raise_on, 2, rank=0)


def test_plain(run_world):
    assert [rec["tag"] for rec in run_world(scenarios.identity, 2, tag="plain").records] == ["plain"] * 2


def test_plain_again(run_world):
    assert [rec["tag"] for rec in run_world(scenarios.identity, 2, tag="again").records] == ["again"] * 2


def test_expects_a_failure(run_world):
    with pytest.raises(RankFailed):
        run_world(scenarios.raise_on, 2, rank=1)


def test_own_timeout(run_world):
    run_world(scenarios.identity, 2, tag="own", timeout=60)


def test_a_failure_the_code_does_not_show(run_world):
    _raises_rank_failed(run_world)
"""


def _calls(folder) -> dict:
    calls = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                if "test" in entry:
                    calls.setdefault(entry["test"].rpartition("::")[2], []).append((entry["warm"], entry["fell_back"]))
    return calls


@pytest.mark.parametrize("option", ["--warm-worlds", "--fresh-worlds"])
def test_calls_run_warm_unless_they_fail_by_design_and_a_failed_warm_world_reruns_fresh(
    pytester, monkeypatch, tmp_path, option
):
    pytester.makepyfile(test_worlds=FACTS)
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("DDPPROBE_WORLD_LOG", str(log))
    monkeypatch.delenv("DDPPROBE_WARM_WORLDS", raising=False)

    result = pytester.runpytest_inprocess(
        "-p", "ddpprobe.plugin.pytest_plugin", "-p", "no:cacheprovider", option, "-n", "0"
    )

    result.assert_outcomes(passed=5)
    warm = option == "--warm-worlds"
    # (ran warm, a warm world failed it first and it ran fresh): the failure a test's code names, and a call
    # with its own timeout, go straight to fresh worlds; one the code does not show is tried warm first.
    assert _calls(log) == {
        "test_plain": [(warm, False)],
        "test_plain_again": [(warm, False)],
        "test_expects_a_failure": [(False, False)],
        "test_own_timeout": [(False, False)],
        "test_a_failure_the_code_does_not_show": [(False, warm)],
    }
