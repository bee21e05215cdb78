"""One skip vocabulary: what a fact needs (CUDA devices, the run's backend, a Lightning release range),
and the reason it is skipped where that is missing.

Like Lightning's ``RunIf`` (tests_pytorch/helpers/runif.py), a fact declares its needs in one marker and
the skip reason is built from them, so it is never missing or wrong::

    from ddpprobe.plugin.runif import run_if

    pytestmark = run_if(min_gpus=2, backend="nccl")      # a whole module

    @run_if(lightning="<2.0")                             # one test
    def test_validation_epoch_end_receives_only_the_ranks_own_outputs(run_world): ...

``run_if`` returns a ``pytest.mark.run_if(...)`` marker. ``ddpprobe.plugin.pytest_plugin`` evaluates it at
collection, against this run (its ``--backend``, the CUDA devices here, the Lightning package chosen with
``--lightning`` and its version), and adds a ``pytest.mark.skipif`` with the reason to every test that
cannot run, so pytest's ``-ra`` summary points at the skipped test itself. Reasons read, joined by
``"; "`` when several needs are missing:

- ``needs >= 2 CUDA devices (found 0)``
- ``needs --backend nccl (this run: gloo)``
- ``applies to pytorch-lightning <2.0; installed 2.6.6`` (or ``lightning <2.0; ...`` with ``--lightning lightning``)
- ``applies to pytorch-lightning >=2.6 (EarlyStopping.stopping_reason); installed 2.5.6``: a range given with
  the Lightning feature it stands for (``run_if(lightning=">=2.6", feature="EarlyStopping.stopping_reason")``),
  so the reason says what the release lacks, not only its number (docs/versions.md lists them)

Facts parametrised by ``world_size`` need one CUDA device per rank under ``--backend nccl``:
:func:`world_skip_reason` says why such a world cannot run here.

This module imports neither torch nor Lightning; the device count and the package version are read
only when :meth:`RunEnvironment.here` is called.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ddpprobe.launch import BACKENDS

#: Name of the marker :func:`run_if` returns; the pytest plugin registers and evaluates it.
MARKER = "run_if"

#: Kinds of unmet needs (the first element of each :func:`unmet` pair).
DEVICES, BACKEND, LIGHTNING = "devices", "backend", "lightning"


@dataclasses.dataclass(frozen=True)
class Requirements:
    """What one fact needs to run.

    Attributes:
        min_gpus: CUDA devices this machine must have (0: none needed).
        backend: the run's ``--backend`` the fact needs (``"gloo"`` or ``"nccl"``), or None for any.
        lightning: a PEP 440 specifier set the chosen Lightning package's version must lie in (e.g.
            ``"<2.0"``, ``">=2.0,<2.2"``; post-releases count as their release), or None for any.
        feature: what ``lightning`` stands for, named in the reason: the Lightning feature the range
            has (``"EarlyStopping.stopping_reason"``) or lacks (``"no EarlyStopping.stopping_reason"``);
            None to give the range alone.
    """

    min_gpus: int = 0
    backend: Optional[str] = None
    lightning: Optional[str] = None
    feature: Optional[str] = None

    def __post_init__(self) -> None:
        if isinstance(self.min_gpus, bool) or not isinstance(self.min_gpus, int) or self.min_gpus < 0:
            raise ValueError(f"run_if(min_gpus={self.min_gpus!r}): give a whole number of CUDA devices >= 0")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"run_if(backend={self.backend!r}): use one of {', '.join(BACKENDS)}, or leave it out")
        if self.lightning is not None:
            try:
                SpecifierSet(self.lightning)
            except InvalidSpecifier:
                raise ValueError(
                    f"run_if(lightning={self.lightning!r}) is not a version range; write e.g. '>=2.0' or '>=2.0,<2.2'"
                ) from None
        if self.feature is not None and (not isinstance(self.feature, str) or not self.feature.strip()):
            raise ValueError(f"run_if(feature={self.feature!r}): name the Lightning feature in words, or leave it out")
        if self.feature is not None and self.lightning is None:
            raise ValueError(
                f"run_if(feature={self.feature!r}) names what a Lightning range stands for; give the range too "
                "(lightning='>=2.6')"
            )


@dataclasses.dataclass(frozen=True)
class RunEnvironment:
    """What this run offers a fact.

    Attributes:
        backend: the run's ``--backend`` (``"gloo"`` or ``"nccl"``).
        cuda_devices: CUDA devices torch can use here (0 without CUDA).
        lightning_distribution: the PyPI name of the chosen Lightning package (``"pytorch-lightning"``
            or ``"lightning"``), as the reasons name it.
        lightning_version: its installed version (``"2.6.6"``), or None when it is not installed.
    """

    backend: str = "gloo"
    cuda_devices: int = 0
    lightning_distribution: str = "pytorch-lightning"
    lightning_version: Optional[str] = None

    @classmethod
    def here(cls, backend: str = "gloo") -> "RunEnvironment":
        """This machine and process: the CUDA devices torch sees (``ddpprobe.launch`` counts them, without
        creating a CUDA context) and the Lightning package ``ddpprobe._lightning`` chose."""
        from ddpprobe import _lightning
        from ddpprobe.launch import cuda_device_count

        return cls(
            backend=backend,
            cuda_devices=cuda_device_count(),
            lightning_distribution=_lightning.distribution(),
            lightning_version=_lightning.version(),
        )


def run_if(
    *, min_gpus: int = 0, backend: Optional[str] = None, lightning: Optional[str] = None, feature: Optional[str] = None
):
    """The marker that runs a fact only where its needs are met, and skips it with the reason elsewhere.

    Args:
        min_gpus: CUDA devices the machine must have (``needs >= 2 CUDA devices (found 0)``).
        backend: the ``--backend`` the run must use (``needs --backend nccl (this run: gloo)``).
        lightning: a version range of the chosen Lightning package, e.g. ``"<2.0"``
            (``applies to pytorch-lightning <2.0; installed 2.6.6``).
        feature: the Lightning feature that range has or lacks, named in the reason
            (``applies to pytorch-lightning >=2.6 (EarlyStopping.stopping_reason); installed 2.5.6``).

    Returns:
        ``pytest.mark.run_if(Requirements(...))``, for a decorator, ``pytestmark`` or
        ``pytest.param(..., marks=...)``; ``ddpprobe.plugin.pytest_plugin`` turns it into a ``skipif`` at collection.

    Raises:
        ValueError: a need is malformed (negative ``min_gpus``, unknown backend, a range that is not
            PEP 440, a feature without a range); the message names the value. Raised when the test module
            is imported.
    """
    import pytest

    return getattr(pytest.mark, MARKER)(
        Requirements(min_gpus=min_gpus, backend=backend, lightning=lightning, feature=feature)
    )


def lightning_in(spec: str, installed: Optional[str]) -> bool:
    """Whether version ``installed`` lies in the PEP 440 range ``spec`` (post-releases count as their
    release: ``2.0.9.post0`` is in ``">=2.0"``; pre-releases are included).

    Raises:
        ValueError: ``spec`` is not a specifier set, ``installed`` is None or not a version.
    """
    if installed is None:
        raise ValueError(
            f"no Lightning version to compare with {spec!r}: the chosen Lightning package is not installed"
        )
    try:
        return SpecifierSet(spec).contains(Version(installed), prereleases=True)
    except InvalidSpecifier:
        raise ValueError(f"{spec!r} is not a version range; write e.g. '>=2.0' or '>=2.0,<2.2'") from None
    except InvalidVersion:
        raise ValueError(f"{installed!r} is not a version") from None


def unmet(requirements: Requirements, environment: RunEnvironment) -> List[Tuple[str, str]]:
    """The needs of ``requirements`` that ``environment`` does not meet, as ``(kind, reason)`` pairs in
    the order devices, backend, Lightning; empty when the fact can run. ``kind`` is :data:`DEVICES`,
    :data:`BACKEND` or :data:`LIGHTNING`."""
    found = []
    if environment.cuda_devices < requirements.min_gpus:
        found.append((DEVICES, f"needs >= {requirements.min_gpus} CUDA devices (found {environment.cuda_devices})"))
    if requirements.backend is not None and requirements.backend != environment.backend:
        found.append((BACKEND, f"needs --backend {requirements.backend} (this run: {environment.backend})"))
    if requirements.lightning is not None:
        installed = environment.lightning_version
        if installed is None or not lightning_in(requirements.lightning, installed):
            feature = f" ({requirements.feature})" if requirements.feature else ""
            found.append(
                (
                    LIGHTNING,
                    f"applies to {environment.lightning_distribution} {requirements.lightning}{feature}; "
                    f"installed {installed or 'none'}",
                )
            )
    return found


def skip_reason(requirements: Requirements, environment: RunEnvironment) -> Optional[str]:
    """Why a fact with ``requirements`` cannot run in ``environment`` (every unmet need, joined by
    ``"; "``), or None if it can."""
    reasons = [reason for _, reason in unmet(requirements, environment)]
    return "; ".join(reasons) or None


def world_skip_reason(backend: str, world_size: int, device_count: int) -> Optional[str]:
    """Why a world of ``world_size`` ranks cannot run with ``backend`` on ``device_count`` CUDA devices
    (nccl needs one device per rank), or None if it can.

    Example: ``world_skip_reason("nccl", 3, 2)`` is ``"backend nccl with world size 3 needs 3 CUDA
    devices, found 2"``.
    """
    if backend == "nccl" and device_count < world_size:
        return f"backend nccl with world size {world_size} needs {world_size} CUDA devices, found {device_count}"
    return None


def requirements_of(item) -> Requirements:
    """The needs of one collected pytest item: every ``run_if`` marker on it, its class and its module
    merged (the most GPUs; a backend from the closest marker that names one; every range, intersected,
    with every feature named).

    Raises:
        ValueError: two markers on the item ask for different backends.
    """
    min_gpus, backend, ranges, features = 0, None, [], []
    for marker in item.iter_markers(MARKER):
        need = marker.args[0] if marker.args else Requirements(**marker.kwargs)
        min_gpus = max(min_gpus, need.min_gpus)
        if need.backend is not None:
            if backend is not None and backend != need.backend:
                raise ValueError(f"{item.nodeid}: run_if markers ask for backend {backend!r} and {need.backend!r}")
            backend = backend or need.backend
        if need.lightning is not None:
            ranges.append(need.lightning)
        if need.feature is not None:
            features.append(need.feature)
    return Requirements(
        min_gpus=min_gpus, backend=backend, lightning=",".join(ranges) or None, feature=", ".join(features) or None
    )


def parse_world_sizes(raw: str) -> frozenset:
    """``"2,3"`` -> ``{2, 3}``; empty -> empty (every world size).

    Raises:
        pytest.UsageError: a part is not a whole number >= 1; the message names the value.
    """
    import pytest

    sizes = set()
    for part in (raw or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            size = int(part)
        except ValueError:
            size = None
        if size is None or size < 1:
            raise pytest.UsageError(
                f"--world-size / DDPPROBE_WORLD_SIZES={raw!r}: {part!r} is not a world size; give whole numbers "
                ">= 1, e.g. --world-size 2,3"
            )
        sizes.add(size)
    return frozenset(sizes)


def check_devices(world_sizes: frozenset) -> None:
    """Under nccl, refuse at once a machine with fewer CUDA devices than the smallest need: one per rank of
    the largest ``--world-size`` asked for, else one (every world has a rank)."""
    import pytest

    from ddpprobe.launch import cuda_device_count

    needed = max(world_sizes, default=1)
    found = cuda_device_count()
    if found < needed:
        why = f"--world-size {max(world_sizes)}" if world_sizes else "every world has at least one rank"
        raise pytest.UsageError(
            f"--backend nccl runs one CUDA device per rank: {needed} needed ({why}), found {found}. Run on a "
            "machine with enough GPUs, use --backend gloo, or pass --skip-unavailable to skip the facts that "
            "cannot run here, each with its reason"
        )
