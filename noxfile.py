"""The version matrix: run every fact on each Lightning release, then tabulate facts x releases.

Each ``facts`` session builds its own virtual environment with the same torch build, installs one pinned
release of one Lightning distribution (``pytorch-lightning``, or the unified ``lightning`` run with
``DDPPROBE_LIGHTNING=lightning``), runs the whole suite with ``--semantics-report`` and keeps the card's
JSON as ``.nox-out/semantics-<distribution>-<version>.json``. The ``matrix`` session merges those files
into ``docs/matrix.md`` (``python -m ddpprobe.card.matrix``): one row per fact, one column per release
and package, each cell *holds*, *does not hold*, *bug present*, *bug absent* or *n/a* (the fact skipped
there, e.g. ``run_if(lightning=">=2.0")`` on 1.9.5); facts that differ between the two packages at the
same release are listed first.

The releases (``ddpprobe/card/releases.py``): the last 1.x and the last patch of every 2.x minor of
``pytorch-lightning``, and the newest of those for ``lightning``, read from ``pip index versions`` when
this file loads (a pinned list, with a line on stderr, when the index cannot be asked).

Regenerate everything, one release after another (at least 26 minutes on 2 quiet CPU cores: docs/versions.md)::

    pip install -e ".[matrix]"          # nox and uv
    nox                                 # = nox -s facts matrix
    nox -s versions                     # the sessions' releases, one a line

One release, or only some tests, then the table from whatever JSON files exist::

    nox -s "facts(pytorch-lightning==1.9.5)" -- tests/facts/test_removed_hooks.py
    nox -s "facts(lightning==2.6.6)"
    nox -s matrix

Environments are made with uv where it is installed (``venv_backend="uv|virtualenv"``: seconds a release
from uv's cache; pip otherwise) and reused by the next run (``reuse_venv = "yes"``): an install then only
adds what changed (a new pin, a new requirement); the project itself is installed editable, so code changes
need no install. ``nox --reuse-venv=no`` makes every environment afresh.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shlex
import subprocess
import sys
import time

import nox

ROOT = pathlib.Path(__file__).resolve().parent


def _releases_module():
    """ddpprobe/card/releases.py loaded as a file: it needs only the standard library and packaging (which
    nox has), so the ddpprobe package and its dependencies need not be importable where nox runs."""
    spec = importlib.util.spec_from_file_location("ddpprobe_card_releases", ROOT / "ddpprobe" / "card" / "releases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


releases = _releases_module().releases

#: ``(distribution, version)`` of every ``facts`` session: pytorch-lightning's last 1.x and the last patch
#: of every 2.x minor; the unified ``lightning`` at the newest of those.
RELEASES = [("pytorch-lightning", v) for v in releases("pytorch-lightning")] + [
    ("lightning", v) for v in releases("lightning", newest_only=True)
]

#: The import package each distribution is run as (``DDPPROBE_LIGHTNING``, ddpprobe/_lightning.py).
IMPORT_NAME = {"pytorch-lightning": "pytorch_lightning", "lightning": "lightning"}

#: One torch build for every version, pinned in the install of each release, so nothing pulls another (e.g. a
#: CUDA) build.
TORCH = os.environ.get("DDPPROBE_MATRIX_TORCH", "torch==2.13.0")

#: Where each version's semantics card (Markdown + JSON) lands.
OUT = pathlib.Path(".nox-out")

#: Older releases ``import pkg_resources`` when imported (pytorch_lightning/__init__.py declares a
#: namespace package with it; lightning_utilities' ``RequirementCache`` calls it). setuptools 82 no longer
#: ships ``pkg_resources`` and 80-81 warn with a ``UserWarning`` when it is imported (earlier ones with a
#: ``DeprecationWarning``, hidden by default); 79 meets torch 2.13's ``setuptools>=77.0.3``, so a reused
#: environment keeps it (no later install undoes it).
PKG_RESOURCES_SETUPTOOLS = "setuptools<80"

#: How the pytest-xdist workers of a ``facts`` session are counted (``-n``): one per core.
WORKERS = os.environ.get("DDPPROBE_MATRIX_WORKERS", "auto")

#: Prints "yes" when importing the package fails for want of ``pkg_resources`` (a feature check, not a
#: version list, so a new release needs no entry anywhere else). ``{module}``: the import name.
_NEEDS_PKG_RESOURCES = """
try:
    import {module}
except ModuleNotFoundError as exc:
    if exc.name != "pkg_resources":
        raise
    print("yes")
else:
    print("no")
"""

#: When this nox process started, and the ``facts`` sessions it ran: ``nox -s facts matrix`` runs every session in
#: one process, so the ``matrix`` session states the whole run's wall time in docs/matrix.md (none when it ran alone).
_STARTED = time.monotonic()
_RAN_FACTS: list = []

nox.options.sessions = ["facts", "matrix"]
nox.options.error_on_missing_interpreters = True
# uv makes an environment and installs torch and Lightning in seconds from its cache; where uv is not
# installed, virtualenv and pip do (minutes). An environment of an earlier run is reused, its installs
# then add only what is missing.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"

#: pip's settings (``pip config list``: files and environment) and the uv variable of each. uv reads no pip
#: configuration, so a machine whose pip finds wheels in a local folder or on an extra index (a CPU-only
#: torch build, a mirror) gives the same places to uv. ``(variable, separator)``.
_PIP_TO_UV = {
    "index-url": ("UV_DEFAULT_INDEX", " "),
    "extra-index-url": ("UV_INDEX", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", None),
}


def uv_environment(pip_config: str) -> dict:
    """The uv variables that give uv what ``pip_config`` (the output of ``pip config list``, lines
    ``global.find-links='/opt/wheels'``) gives pip, and pip's choice among indexes: the best version on
    any of them (``UV_INDEX_STRATEGY=unsafe-best-match``; uv's default takes a package from the first
    index that has it, so a local index holding only the newest Lightning would hide 1.9.5)."""
    found: dict = {}
    for line in pip_config.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in _PIP_TO_UV and value:
            found[name] = shlex.split(value)[0].split()
    variables = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    for name, values in found.items():
        variable, separator = _PIP_TO_UV[name]
        variables[variable] = values[0] if separator is None else separator.join(values)
    return variables


def _uv_settings(session: nox.Session) -> None:
    """Give this session's uv pip's places to look (:func:`uv_environment`), unless the caller set a uv
    variable already, or the session installs with pip."""
    if getattr(session.virtualenv, "venv_backend", None) != "uv":
        return
    try:
        pip_config = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        pip_config = ""
    for variable, value in uv_environment(pip_config).items():
        if variable not in os.environ:
            session.env[variable] = value


def _project_requirements() -> list:
    """The project's runtime dependencies except Lightning, plus its ``test`` extra, from pyproject.toml
    (the project is then installed with ``--no-deps`` so its ``pytorch-lightning`` floor does not veto a
    1.x pin, nor pull pytorch-lightning next to ``lightning``)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [
        r for r in project["dependencies"] if not r.replace("_", "-").startswith(("pytorch-lightning", "lightning"))
    ]
    return runtime + list(project["optional-dependencies"]["test"])


@nox.session(python=False, default=False)
def versions(session: nox.Session) -> None:
    """Print the ``facts`` sessions' releases, one ``distribution==version`` a line."""
    for distribution, version in RELEASES:
        print(f"{distribution}=={version}")


@nox.session
@nox.parametrize(["distribution", "version"], RELEASES, ids=[f"{d}=={v}" for d, v in RELEASES])
def facts(session: nox.Session, distribution: str, version: str) -> None:
    """Run the suite on ``<distribution>==<version>``; write .nox-out/semantics-<distribution>-<version>.{md,json}.

    Extra arguments after ``--`` go to pytest (test paths, ``-k``, ``--world-size``). A run with
    failing facts (pytest exit code 1) still writes its card and the session still succeeds: a fact
    that does not hold on some release is a result, not a broken run. Any other exit code (usage
    error, internal error, no tests collected) fails the session.
    """
    module = IMPORT_NAME[distribution]
    _uv_settings(session)
    # One resolution with torch pinned, so nothing pulls another (e.g. a CUDA) build.
    session.install(TORCH, f"{distribution}=={version}", *_project_requirements())
    session.install("--no-deps", "-e", ".")
    # A release whose import needs ``pkg_resources`` (gone from recent setuptools) gets a setuptools that has it.
    needs = session.run_install("python", "-c", _NEEDS_PKG_RESOURCES.format(module=module), silent=True)
    if needs is not None and needs.strip() == "yes":
        session.install(PKG_RESOURCES_SETUPTOOLS)
    session.env["DDPPROBE_LIGHTNING"] = module
    session.run(
        "python",
        "-c",
        f"import torch, {module}, torchmetrics; "
        f"print('torch', torch.__version__, '| {distribution}', {module}.__version__, "
        "'| torchmetrics', torchmetrics.__version__)",
    )

    OUT.mkdir(exist_ok=True)
    card = OUT / f"semantics-{distribution}-{version}.md"
    for stale in (card, card.with_suffix(".json")):
        stale.unlink(missing_ok=True)
    ran = session.run(
        "python",
        "-m",
        "pytest",
        "-n",
        WORKERS,
        "-p",
        "no:cacheprovider",
        "-q",
        f"--semantics-report={card}",
        "--semantics-no-picture",
        *session.posargs,
        success_codes=[0, 1],
    )
    if ran is not None and not card.with_suffix(".json").exists():  # None: ``nox --install-only``
        session.error(f"pytest ended without writing {card.with_suffix('.json')}")
    _RAN_FACTS.append(f"{distribution}=={version}")


@nox.session(default=True)
def matrix(session: nox.Session) -> None:
    """Merge .nox-out/semantics-*.json into docs/matrix.md (facts x Lightning releases and packages)."""
    cards = sorted(str(p) for p in OUT.glob("semantics-*.json"))
    if not cards:
        session.error(f"no {OUT}/semantics-*.json: run `nox -s facts` first")
    # ddpprobe.card.matrix needs only packaging and jsonschema: this environment has no torch or Lightning.
    _uv_settings(session)
    session.install("packaging", "jsonschema>=4.18")
    session.install("--no-deps", "-e", ".")
    wall = ["--wall-s", f"{time.monotonic() - _STARTED:.0f}"] if _RAN_FACTS else []
    session.run(
        "python",
        "-m",
        "ddpprobe.card.matrix",
        *cards,
        "--out",
        "docs/matrix.md",
        "--command",
        "nox -s facts matrix",
        *wall,
    )
