"""Which Lightning releases the version matrix covers, derived from the package index when the matrix is built.

The rule: the last 1.x release and the last release (post-releases included) of every 2.x minor, for
``pytorch-lightning``; the newest of those for the unified ``lightning`` package, so the two packages are
compared at the same release. :func:`registry_versions` asks the configured index with
``python -m pip index versions <distribution> --json`` (the index ``pip`` is set up to use, so a mirror
works too); where that fails, :data:`PINNED` is used and a line on stderr says so.

Needs only the standard library and ``packaging`` (``noxfile.py`` imports it outside any environment)::

    python -m ddpprobe.card.releases                       # pytorch-lightning's matrix releases, one a line
    python -m ddpprobe.card.releases --distribution lightning --newest
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from typing import Optional

from packaging.version import InvalidVersion, Version

#: The fallback when the index cannot be asked: :func:`matrix_releases` of ``pip index versions`` run on
#: 2026-11-30 (pytorch-lightning and lightning list the same 2.x releases). Refresh it with
#: ``python -m ddpprobe.card.releases`` when a release comes out.
PINNED = {
    "pytorch-lightning": ["1.9.5", "2.0.9.post0", "2.1.4", "2.2.5", "2.3.3", "2.4.0", "2.5.6", "2.6.6"],
    "lightning": ["1.9.5", "2.0.9.post0", "2.1.4", "2.2.5", "2.3.3", "2.4.0", "2.5.6", "2.6.6"],
}


def registry_versions(distribution: str, timeout: float = 60.0) -> list:
    """Every version of ``distribution`` the configured package index lists (``pip index versions``).

    Raises:
        RuntimeError: pip failed or printed no version list (no network, unknown distribution); the
            message has pip's own words.
    """
    command = [sys.executable, "-m", "pip", "index", "versions", distribution, "--json", "--disable-pip-version-check"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        # An older pip (23.2 here) has no --json: ask again for the text form.
        if done.returncode != 0 and "no such option: --json" in done.stderr:
            command.remove("--json")
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{' '.join(command)}: {exc}") from exc
    try:
        versions = json.loads(done.stdout)["versions"]
    except (ValueError, KeyError, TypeError):  # an older pip without --json: the text form
        match = re.search(r"Available versions: (.+)", done.stdout)
        versions = [v.strip() for v in match.group(1).split(",")] if match else []
    if done.returncode != 0 or not versions:
        why = (done.stderr.strip().splitlines() or ["no version list in pip's output"])[-1]
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {why}")
    return versions


def matrix_releases(versions) -> list:
    """The last 1.x release and the last release of every 2.x minor among ``versions``, ascending.

    Pre-releases, development releases and strings that are no PEP 440 version are ignored; a
    post-release counts as its release's latest (``2.0.9.post0`` over ``2.0.9``).
    ``["1.9.4", "1.9.5", "2.5.1", "2.5.6", "2.6.0rc1"]`` -> ``["1.9.5", "2.5.6"]``.
    """
    parsed = []
    for text in versions:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease):
            parsed.append(version)
    last: dict = {}
    for version in parsed:
        key = (1,) if version.major == 1 else (version.major, version.minor) if version.major >= 2 else None
        if key is not None and (key not in last or version > last[key]):
            last[key] = version
    return [str(v) for v in sorted(last.values())]


def releases(
    distribution: str = "pytorch-lightning", newest_only: bool = False, versions: Optional[list] = None
) -> list:
    """The matrix's releases of ``distribution``: from the index, else :data:`PINNED` (said on stderr).

    Args:
        distribution: ``"pytorch-lightning"`` or ``"lightning"``.
        newest_only: only the newest of them (what the matrix runs for ``lightning``).
        versions: the index's version list, when already known (tests); default: ask the index.

    Raises:
        ValueError: ``distribution`` has no pinned fallback (it is not a Lightning distribution).
    """
    if distribution not in PINNED:
        raise ValueError(f"distribution {distribution!r} is not one of {', '.join(PINNED)}")
    if versions is None:
        try:
            versions = registry_versions(distribution)
        except RuntimeError as exc:
            print(
                f"ddpprobe: cannot list {distribution} releases ({exc}); using the pinned list "
                f"{', '.join(PINNED[distribution])}",
                file=sys.stderr,
            )
            versions = PINNED[distribution]
    chosen = matrix_releases(versions) or PINNED[distribution]
    return chosen[-1:] if newest_only else chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpprobe.card.releases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--distribution", default="pytorch-lightning", choices=sorted(PINNED))
    parser.add_argument("--newest", action="store_true", help="only the newest release")
    args = parser.parse_args(argv)
    print("\n".join(releases(args.distribution, newest_only=args.newest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
