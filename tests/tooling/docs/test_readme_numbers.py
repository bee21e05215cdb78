"""The README's numbers are the suite's: what ``pytest -n auto`` runs and what a machine without GPUs
should see are counted from a collection of the default run, so they cannot drift as facts are added.

The README carries one generated sentence between ``<!-- counts -->`` and ``<!-- /counts -->``. To
refresh it after adding or removing tests, run from the repository root::

    python -m tests.tooling.docs.test_readme_numbers --write

Counted: every test the default run selects (the project's ``addopts`` apply, so deselected markers
stay out), split into facts (``tests/facts/``) and tests of the tooling (``tests/tooling/``); the tests
that skip on a CPU-only machine with ``--backend gloo`` and the Lightning release the sentence names
(from their ``run_if`` needs and any unconditional ``skip``/``skipif``), and the strict xfails. Skips a
test decides at run time (``pytest.skip()`` in its body) cannot be counted here and are not used by the
default run on CPU.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from typing import Optional

import pytest

from ddpprobe import _lightning
from ddpprobe.plugin import runif

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- counts -->\n(?P<text>.*?)\n<!-- /counts -->", re.S)
VERSION = re.compile(r"With (?P<distribution>pytorch-lightning|lightning) (?P<version>\S+) on a machine without GPUs")


class _Items:
    """A pytest plugin that keeps the items a collection selected."""

    def __init__(self) -> None:
        self.items = []

    def pytest_collection_finish(self, session) -> None:
        self.items = list(session.items)


def collect_arguments() -> list:
    """The default run's collection: the README's ``pytest`` from the repository root, collect-only, gloo."""
    return [
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        "--backend",
        "gloo",
        "--rootdir",
        str(ROOT),
        "-c",
        str(ROOT / "pyproject.toml"),
        str(ROOT / "tests"),
    ]


def _static_skip(item, added_by_run_if: Optional[str]) -> bool:
    """An unconditional ``skip``, or a ``skipif(True)`` the test declares itself (not the plugin's)."""
    if item.get_closest_marker("skip") is not None:
        return True
    return any(
        mark.args[:1] == (True,) and mark.kwargs.get("reason") != added_by_run_if
        for mark in item.iter_markers("skipif")
    )


def counts(items, distribution: str, version: str) -> dict:
    """What the default run gives on a machine without GPUs, with ``--backend gloo`` and Lightning
    ``distribution`` ``version``.

    Returns:
        ``{"tests", "facts", "tooling", "skipped", "skipped_gpu", "skipped_release", "skipped_other",
        "xfailed", "passed"}`` (counts of test cases).
    """
    reference = runif.RunEnvironment(
        backend="gloo", cuda_devices=0, lightning_distribution=distribution, lightning_version=version
    )
    result = dict.fromkeys(
        ("tests", "facts", "tooling", "skipped", "skipped_gpu", "skipped_release", "skipped_other", "xfailed"), 0
    )
    for item in items:
        result["tests"] += 1
        result["facts" if item.nodeid.startswith("tests/facts/") else "tooling"] += 1
        kinds = {kind for kind, _ in runif.unmet(runif.requirements_of(item), reference)}
        added = runif.skip_reason(runif.requirements_of(item), runif.RunEnvironment.here("gloo"))
        if kinds or _static_skip(item, added):
            result["skipped"] += 1
            if kinds & {runif.DEVICES, runif.BACKEND}:
                result["skipped_gpu"] += 1
            elif runif.LIGHTNING in kinds:
                result["skipped_release"] += 1
            else:
                result["skipped_other"] += 1
            continue
        xfail = item.get_closest_marker("xfail")
        if xfail is not None and xfail.kwargs.get("strict", False) and xfail.kwargs.get("run", True):
            result["xfailed"] += 1
    result["passed"] = result["tests"] - result["skipped"] - result["xfailed"]
    return result


def sentence(numbers: dict, distribution: str, version: str) -> str:
    """The README's sentence for ``numbers`` (:func:`counts`)."""
    why = []
    if numbers["skipped_gpu"]:
        why.append(f"{numbers['skipped_gpu']} that need GPUs or `--backend nccl`")
    if numbers["skipped_release"]:
        why.append(f"{numbers['skipped_release']} for other Lightning releases")
    if numbers["skipped_other"]:
        why.append(f"{numbers['skipped_other']} skipped by their own marker")
    return (
        f"`pytest -n auto` runs {numbers['tests']} tests: {numbers['facts']} facts (`tests/facts/`) and "
        f"{numbers['tooling']} tests of the tooling (`tests/tooling/`). With {distribution} {version} on a machine "
        f"without GPUs, {numbers['skipped']} skip, each with its reason ({', '.join(why) or 'none'}), and "
        f"{numbers['xfailed']} are strict xfails (known upstream bugs, asserted as they should behave): expect "
        f"{numbers['passed']} passed, {numbers['skipped']} skipped, {numbers['xfailed']} xfailed."
    )


def readme_sentence(text: str) -> str:
    match = BLOCK.search(text)
    assert match, f"{README} has no <!-- counts --> ... <!-- /counts --> block"
    return match.group("text")


def test_the_readme_states_the_numbers_of_the_default_run(pytester, monkeypatch):
    """The README's counts of tests, facts, skips and xfails equal those of a fresh collection of the
    default run, judged for a machine without GPUs (CUDA faked away) and the Lightning release the
    README names. On failure the message gives the sentence to paste (or run the ``--write`` command)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    stated = readme_sentence(README.read_text(encoding="utf-8"))
    named = VERSION.search(stated)
    assert named, f"the README's counts sentence names no Lightning release: {stated!r}"
    capture = _Items()

    pytester.inline_run(*collect_arguments(), plugins=[capture])

    assert capture.items, "the collection of the default run selected no tests"
    expected = sentence(
        counts(capture.items, named["distribution"], named["version"]), named["distribution"], named["version"]
    )
    if stated != expected:
        pytest.fail(
            f"README.md states:\n  {stated}\nthe suite gives:\n  {expected}\n"
            "update it with: python -m tests.tooling.docs.test_readme_numbers --write",
            pytrace=False,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.tooling.docs.test_readme_numbers",
        description="Print (or --write into README.md) the README's counts sentence.",
    )
    parser.add_argument("--write", action="store_true", help="replace the <!-- counts --> block of README.md")
    args = parser.parse_args(argv)
    import torch

    torch.cuda.is_available = lambda: False  # count for a machine without GPUs
    capture = _Items()
    code = pytest.main(collect_arguments(), plugins=[capture])
    if code != 0 or not capture.items:
        print(f"collection failed (pytest exit code {code})", file=sys.stderr)
        return 1
    distribution, version = _lightning.distribution(), _lightning.version()
    text = sentence(counts(capture.items, distribution, version), distribution, version)
    print(text)
    if args.write:
        readme = README.read_text(encoding="utf-8")
        readme_sentence(readme)
        README.write_text(
            BLOCK.sub(lambda _: f"<!-- counts -->\n{text}\n<!-- /counts -->", readme, count=1), encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
