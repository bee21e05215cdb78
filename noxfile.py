"""The version matrix: run every fact on each pytorch-lightning release, then tabulate facts x versions.

Each ``facts`` session builds its own virtual environment with the same torch build, installs one
pinned ``pytorch-lightning`` release, runs the whole suite with ``--semantics-report`` and keeps the
card's JSON as ``.nox-out/semantics-<version>.json``. The ``matrix`` session merges those files into
``docs/matrix.md`` (``ddpprobe/versions.py`` ``render_matrix``): one row per fact, one column per
version, each cell *holds*, *does not hold*, *known bug still present*, *known bug fixed*, or *not
applicable* (the fact skipped there, e.g. ``requires_lightning(">=2.0")`` on 1.9.5).

Regenerate everything (about 1-2 minutes per version on 2 CPU cores)::

    pip install -e ".[matrix]"          # or: pip install nox
    nox                                 # = nox -s facts matrix

One version, or only some tests, then the table from whatever JSON files exist::

    nox -s "facts(lightning='1.9.5')" -- tests/facts/test_removed_hooks.py
    nox -s matrix

``nox -r`` reuses the environments of an earlier run (pip then finds everything installed: seconds).
"""

from __future__ import annotations

import os
import pathlib

import nox

#: pytorch-lightning releases in the matrix: the last 1.x and the last patch of every 2.x minor.
LIGHTNING_VERSIONS = ["1.9.5", "2.0.9.post0", "2.1.4", "2.2.5", "2.3.3", "2.4.0", "2.5.1", "2.6.6"]

#: One torch build for every version, installed first, so no step pulls another (e.g. a CUDA) build.
TORCH = os.environ.get("DDPPROBE_MATRIX_TORCH", "torch==2.13.0")

#: Where each version's semantics card (Markdown + JSON) lands.
OUT = pathlib.Path(".nox-out")

#: Older releases ``import pkg_resources`` when imported (pytorch_lightning/__init__.py declares a
#: namespace package with it; lightning_utilities' ``RequirementCache`` calls it). Recent setuptools no
#: longer ship ``pkg_resources``, and torch 2.13 pulls a recent one, so such a release gets this one.
PKG_RESOURCES_SETUPTOOLS = "setuptools<70"

#: Prints "yes" when importing pytorch_lightning fails for want of ``pkg_resources`` (a feature check,
#: not a version list, so a new release in LIGHTNING_VERSIONS needs no entry anywhere else).
_NEEDS_PKG_RESOURCES = """
try:
    import pytorch_lightning
except ModuleNotFoundError as exc:
    if exc.name != "pkg_resources":
        raise
    print("yes")
else:
    print("no")
"""

ROOT = pathlib.Path(__file__).resolve().parent

nox.options.sessions = ["facts", "matrix"]
nox.options.error_on_missing_interpreters = True


def _project_requirements() -> list:
    """The project's runtime dependencies except pytorch-lightning, plus its ``test`` extra, from
    pyproject.toml (the project is then installed with ``--no-deps`` so its ``pytorch-lightning>=2.0``
    floor does not veto a 1.x pin)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [r for r in project["dependencies"] if not r.replace("_", "-").startswith("pytorch-lightning")]
    return runtime + list(project["optional-dependencies"]["test"])


@nox.session(python=False, default=False)
def versions(session: nox.Session) -> None:
    """Print the pytorch-lightning releases in the matrix, one per line."""
    for version in LIGHTNING_VERSIONS:
        print(version)


@nox.session
@nox.parametrize("lightning", LIGHTNING_VERSIONS)
def facts(session: nox.Session, lightning: str) -> None:
    """Run the suite on ``pytorch-lightning==<lightning>``; write .nox-out/semantics-<lightning>.{md,json}.

    Extra arguments after ``--`` go to pytest (test paths, ``-k``, ``--world-size``). A run with
    failing facts (pytest exit code 1) still writes its card and the session still succeeds: a fact
    that does not hold on some release is a result, not a broken run. Any other exit code (usage
    error, internal error, no tests collected) fails the session.
    """
    session.install(TORCH)
    session.install(f"pytorch-lightning=={lightning}", *_project_requirements())
    session.install("--no-deps", "-e", ".")
    # Last, since torch 2.13 asks for setuptools>=77 and pip would upgrade it back: a release whose
    # import needs ``pkg_resources`` (gone from recent setuptools) gets a setuptools that has it.
    needs = session.run_install("python", "-c", _NEEDS_PKG_RESOURCES, silent=True)
    if needs is not None and needs.strip() == "yes":
        session.install(PKG_RESOURCES_SETUPTOOLS)
    session.run("python", "-c", "import torch, pytorch_lightning, torchmetrics; "
                "print('torch', torch.__version__, '| pytorch-lightning', pytorch_lightning.__version__, "
                "'| torchmetrics', torchmetrics.__version__)")

    OUT.mkdir(exist_ok=True)
    card = OUT / f"semantics-{lightning}.md"
    for stale in (card, card.with_suffix(".json")):
        stale.unlink(missing_ok=True)
    ran = session.run(
        "python", "-m", "pytest", "-n", "auto", "-p", "no:cacheprovider", "-q",
        f"--semantics-report={card}", "--semantics-no-picture", *session.posargs,
        success_codes=[0, 1],
    )
    if ran is not None and not card.with_suffix(".json").exists():  # None: ``nox --install-only``
        session.error(f"pytest ended without writing {card.with_suffix('.json')}")


@nox.session(default=True)
def matrix(session: nox.Session) -> None:
    """Merge .nox-out/semantics-*.json into docs/matrix.md (facts x pytorch-lightning versions)."""
    cards = sorted(str(p) for p in OUT.glob("semantics-*.json"))
    if not cards:
        session.error(f"no {OUT}/semantics-*.json: run `nox -s facts` first")
    session.install("packaging")
    # Run the module as a file: ddpprobe/versions.py needs only the standard library and packaging,
    # so this environment does not need torch or Lightning.
    session.run("python", "ddpprobe/versions.py", "matrix", *cards, "--out", "docs/matrix.md",
                "--command", "nox -s facts matrix")
