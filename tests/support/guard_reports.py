"""Run a guarded script of tests/support/guard_forms/ on a rank and keep what the rank would print for the guard
error it raises when nobody catches it (ddpprobe/guard/_errors.py ``report``: the message, then the line it was
raised under), so a test reads the printed report of every rank from the world's records."""

import importlib

from ddpprobe.guard import GuardError
from ddpprobe.guard._errors import report


def reported(info, module: str, **params) -> dict:
    """``{"type", "message", "report"}`` of the guard error ``module``'s ``train(info, **params)`` raised on this
    rank (``module`` a name under tests.support.guard_forms), or ``{"type": None}`` where it raised none."""
    train = importlib.import_module(f"tests.support.guard_forms.{module}").train
    try:
        train(info, **params)
    except GuardError as exc:
        return {"type": type(exc).__name__, "message": str(exc), "report": report(exc, exc.__traceback__)}
    return {"type": None}
