"""The Lightning releases the audit and the guard support, and their refusal, at start, outside them.

The facts run on every release of the version matrix (docs/matrix.md: ``pytorch-lightning`` 1.9.5 to 2.6 and
the unified ``lightning``): what a fact says on an old release is a result. The audit and the guard read
Lightning's own behaviour (when the process group exists, which hook makes which collective), and their tests
(``tests/tooling/``) pass only on releases that have what they read. The support range starts at the first
release that has every :data:`FEATURES` entry; below it ``ddpprobe audit``, :func:`ddpprobe.audit.audit` and
``CollectiveGuard()`` raise :class:`UnsupportedLightning` before they start anything, naming the release found,
the range and what the release lacks. Above :data:`NEWEST_TESTED` they run and warn
(:class:`UntestedLightning`): a release the matrix has not run yet lacks nothing the audit knows of.

The release is read from the distribution's metadata (no Lightning import), so a refusal takes milliseconds.
Why the range starts where it does: docs/versions.md, "The audit and the guard: the support range".
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import Optional

from ddpprobe import _lightning


@dataclasses.dataclass(frozen=True)
class Feature:
    """One Lightning behaviour the audit and the guard rely on, and the first release that has it."""

    since: tuple  # (major, minor) of the first release that has it
    lacks: str  # what a release before ``since`` lacks, in Lightning's terms
    breaks: str  # what of the audit and the guard that breaks
    source: str  # where Lightning changed it


#: What the audit and the guard rely on that older releases lack, oldest first. A release is supported when it
#: has every entry (its minor is ``since`` or later); the tests that fail without each are named in
#: docs/versions.md, measured by the matrix's tooling column (``nox -s facts matrix``).
FEATURES = (
    Feature(
        since=(2, 2),
        lacks="the process group before prepare_data (Trainer._run creates it, strategy.setup_environment(), "
        "only after the prepare_data hook before 2.2.0)",
        breaks="a collective in prepare_data raises 'Default process group has not been initialized' on the "
        "ranks that run it instead of reaching the others, so the audit's and the guard's prepare_data "
        "checks cannot see it",
        source="pytorch_lightning/trainer/trainer.py, Trainer._run: setup_environment() moved before "
        "_data_connector.prepare_data() in 2.2.0",
    ),
    Feature(
        since=(2, 3),
        lacks="the barrier around prepare_data (every rank waits in an _InfiniteBarrier until the ranks that "
        "prepare the data are done, from 2.3.0)",
        breaks="the other ranks run on into the setup hook's barrier while rank 0 is still in prepare_data, so the "
        "guard times out on a correct run whose prepare_data is slower than its timeout and names a barrier in "
        "prepare_data as a mismatch with that setup barrier",
        source="pytorch_lightning CHANGELOG 2.3.0, 'The prepare_data() hook in LightningModule and "
        "LightningDataModule is now subject to a barrier without timeout' (#19448); "
        "_DataConnector.prepare_data in pytorch_lightning/trainer/connectors/data_connector.py",
    ),
)

#: The newest minor release the audit's and the guard's tests ran on (the version matrix's newest column).
NEWEST_TESTED = (2, 6)

#: The first supported minor release: the first that has every feature.
LOWEST = max(f.since for f in FEATURES)


class UnsupportedLightning(RuntimeError):
    """The installed Lightning release is below the audit's and the guard's support range (:data:`LOWEST`).

    Attributes:
        distribution: ``"pytorch-lightning"`` or ``"lightning"``.
        release: the installed version, e.g. ``"2.1.4"``.
        missing: the :class:`Feature` entries that release lacks.
    """

    def __init__(self, message: str, distribution: str, release: str, missing: tuple):
        super().__init__(message)
        self.distribution, self.release, self.missing = distribution, release, missing


class UntestedLightning(UserWarning):
    """The installed Lightning release is newer than any release the audit's and the guard's tests ran on."""


def _minor(release: str) -> Optional[tuple]:
    """``(major, minor)`` of a version string (``"2.0.9.post0"`` -> ``(2, 0)``), None when it has none."""
    found = re.match(r"\s*v?(\d+)\.(\d+)", release)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _shown(minor: tuple) -> str:
    return f"{minor[0]}.{minor[1]}"


def support_range() -> str:
    """The range in words: ``"2.3 to 2.6 (newer releases run with a warning)"``."""
    return f"{_shown(LOWEST)} to {_shown(NEWEST_TESTED)} (newer releases run with a warning)"


def missing_features(release: str) -> tuple:
    """The :data:`FEATURES` a release lacks (empty: the release is supported or newer)."""
    minor = _minor(release)
    if minor is None:
        return ()
    return tuple(f for f in FEATURES if minor < f.since)


def refusal(tool: str, distribution: str, release: str) -> Optional[UnsupportedLightning]:
    """The error ``tool`` raises on ``distribution`` ``release``, None when that release is supported."""
    missing = missing_features(release)
    if not missing:
        return None
    lacks = "; ".join(f"{f.lacks}: {f.breaks} [{f.source}]" for f in missing)
    message = (
        f"{tool} supports Lightning {_shown(LOWEST)} to {_shown(NEWEST_TESTED)}, and {distribution} {release} is "
        f"installed. {release} lacks {lacks}. Install a supported release "
        f"(pip install '{distribution}>={_shown(LOWEST)}'); the facts themselves still run on {release} "
        "(docs/versions.md)."
    )
    return UnsupportedLightning(message, distribution, release, missing)


def _installed(package: Optional[str]) -> list:
    """``[(distribution, release)]`` the tool may run: ``package``'s (``"pytorch_lightning"`` or
    ``"lightning"``, or a module name of either such as ``"lightning.pytorch"``), else the one
    ``DDPPROBE_LIGHTNING`` names, else every installed one."""
    if package is not None:
        package = package.split(".")[0]
    if package is None and os.environ.get(_lightning.ENV_VAR):
        package = os.environ[_lightning.ENV_VAR]
    choices = [package] if package is not None else list(_lightning.PACKAGES)
    found = []
    for choice in choices:
        release = _lightning.version(choice) if choice in _lightning.PACKAGES else None
        if release is not None:
            found.append((_lightning.PACKAGES[choice][2], release))
    return found


def require(tool: str, package: Optional[str] = None) -> None:
    """Refuse to start ``tool`` on a Lightning release below the support range; warn once above it.

    Args:
        tool: the name the message starts with (``"ddpprobe audit"``, ``"CollectiveGuard"``).
        package: ``"pytorch_lightning"`` or ``"lightning"`` (or a module of either: ``pl.__name__``), the
            package the tool runs; None: the one
            ``DDPPROBE_LIGHTNING`` names, else every installed one (a module's package is not known before
            it is imported).

    Raises:
        UnsupportedLightning: a release below :data:`LOWEST`; its message names the release found, the range
            and each feature the release lacks, with the Lightning source.
    """
    for distribution, release in _installed(package):
        error = refusal(tool, distribution, release)
        if error is not None:
            raise error
        minor = _minor(release)
        if minor is not None and minor > NEWEST_TESTED:
            warnings.warn(
                f"{tool}: {distribution} {release} is newer than {_shown(NEWEST_TESTED)}, the newest release its "
                "tests ran on (docs/versions.md); its findings are unchecked there",
                UntestedLightning,
                stacklevel=3,
            )
