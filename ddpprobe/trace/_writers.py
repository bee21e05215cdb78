"""Where the user's code last set each attribute of the module and the datamodule: ``{"module.attr.<name>":
"file.py:42 in on_train_start"}``, the paths of the DDP contract's records (ddpprobe/contract/_state.py), so a
contract break of an attribute names the line that wrote it.

:class:`AttributeWriters` wraps ``__setattr__`` of the object's class while installed and notes a set on that very
object whose caller chain holds the user's code (``CallClassifier.user_code``), with the hook running. What the
object's ``__init__`` set before the wrapper was installed, and in-place changes (``self.total += x`` on a tensor,
``self.rows.append(...)``), are not seen: ``+=`` on a number or a list does call ``__setattr__`` and is seen.
"""

from __future__ import annotations

import sys
from typing import Callable

_ABSENT = object()


class AttributeWriters:
    """Note the user's line that last set each attribute of the watched objects.

    Args:
        user_code: ``frame -> the user's frame or None``.
        hook: ``() -> the hook running`` (the module's ``_current_fx_name``).
    """

    def __init__(self, user_code: Callable, hook: Callable):
        self.user_code, self.hook = user_code, hook
        self.last: dict = {}
        self._restore: list = []

    def watch(self, obj, prefix: str) -> None:
        """Note sets of ``obj``'s attributes as ``"<prefix>.attr.<name>"``; ``obj`` None is ignored."""
        if obj is None:
            return
        from ddpprobe.trace._classify import call_site_of

        cls = type(obj)
        own = cls.__dict__.get("__setattr__", _ABSENT)
        inherited = cls.__setattr__
        notes = self

        def __setattr__(self, name, value):
            inherited(self, name, value)
            if self is obj and not name.startswith("_"):
                user = notes.user_code(sys._getframe(1))
                if user is not None:
                    site, hook = call_site_of(user), notes.hook()
                    inside = hook and not site.endswith(f" in {hook}")
                    notes.last[f"{prefix}.attr.{name}"] = site + (f" (in {hook})" if inside else "")

        cls.__setattr__ = __setattr__
        self._restore.append((cls, own))

    def unwatch(self) -> None:
        """Put every wrapped class's ``__setattr__`` back."""
        for cls, own in reversed(self._restore):
            if own is _ABSENT:
                del cls.__setattr__
            else:
                cls.__setattr__ = own
        self._restore = []
