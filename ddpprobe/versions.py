"""Which Lightning releases a fact applies to: thin aliases of the skip vocabulary (``ddpprobe.runif``).

A fact about an API that changed between releases declares the range it applies to with
``run_if(lightning=...)``; ``requires_lightning(spec)`` is the same marker under its older name::

    from ddpprobe.runif import run_if

    @run_if(lightning="<2.0")
    def test_validation_epoch_end_receives_only_the_ranks_own_outputs(run_world): ...

Outside the range the fact is skipped with a reason that names both sides
("applies to pytorch-lightning <2.0; installed 2.6.6", or "lightning ..." with ``--lightning lightning``),
so the semantics card and the version matrix show it as *not applicable* on that release rather than
as a failure. The version matrix itself (which facts hold on which release) is ``ddpprobe/card/matrix.py``.
"""

from __future__ import annotations

from typing import Optional

from ddpprobe import _lightning, runif


def installed_lightning() -> Optional[str]:
    """The installed version of the chosen Lightning package (``"2.6.6"``: pytorch-lightning, or lightning
    with ``--lightning lightning``), or None if it is not installed (``ddpprobe._lightning.version``).

    Read from the distribution's metadata, so Lightning is not imported.
    """
    return _lightning.version()


def lightning_in(spec: str, installed: Optional[str] = None) -> bool:
    """Whether ``installed`` (default: :func:`installed_lightning`) lies in the PEP 440 range ``spec``
    (``ddpprobe.runif.lightning_in``).

    Raises:
        ValueError: ``spec`` is not a version range, or no version was given and none is installed.
    """
    return runif.lightning_in(spec, installed if installed is not None else installed_lightning())


def requires_lightning(spec: str):
    """``ddpprobe.runif.run_if(lightning=spec)``: run the fact only on Lightning releases in ``spec``."""
    return runif.run_if(lightning=spec)
