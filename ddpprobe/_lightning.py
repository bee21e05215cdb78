"""Which Lightning package ddpprobe runs: ``pytorch_lightning`` or ``lightning.pytorch``, chosen in one place.

Lightning ships one trainer under two import packages: ``pytorch-lightning`` (``import pytorch_lightning
as pl``) and the unified ``lightning`` (``import lightning.pytorch as pl``). They are separate module
trees (their own ``rank_zero_only`` state, callbacks, loggers), so a fact proven with one is a claim
about the other until it runs there too. Every probe imports the trainer package from here::

    from ddpprobe._lightning import pl, fabric     # pl.Trainer, pl.strategies.DDPStrategy, fabric.plugins ...

The choice, first that is set: :func:`use` (the pytest option ``--lightning``, the audit's choice
from the user's module) > the environment variable ``DDPPROBE_LIGHTNING`` > ``pytorch_lightning`` when
installed, else ``lightning``. Forked and spawned ranks inherit the environment variable, so a world
runs the package its launcher chose. Reading the choice (:func:`chosen`, :func:`distribution`) imports
no Lightning; the first access to ``pl`` or ``fabric`` imports the chosen package.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from typing import Optional

#: The environment variable that names the package (also set by :func:`use`).
ENV_VAR = "DDPPROBE_LIGHTNING"

#: ``{choice: (trainer package, fabric package, distribution on PyPI)}``.
PACKAGES = {
    "pytorch_lightning": ("pytorch_lightning", "lightning_fabric", "pytorch-lightning"),
    "lightning": ("lightning.pytorch", "lightning.fabric", "lightning"),
}

#: Trainer subpackages imported with the package, so ``pl.strategies`` etc. are always attributes.
_SUBPACKAGES = ("strategies", "loggers", "callbacks", "utilities")


def _installed(choice: str) -> bool:
    top = PACKAGES[choice][0].split(".", 1)[0]
    return importlib.util.find_spec(top) is not None


def chosen(value: Optional[str] = None) -> str:
    """The package ddpprobe runs: ``"pytorch_lightning"`` or ``"lightning"``.

    Args:
        value: an explicit choice; default ``DDPPROBE_LIGHTNING``, else ``pytorch_lightning`` when it is
            installed, else ``lightning``.

    Raises:
        ValueError: the choice is neither name, or names a package that is not installed (the message
            names the value and the install command).
    """
    value = value if value is not None else os.environ.get(ENV_VAR) or None
    if value is None:
        return "pytorch_lightning" if _installed("pytorch_lightning") or not _installed("lightning") else "lightning"
    if value not in PACKAGES:
        raise ValueError(
            f"Lightning package {value!r} (from {ENV_VAR} or --lightning) is not one of "
            f"{', '.join(PACKAGES)}; use pytorch_lightning for `import pytorch_lightning` "
            "or lightning for `import lightning.pytorch`"
        )
    if not _installed(value):
        raise ValueError(
            f"Lightning package {value!r} is not installed; pip install {PACKAGES[value][2]} "
            f'(or pip install -e ".[{"lightning" if value == "lightning" else "test"}]"), or choose the other package'
        )
    return value


def use(value: str) -> str:
    """Choose the package for this process and every world it launches from now on; returns it.

    Raises:
        ValueError: as :func:`chosen`; also when another package was already imported through this
            module in this process (a process runs one of them).
    """
    value = chosen(value)
    loaded = globals().get("_loaded")
    if loaded is not None and loaded != value:
        raise ValueError(f"ddpprobe already runs {loaded!r} in this process; cannot switch to {value!r}")
    os.environ[ENV_VAR] = value
    return value


def distribution(value: Optional[str] = None) -> str:
    """The PyPI distribution of the chosen package (``"pytorch-lightning"`` or ``"lightning"``)."""
    return PACKAGES[chosen(value)][2]


def version(value: Optional[str] = None) -> Optional[str]:
    """The installed version of the chosen package's distribution (``"2.6.6"``), None if absent.

    Read from the distribution's metadata: no Lightning import."""
    try:
        return importlib.metadata.version(distribution(value))
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def trainer_package_of(cls) -> Optional[str]:
    """``"pytorch_lightning"`` or ``"lightning"`` when ``cls`` derives from that package's
    ``LightningModule`` / ``LightningDataModule`` (read from the MRO's module names), else None.

    Raises:
        ValueError: ``cls`` derives from both packages' classes.
    """
    found = set()
    for base in getattr(cls, "__mro__", ()):
        module = getattr(base, "__module__", "") or ""
        if module == "pytorch_lightning" or module.startswith("pytorch_lightning."):
            found.add("pytorch_lightning")
        elif module.startswith("lightning.pytorch"):
            found.add("lightning")
    if len(found) > 1:
        raise ValueError(
            f"{cls.__qualname__} derives from classes of both pytorch_lightning and lightning.pytorch; "
            "import every Lightning class from one package"
        )
    return found.pop() if found else None


def __getattr__(name: str):
    """``pl`` (the trainer package) and ``fabric`` (its fabric package), imported on first access."""
    if name not in ("pl", "fabric"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    choice = chosen()
    trainer_name, fabric_name, _ = PACKAGES[choice]
    pl = importlib.import_module(trainer_name)
    for sub in _SUBPACKAGES:
        importlib.import_module(f"{trainer_name}.{sub}")
    fabric = importlib.import_module(fabric_name)
    importlib.import_module(f"{fabric_name}.plugins")
    globals().update(pl=pl, fabric=fabric, _loaded=choice)
    return globals()[name]
