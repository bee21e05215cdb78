"""A script next to a folder named ``ddpprobe`` (the checkout itself, when the repository was cloned into
``ddpprobe/``) fails with "cannot import name 'run_world' from 'ddpprobe' (unknown location)": Python
puts the script's folder first on ``sys.path``, finds the folder ``ddpprobe/`` there without an
``__init__.py``, and keeps it as a namespace package, which wins over the import hook of an editable
install (setuptools' ``__editable___*_finder`` comes after the path search), though not over a regular
package found anywhere on ``sys.path`` (Python's import system: regular packages, then namespace
portions, PEP 420). No ddpprobe code runs in that failure, so the README explains it under the exact
message; these tests reproduce it and prove each fix the README gives."""

import pathlib
import subprocess
import sys

import pytest

import ddpprobe

ROOT = pathlib.Path(__file__).resolve().parents[3]
MESSAGE = "cannot import name 'run_world' from 'ddpprobe' (unknown location)"
SCRIPT = "from ddpprobe import run_world\nprint('imported', run_world.__module__)\n"

#: The folder holding the ``ddpprobe`` package, as a regular install puts it on ``sys.path``.
PACKAGE_PARENT = pathlib.Path(ddpprobe.__file__).resolve().parent.parent

#: Run in a fresh interpreter: does the path search itself find ``ddpprobe`` as a regular package? Not
#: for setuptools' default editable install of this flat layout (an import hook maps the name instead).
ON_PATH = "import importlib.machinery as m; s = m.PathFinder.find_spec('ddpprobe'); print(bool(s and s.origin))"


def _layout(tmp_path) -> pathlib.Path:
    """``tmp/ddpprobe/`` (a checkout-like folder without ``__init__.py``) and ``tmp/script.py`` beside it."""
    (tmp_path / "ddpprobe").mkdir()
    (tmp_path / "ddpprobe" / "README.md").write_text("a checkout cloned into a folder named ddpprobe\n")
    (tmp_path / "script.py").write_text(SCRIPT)
    return tmp_path


def _run(args, cwd, **env):
    import os

    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_the_readme_explains_the_shadowing_message():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert MESSAGE in readme, "README.md must quote the error so a search for it finds the explanation"


def test_a_script_beside_a_folder_named_ddpprobe_imports_that_folder_unless_the_package_is_on_the_path(tmp_path):
    """With this environment's install: an editable install (the README's ``pip install -e``) fails with
    the message; an install that puts the package's folder on ``sys.path`` imports the package."""
    folder = _layout(tmp_path)

    on_path = _run(["-c", ON_PATH], cwd=folder / "ddpprobe").stdout.strip() == "True"

    result = _run(["script.py"], cwd=folder)

    if on_path:
        assert result.returncode == 0 and "imported ddpprobe.launch" in result.stdout, result.stderr
    else:
        assert result.returncode != 0 and MESSAGE in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    "fix",
    [
        "the script in another folder",
        "a regular install (the package's folder on sys.path)",
        pytest.param(
            "python -P", marks=pytest.mark.skipif(sys.version_info < (3, 11), reason="-P is new in Python 3.11")
        ),
    ],
)
def test_each_fix_the_readme_gives_imports_the_package(tmp_path, fix):
    folder = _layout(tmp_path)
    if fix == "the script in another folder":
        (folder / "scripts").mkdir()
        (folder / "scripts" / "script.py").write_text(SCRIPT)
        result = _run(["scripts/script.py"], cwd=folder)
    elif fix.startswith("a regular install"):
        result = _run(["script.py"], cwd=folder, PYTHONPATH=str(PACKAGE_PARENT))
    else:
        result = _run(["-P", "script.py"], cwd=folder)

    assert result.returncode == 0 and "imported ddpprobe.launch" in result.stdout, result.stderr[-2000:]
