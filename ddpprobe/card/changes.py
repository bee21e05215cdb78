"""Why a fact's verdict changes between Lightning releases: the Lightning change behind it, with its source.

The version matrix (:mod:`ddpprobe.card.matrix`) finds where each fact's verdict changes from one release to the
next; the reason is knowledge, kept here as data, one :class:`Change` per test function (every parametrised case
of it shares the reason). ``docs/matrix.md`` lists each fact that changes with the release where it changes and
this sentence; a fact that changes and has no entry is listed as not yet explained, so a new one shows.

Sources are Lightning's own: the CHANGELOG.md each release ships (``pytorch_lightning/CHANGELOG.md`` in the
wheel), with its pull-request or issue number, or the function whose code changed.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Change:
    """Why a fact's verdict changes between releases."""

    why: str  # the Lightning change, in a sentence
    source: str  # where it is recorded: a CHANGELOG entry and its PR/issue, or the changed function


#: ``{"tests/facts/<file>.py::<test function>": Change}``.
CHANGES: dict = {}


def change_of(nodeid: str):
    """The :class:`Change` of a test case's nodeid (its parametrisation dropped), None when not written yet."""
    return CHANGES.get(nodeid.split("[", 1)[0])
