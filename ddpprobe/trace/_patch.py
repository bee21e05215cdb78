"""The one patch of ``torch.distributed`` that the trace and the guard share.

Each Python-level collective function (:data:`COLLECTIVES`) is replaced by one wrapper while at least one
listener is attached (:func:`attach`); the wrapper tells every attached listener about the call, in the
order they were attached, before and after it enters the backend. A collective called from inside another
(``all_gather_object`` calls ``all_gather``), or from a listener, is not reported again.

Every public alias of a wrapped function is wrapped too: ``torch.distributed.distributed_c10d.all_reduce``, and a
name bound to the original in any loaded module before the patch (``from torch.distributed import all_reduce`` at
the top of the user's script, ``legacy_allreduce`` in torch's own modules): :func:`attach` rebinds each global that
holds an original to its wrapper (one pass over ``sys.modules``, about 50 ms).

Restore rule: the originals are put back when the last listener is detached (:func:`detach`), each only
where ``torch.distributed`` (or the module holding an alias) still holds this module's wrapper; where another
patch replaced it since, that patch is left in place, and this wrapper, with no listener, passes every call
through unchanged.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Optional

import torch
import torch.distributed

#: ``torch.distributed`` functions the patch wraps while a listener (the trace, the guard) is attached.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "monitored_barrier",
)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _contributed(op: str, args, kwargs):
    """``(dtype, shape)`` of the tensor this rank contributes to the collective."""
    if op == "barrier" or op == "monitored_barrier":
        return None, None
    if op.endswith("_object") or op.endswith("_object_list"):
        return "object", None
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    if op in ("all_gather", "gather") and len(tensors) >= 1:
        tensor = tensors[0]
    elif op in ("all_gather_into_tensor", "reduce_scatter_tensor") and len(tensors) >= 2:
        tensor = tensors[1]
    elif tensors:
        tensor = tensors[0]
    else:
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        tensor = lists[-1][0] if lists else None
    if tensor is None:
        return None, None
    return _dtype_name(tensor.dtype), list(tensor.shape)


def _reduce_op(args, kwargs) -> Optional[str]:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.distributed.ReduceOp.RedOpType):
            return value.name
        if type(value).__name__ == "ReduceOp":
            return str(value).rsplit(".", 1)[-1]
    return None


def collective_fields(op: str, args, kwargs) -> dict:
    """``{"op", "reduce_op", "dtype", "shape"}`` of a call of the ``torch.distributed`` function ``op`` with
    ``args``/``kwargs``, as the trace's ``collective`` event and the guard's entry name them."""
    dtype, shape = _contributed(op, args, kwargs)
    return {"op": op, "reduce_op": _reduce_op(args, kwargs), "dtype": dtype, "shape": shape}


def pg_seq() -> Optional[int]:
    """The default process group's sequence number: how many collectives the backend has run on it (the
    Flight Recorder's ``collective_seq_id``); None where this backend or release does not say."""
    try:
        return int(torch.distributed.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - not every backend or release has it
        return None


class Call:
    """One call of a wrapped ``torch.distributed`` function, as the listeners see it.

    Attributes:
        name: the function's name (``"all_reduce"``).
        original: the function the patch wraps (what runs the collective).
        args, kwargs: the call's arguments.
        frame: the frame that called the ``torch.distributed`` function (None where C++ called it).
        fields: ``collective_fields(name, args, kwargs)``, computed once.
        extra: fields the caller knows better than the stack (a gradient bucket's ``source``, ``bucket``
            and ``comm_hook``, ddpprobe/trace/_gradients.py); listeners put them over what they classify.
    """

    __slots__ = ("name", "original", "args", "kwargs", "frame", "extra", "_fields")

    def __init__(self, name: str, original, args: tuple, kwargs: dict, frame, extra: Optional[dict] = None):
        self.name, self.original, self.args, self.kwargs, self.frame = name, original, args, kwargs, frame
        self.extra = extra or {}
        self._fields = None

    @property
    def fields(self) -> dict:
        if self._fields is None:
            self._fields = collective_fields(self.name, self.args, self.kwargs)
        return self._fields


class Listener:
    """What the patch calls around each collective; subclass and override either method."""

    def before(self, call: Call) -> None:
        """Called before ``call`` enters the backend; raising stops the call (the listeners attached earlier
        then get :meth:`after` with the error)."""

    def after(self, call: Call, error: Optional[BaseException]) -> None:
        """Called once the call returned (``error`` None) or raised ``error``."""


_listeners: list = []
_originals: dict = {}
_wrappers: dict = {}
#: ``[(module globals, name, collective)]``: the aliases :func:`_rebind_aliases` pointed at a wrapper.
_aliases: list = []
_local = threading.local()


def attach(listener: Listener) -> None:
    """Start telling ``listener`` about every collective of this process; patches ``torch.distributed`` when
    it is the first."""
    if listener in _listeners:
        return
    if not _listeners:
        for name in COLLECTIVES:
            original = getattr(torch.distributed, name, None)
            if original is None:
                continue
            if original is not _wrappers.get(name):  # not already ours (left in place under another patch)
                _originals[name] = original
                _wrappers[name] = _wrap(name, original)
            setattr(torch.distributed, name, _wrappers[name])
        _rebind_aliases()
    _listeners.append(listener)


def _rebind_aliases() -> None:
    """Point every global of a loaded module that holds an original collective at its wrapper (the module
    docstring: ``distributed_c10d.all_reduce``, a ``from torch.distributed import all_reduce`` made earlier)."""
    collective_of = {id(_originals[op]): op for op in _wrappers}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or namespace is vars(torch.distributed):
            continue
        for name, value in list(namespace.items()):
            op = collective_of.get(id(value))
            if op is not None and value is _originals[op]:
                namespace[name] = _wrappers[op]
                _aliases.append((namespace, name, op))


def detach(listener: Listener) -> None:
    """Stop telling ``listener``; when it was the last, restore the originals (the module docstring's rule)."""
    if listener in _listeners:
        _listeners.remove(listener)
    if _listeners:
        return
    for namespace, name, op in _aliases:
        if op in _wrappers and namespace.get(name) is _wrappers[op]:
            namespace[name] = _originals[op]
    _aliases.clear()
    for name, wrapper in list(_wrappers.items()):
        if getattr(torch.distributed, name, None) is wrapper:
            setattr(torch.distributed, name, _originals.pop(name))
            del _wrappers[name]


def attached() -> tuple:
    """The listeners attached now, in order."""
    return tuple(_listeners)


def run(call: Call, *args, **kwargs):
    """Run ``call.original(*args, **kwargs)`` with every attached listener told before and after, as the
    patch does for a ``torch.distributed`` function; collectives made inside it are not reported again.
    Used for collectives that do not pass through ``torch.distributed`` as one call (a DDP comm hook)."""
    if not _listeners or getattr(_local, "inside", False):
        return call.original(*args, **kwargs)
    entered = []
    _local.inside = True
    try:
        for listener in list(_listeners):
            listener.before(call)
            entered.append(listener)
        result = call.original(*args, **kwargs)
    except BaseException as exc:
        for listener in entered:
            listener.after(call, exc)
        raise
    finally:
        _local.inside = False
    for listener in entered:
        listener.after(call, None)
    return result


def caller_frame(depth: int = 2):
    """The frame ``depth`` levels up from the caller of this function, or None where C++ called in
    (an autograd thread running a comm hook has no Python frame above it)."""
    try:
        return sys._getframe(depth)
    except ValueError:
        return None


def _wrap(name: str, original):
    @functools.wraps(original)
    def collective(*args, **kwargs):
        if not _listeners or getattr(_local, "inside", False):
            return original(*args, **kwargs)
        return run(Call(name, original, args, kwargs, caller_frame()), *args, **kwargs)

    return collective
