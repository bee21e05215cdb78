"""The README's set-up is two commands, and ``.ci/run`` runs them: ``pip install -e ".[test]"`` then
``pytest -n auto``, with torch bounded in ``pyproject.toml`` so the install picks the release the suite is
run with (docs/install.md)."""

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    tomllib = pytest.importorskip("tomli")

pytestmark = pytest.mark.not_a_fact("checks the README's set-up commands against .ci/run and pyproject.toml")

ROOT = Path(__file__).resolve().parents[3]


def _setup_commands() -> list:
    """The commands of the first ``bash`` block under the README's "Set up and run" (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Set up and run") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def test_the_readme_sets_up_with_two_commands_and_ci_runs_them():
    commands = _setup_commands()
    assert commands == ['pip install -e ".[test]"', "pytest -n auto"], commands

    ci = (ROOT / ".ci" / "run").read_text()
    assert 'python -m pip install -q -e ".[test]"' in ci, "the README's install is not in .ci/run"
    assert re.search(r'^run_pytest "default run" -n auto$', ci, re.M), "the README's pytest -n auto is not in .ci/run"


def test_torch_is_bounded_in_pyproject_at_the_release_the_readme_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch,) = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    upper = re.search(r"<\s*(\d+)\.(\d+)", torch)
    assert upper, f"{torch!r} has no upper bound: a fresh install would pick the newest torch"
    tested = f"{upper.group(1)}.{int(upper.group(2)) - 1}"
    readme = (ROOT / "README.md").read_text()
    assert f"torch {tested}" in readme and f"torch=={tested}.0" in readme, (torch, tested)
