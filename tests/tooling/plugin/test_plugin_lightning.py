"""``--lightning`` / ``DDPPROBE_LIGHTNING`` choose the Lightning package a whole run uses
(ddpprobe/plugin/pytest_plugin.py ``_choose_lightning`` -> ``ddpprobe._lightning.use``), in the controller and in
every xdist worker, before any test module imports a probe; version ranges (``run_if(lightning=...)``) are
judged against that package's version and their reasons name it."""

import importlib.util

import pytest

pytest_plugins = ["pytester"]

CHECK = """
import os

from ddpprobe import _lightning
from ddpprobe.plugin.runif import run_if


def test_the_chosen_package_is_the_one_imported():
    from ddpprobe._lightning import pl

    assert os.environ["DDPPROBE_LIGHTNING"] == "{choice}"
    assert pl.__name__ == "{module}", pl.__name__


@run_if(lightning="<1.0")
def test_for_an_old_release():
    assert False
"""

MODULES = {"pytorch_lightning": "pytorch_lightning", "lightning": "lightning.pytorch"}
DISTRIBUTIONS = {"pytorch_lightning": "pytorch-lightning", "lightning": "lightning"}


def _installed(choice: str) -> bool:
    return importlib.util.find_spec(choice) is not None


@pytest.mark.parametrize("choice, how", [("lightning", "option"), ("pytorch_lightning", "environment")])
@pytest.mark.integration
def test_the_lightning_option_or_variable_chooses_the_package_in_every_xdist_worker(pytester, monkeypatch, choice, how):
    """With the package installed, both xdist workers import the chosen package as ``pl`` and a fact for
    ``<1.0`` skips naming that package; without it, the run is refused at once (exit code 4) with the
    install command."""
    pytester.makepyfile(test_choice=CHECK.format(choice=choice, module=MODULES[choice]))
    args = ["-p", "ddpprobe.plugin.pytest_plugin", "-p", "no:cacheprovider", "-rs", "-n", "1"]
    monkeypatch.delenv("DDPPROBE_LIGHTNING", raising=False)
    if how == "option":
        args += ["--lightning", choice]
    else:
        monkeypatch.setenv("DDPPROBE_LIGHTNING", choice)

    result = pytester.runpytest_subprocess(*args)

    if _installed(choice):
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines([f"*applies to {DISTRIBUTIONS[choice]} <1.0; installed *"])
    else:
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
        result.stderr.fnmatch_lines([f"*is not installed; pip install {DISTRIBUTIONS[choice]}*"])
