"""Which pytorch-lightning releases a fact applies to.

Facts about an API that changed between releases declare the range they apply to::

    from ddpprobe.versions import requires_lightning

    @requires_lightning("<2.0")
    def test_validation_epoch_end_receives_only_the_ranks_own_outputs(run_world): ...

Outside the range the fact is skipped with a reason that names both sides
("applies to pytorch-lightning <2.0; installed 2.6.6"), so the semantics card and the version matrix
show it as *not applicable* on that release rather than as a failure.

The version matrix itself (which facts hold on which release) is ``ddpprobe/card/matrix.py``.
"""

from __future__ import annotations

import importlib.metadata
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

#: The distribution whose version ranges refer to (the ``pytorch_lightning`` import package).
DISTRIBUTION = "pytorch-lightning"


# ---------------------------------------------------------------------------------------------
# Version ranges of facts
# ---------------------------------------------------------------------------------------------


def installed_lightning() -> Optional[str]:
    """The installed version of the chosen Lightning package (``"2.6.6"``; ``ddpprobe._lightning.version``:
    pytorch-lightning, or lightning with ``--lightning lightning``), or None if it is not installed.

    Read from the distribution's metadata, so Lightning is not imported.
    """
    from ddpprobe import _lightning

    return _lightning.version()


def lightning_in(spec: str, installed: Optional[str] = None) -> bool:
    """Whether ``installed`` (default: :func:`installed_lightning`) lies in ``spec``
    (``ddpprobe.runif.lightning_in``).

    Raises:
        ValueError: ``spec`` is not a version range, or no version was given and none is installed.
    """
    from ddpprobe import runif

    return runif.lightning_in(spec, installed if installed is not None else installed_lightning())


def requires_lightning(spec: str):
    """``ddpprobe.runif.run_if(lightning=spec)``: run the fact only on Lightning releases in ``spec``.

    Kept for the README's version-matrix example; the skip reason reads ``"applies to pytorch-lightning
    >=2.0; installed 1.9.5"``.
    """
    from ddpprobe.runif import run_if

    return run_if(lightning=spec)
