"""The audit and the guard refuse, at start, a Lightning release below their support range (ddpprobe/_support.py).

The release a tool sees is faked, nothing is installed: in-process by replacing the metadata read
(``ddpprobe._lightning.version``), and in a fresh interpreter by a distribution's metadata folder first on
``PYTHONPATH`` (what ``importlib.metadata`` finds first is the release it reports). Each refusal must name
the release found, the range and what that release lacks, and come before anything else runs: no factory
called, no world started, in well under a second. The range itself is stated in the README and in
docs/versions.md; a test below keeps both in step with the code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from ddpprobe import _lightning, _support

pytestmark = pytest.mark.not_a_fact("tests ddpprobe's support range and its refusal, not a fact about DDP")

ROOT = Path(__file__).resolve().parents[3]

#: The support range as the README and docs/versions.md state it: 2.3 (the process group exists before
#: ``prepare_data``, from 2.2, and every rank waits in a barrier around it, from 2.3) up to 2.6 (the newest release
#: the matrix ran). Written out here, not read from the code.
STATED = "2.3 to 2.6"

#: A refusal must come well within this many seconds (it reads metadata; importing Lightning takes several).
REFUSAL_S = 1.0


def _fake_release(monkeypatch, release: str) -> None:
    """Every Lightning distribution reads as ``release``."""
    monkeypatch.setattr(_lightning, "version", lambda value=None: release)


@pytest.mark.parametrize(
    "distribution, release, lacks",
    [
        ("pytorch-lightning", "1.9.5", "the process group before prepare_data"),
        ("pytorch-lightning", "2.0.9.post0", "the process group before prepare_data"),
        ("pytorch-lightning", "2.1.4", "the process group before prepare_data"),
        ("lightning", "2.1.0", "the process group before prepare_data"),
        ("pytorch-lightning", "2.2.5", "the barrier around prepare_data"),
        ("lightning", "2.2.0", "the barrier around prepare_data"),
    ],
)
def test_a_release_below_the_range_is_refused_naming_the_release_the_range_and_what_it_lacks(
    distribution, release, lacks
):
    error = _support.refusal("ddpprobe audit", distribution, release)
    assert isinstance(error, _support.UnsupportedLightning), error
    message = str(error)
    assert f"{distribution} {release} is installed" in message, message
    assert STATED in message, message
    assert lacks in message, message
    assert "pytorch_lightning/trainer/" in message, f"the message cites no Lightning source: {message}"
    assert (error.distribution, error.release) == (distribution, release)


@pytest.mark.parametrize("release", ["2.3.0", "2.3.3", "2.4.0", "2.5.6", "2.6.6"])
def test_a_release_inside_the_range_is_not_refused(release):
    assert _support.refusal("ddpprobe audit", "pytorch-lightning", release) is None
    assert _support.missing_features(release) == ()


def test_a_release_lacking_both_features_names_both():
    message = str(_support.refusal("CollectiveGuard", "pytorch-lightning", "2.1.4"))
    assert "the process group before prepare_data" in message and "the barrier around prepare_data" in message, message
    assert "2.1.4 lacks the process group" in message, message


def test_the_command_line_refuses_an_unsupported_release_with_exit_code_2_before_importing_the_module(
    monkeypatch, capsys
):
    from ddpprobe.__main__ import main

    _fake_release(monkeypatch, "2.1.4")
    started = time.perf_counter()
    code = main(["audit", "no_such_package.models:make_model"])  # importing it would be exit code 2 for another reason
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 2, err
    assert "ddpprobe audit: error: ddpprobe audit supports Lightning " + STATED in err, err
    assert "2.1.4 is installed" in err and "the process group before prepare_data" in err, err
    assert "no_such_package" not in err, f"the refusal must come before the module is imported:\n{err}"
    assert elapsed < REFUSAL_S, f"refused after {elapsed:.2f} s"


def test_audit_refuses_an_unsupported_release_before_calling_any_factory(monkeypatch):
    from ddpprobe.audit import audit

    called = []

    def make_model():
        called.append("model")
        raise AssertionError("the model factory ran")

    _fake_release(monkeypatch, "2.0.9.post0")
    started = time.perf_counter()
    with pytest.raises(_support.UnsupportedLightning, match="2.0.9.post0 is installed") as raised:
        audit(make_model)
    elapsed = time.perf_counter() - started
    assert called == [], "audit called the factory before refusing"
    assert STATED in str(raised.value)
    assert elapsed < REFUSAL_S, f"refused after {elapsed:.2f} s"


def test_collective_guard_refuses_an_unsupported_release_when_constructed(monkeypatch):
    from ddpprobe.guard import CollectiveGuard

    _fake_release(monkeypatch, "1.9.5")
    started = time.perf_counter()
    with pytest.raises(_support.UnsupportedLightning, match="CollectiveGuard supports Lightning " + STATED):
        CollectiveGuard()
    assert time.perf_counter() - started < REFUSAL_S


def test_a_release_newer_than_the_tested_ones_runs_with_a_warning(monkeypatch):
    from ddpprobe.guard import CollectiveGuard

    _fake_release(monkeypatch, "2.7.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guard = CollectiveGuard(collectives=False)
    assert guard.collectives is False
    untested = [w for w in caught if issubclass(w.category, _support.UntestedLightning)]
    assert len(untested) == 1 and "2.7.0 is newer than 2.6" in str(untested[0].message), [
        str(w.message) for w in caught
    ]


def test_the_installed_release_is_read_from_its_metadata_in_a_fresh_interpreter(tmp_path):
    """No faking inside the process: a metadata folder for the installed package's distribution at 2.1.4,
    first on PYTHONPATH, is what ``importlib.metadata`` reports; ``python -m ddpprobe audit`` refuses it."""
    choice = _lightning.chosen()
    distribution = _lightning.PACKAGES[choice][2]
    info = tmp_path / f"{distribution.replace('-', '_')}-2.1.4.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 2.1.4\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), DDPPROBE_LIGHTNING=choice)
    done = subprocess.run(
        [sys.executable, "-m", "ddpprobe", "audit", "examples.seed_f1_module:make_model"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"{distribution} 2.1.4 is installed" in done.stderr and STATED in done.stderr, done.stderr
    assert done.stdout == "", done.stdout


@pytest.mark.parametrize("page", ["README.md", "docs/versions.md"])
def test_the_readme_and_docs_versions_state_the_range_the_code_enforces(page):
    lowest = ".".join(map(str, _support.LOWEST))
    newest = ".".join(map(str, _support.NEWEST_TESTED))
    assert f"{lowest} to {newest}" == STATED, "the code's range is not the one this test states"
    text = (ROOT / page).read_text(encoding="utf-8")
    assert f"support {lowest} to {newest}" in text, f"{page} does not state 'support {lowest} to {newest}'"
