"""Where a Python-level collective comes from: the frames of the user's code and of the libraries
(torch, torchmetrics, Lightning, ddpprobe, the standard library), and the fields of the trace's
``collective`` event that name it (``source``, ``key``, ``metric``, ``hook``, ``call_site``, ``origin``)."""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Optional

import torch

from ddpprobe import _lightning

#: Names that read the rank (attributes or functions): a ``self.log`` call whose function uses one of them
#: may log a value that depends on the rank (``log`` events' ``reads_rank``).
RANK_NAMES = frozenset({"global_rank", "local_rank", "node_rank", "get_rank", "rank"})


def _library_dirs() -> tuple:
    import lightning_utilities
    import torchmetrics

    dirs = {
        os.path.dirname(m.__file__)
        for m in (torch, torchmetrics, lightning_utilities, _lightning.pl, _lightning.fabric)
    }
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ddpprobe itself
    for name in ("stdlib", "platstdlib"):
        dirs.add(sysconfig.get_paths()[name])
    return tuple(d + os.sep for d in dirs)


def call_site_of(frame) -> Optional[str]:
    """``"file.py:42 in validation_step"``: where ``frame`` is (its file's name, line and function), or None."""
    if frame is None:
        return None
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


class CallClassifier:
    """Where a Python-level collective of a Lightning run comes from: the trace's ``source``, ``key``,
    ``metric``, ``states``, ``hook``, ``call_site`` and ``origin`` fields (see the module docstring).

    Shared by :class:`CollectiveTrace` and ``ddpprobe.guard.CollectiveGuard``, so both name a collective
    alike.

    Args:
        model: the LightningModule whose ``_current_fx_name`` is the hook of a collective no key names.
    """

    def __init__(self, model):
        self.model = model
        self.library = _library_dirs()
        loops = _lightning.pl.loops.loop
        self._loop_types = tuple(
            t for t in (_lightning.pl.Trainer, getattr(loops, "_Loop", None), getattr(loops, "Loop", None)) if t
        )
        self._own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # ddpprobe's wrappers
        #: ``(key, hook) -> call_site`` of the latest ``self.log`` call of each key (:meth:`note_log`).
        self.log_sites: dict = {}

    def note_log(self, key: str, hook: Optional[str], call_site: Optional[str]) -> None:
        """Remember where ``key`` was last logged from in ``hook``: a sync Lightning makes later, in its
        loop, is placed there."""
        self.log_sites[(key, hook)] = call_site

    def user_code(self, frame):
        """The innermost frame at or above ``frame`` of the user's code (outside torch, torchmetrics,
        Lightning, ddpprobe and the standard library), or None if there is none."""
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith(self.library) and not filename.startswith("<"):
                return frame
            frame = frame.f_back
        return None

    def user_frame(self, frame) -> Optional[str]:
        """``"file.py:42 in validation_step"`` of :meth:`user_code`, or None."""
        return call_site_of(self.user_code(frame))

    def context(self, frame, op: Optional[str] = None) -> dict:
        """``{"source", "key", "sync", "metric", "states", "state_sizes", "hook", "running", "call_site",
        "origin", "call", "call_kind", "loop_step", "callback"}`` of the collective ``op`` called from ``frame`` (the
        caller of the ``torch.distributed`` function): ``sync`` is ``"epoch"`` for a logged key's sync at
        ``compute()``, ``"step"`` for its step sync; ``state_sizes`` each Metric state's size at the sync;
        ``running`` the hook running; ``call``, ``call_kind`` and ``loop_step`` the call chain
        (:meth:`chain`).

        A collective Lightning makes on its own (:meth:`chain`: through one of its loops, or through
        ``trainer.fit(...)`` / ``validate`` / ``test`` / ``predict`` in the user's script) has no call site
        of its own (a synced key gets the line that logged it), so it is ``"library"`` where no key or
        metric names it, not ``"user"``; the walk for its key stops at that loop."""
        from torchmetrics import Metric

        chain = self.chain(frame, op)
        key = hook = metric = states = sync = state_sizes = None
        source = None
        for f in chain.pop("_walk"):
            owner = f.f_locals.get("self")
            if owner is not None:
                kind = type(owner).__name__
                if kind == "_ResultMetric" and key is None:
                    key, hook = owner.meta.name, owner.meta.fx
                    sync = "epoch" if f.f_code.co_name == "compute" else "step"
                    source = source or "self.log"
                elif isinstance(owner, Metric) and metric is None and kind != "_ResultMetric":
                    metric, states = type(owner).__name__, list(getattr(owner, "_defaults", {}))
                    state_sizes = {name: _state_size(getattr(owner, name, None)) for name in states}
                    source = "torchmetrics"
        call_site = call_site_of(chain.pop("_user"))
        origin = None
        if frame is not None:  # None: called from C++ with no Python frame (a comm hook in an autograd thread)
            code = frame.f_code
            parts = code.co_filename.replace(os.sep, "/").split("/")
            tail = parts[-3:] if "site-packages" not in parts else parts[parts.index("site-packages") + 1 :]
            origin = f"{'/'.join(tail)}:{frame.f_lineno} in {code.co_name}"
        if call_site is None and key is not None:  # a logged value synced by the loop: where it was logged
            call_site = self.log_sites.get((key, hook))
        if source is None:
            source = "user" if chain["call"] and not chain["loop_step"] else "library"
        running = getattr(self.model, "_current_fx_name", None)
        return {
            "source": source,
            "key": key,
            "sync": sync,
            "metric": metric,
            "states": states,
            "state_sizes": state_sizes,
            "hook": hook if hook is not None else running,
            "running": running,
            "call_site": call_site,
            "origin": origin,
            **chain,
        }

    def chain(self, frame, op: Optional[str] = None) -> dict:
        """The call chain of the collective ``op`` called from ``frame``: ``{"call", "call_kind",
        "loop_step"}`` (and, for :meth:`context`, the frames to search for a key and the user's frame).

        Walking out from ``frame``: the first frame of the user's code is the *user's frame*; the library
        frames inside it (ddpprobe's own wrappers left out) end in the *entry*, the library call the user's
        line made. ``call`` is the entry's public name (:func:`public_name`: ``"Trainer.callback_metrics"``,
        ``"MeanMetric.compute"``, ``"DDPStrategy.barrier"``, ``"LightningModule.log"``), or
        ``"torch.distributed.<op>"`` where the user's line calls ``torch.distributed`` itself; ``call_kind``
        ``"property"``, ``"method"`` or ``"function"``. A collective Lightning makes on its own (a frame of
        one of its loops lies between, or the entry is ``Trainer.fit`` / ``validate`` / ``test`` /
        ``predict``, or no user's frame exists) has ``call`` None and ``loop_step`` the innermost loop or
        ``Trainer`` frame inside the user's: ``"_EvaluationLoop.run"``, ``"Trainer._run"`` (None where there
        is none)."""
        frames = []
        f = frame
        while f is not None:
            frames.append(f)
            f = f.f_back
        user = next((i for i, f in enumerate(frames) if self._is_user(f)), None)
        inner = frames if user is None else frames[:user]
        steps = [i for i, f in enumerate(inner) if isinstance(f.f_locals.get("self"), self._loop_types)]
        loops = [i for i in steps if not isinstance(inner[i].f_locals.get("self"), _lightning.pl.Trainer)]
        calls = [f for f in inner if not f.f_code.co_filename.startswith(self._own)]
        entry = calls[-1] if calls else None
        stage_entry = (
            entry is not None
            and isinstance(entry.f_locals.get("self"), _lightning.pl.Trainer)
            and entry.f_code.co_name in _STAGE_ENTRIES
        )
        if user is None or loops or stage_entry:
            first = (loops or steps or [None])[0]
            step = None if first is None else _qualified(inner[first])
            walk = inner[: loops[0]] if loops else frames
            callback, call, kind = self._callback_call(walk, op)
            return {
                "call": call,
                "call_kind": kind,
                "loop_step": step,
                "callback": callback,
                "_walk": walk,
                "_user": None,
            }
        if entry is None:
            call, kind = (f"torch.distributed.{op}", "function") if op else (None, None)
        else:
            call, kind = public_name(entry, self._is_library)
        owner = frames[user].f_locals.get("self")
        callback = _qualified(frames[user]) if isinstance(owner, _lightning.pl.Callback) else None
        return {
            "call": call,
            "call_kind": kind,
            "loop_step": None,
            "callback": callback,
            "_walk": frames,
            "_user": frames[user],
        }

    def _callback_call(self, walk: list, op: Optional[str]) -> tuple:
        """``(callback, call, call_kind)`` of a collective made inside a library ``Callback``'s hook that a loop
        ran (``walk``: the frames inside the innermost loop frame, innermost first): the outermost frame whose
        ``self`` is a ``Callback`` (not ddpprobe's own) is the hook, ``"TQDMProgressBar.on_train_epoch_end"``
        (the instance's class); the outermost frame inside it that is not the callback's own is the public call
        it made (``"Trainer.progress_bar_metrics"``, a property), or ``torch.distributed.<op>`` where the
        callback calls torch itself. ``(None, None, None)`` where no callback's hook is in the chain."""
        hooks = [
            i
            for i, f in enumerate(walk)
            if isinstance(f.f_locals.get("self"), _lightning.pl.Callback)
            and not f.f_code.co_filename.startswith(self._own)
        ]
        if not hooks:
            return None, None, None
        hook = walk[hooks[-1]]
        owner = hook.f_locals["self"]
        inside = [
            f
            for f in walk[: hooks[-1]]
            if f.f_locals.get("self") is not owner and not f.f_code.co_filename.startswith(self._own)
        ]
        if inside:
            call, kind = public_name(inside[-1], self._is_library)
        else:
            call, kind = (f"torch.distributed.{op}", "function") if op else (None, None)
        return _qualified(hook), call, kind

    def _is_user(self, frame) -> bool:
        return not frame.f_code.co_filename.startswith((*self.library, "<"))

    def _is_library(self, cls) -> bool:
        module = sys.modules.get(getattr(cls, "__module__", ""), None)
        path = getattr(module, "__file__", None)
        return path is not None and path.startswith(self.library)


#: ``Trainer`` methods that run a stage's loops: a collective under one, from the user's script, is Lightning's.
_STAGE_ENTRIES = frozenset({"fit", "validate", "test", "predict"})


def _qualified(frame) -> str:
    """``"ClassName.method"`` of a frame whose ``self`` is set."""
    return f"{type(frame.f_locals['self']).__name__}.{frame.f_code.co_name}"


def public_name(frame, is_library=None) -> tuple:
    """``(name, kind)`` of the function running in ``frame`` as its library names it: ``kind`` is
    ``"property"`` (``("Trainer.callback_metrics", "property")``), ``"method"`` (``"DDPStrategy.barrier"``;
    an instance attribute wrapping a method, as torchmetrics wraps ``compute``, by the attribute's name:
    ``"MeanMetric.compute"``; a method a user's subclass inherits by the library class that defines it:
    ``"LightningModule.log"``) or ``"function"`` (``"lightning_fabric.utilities.distributed._sync_ddp"``).
    ``is_library(cls)`` says whether a class is library code (default: every class is)."""
    code = frame.f_code
    name = code.co_name
    owner = frame.f_locals.get("self")
    if owner is None:
        return f"{frame.f_globals.get('__name__', '?')}.{name}", "function"
    for attr, value in list(getattr(owner, "__dict__", {}).items()):
        if getattr(value, "__code__", None) is code:
            name = attr
            break
    is_library = is_library or (lambda cls: True)
    defining = [c for c in type(owner).__mro__ if name in vars(c)]
    library = [c for c in defining if is_library(c)]
    public = [c for c in library if not c.__name__.startswith("_")]
    shown = type(owner) if type(owner) in public else (public or library or defining or [type(owner)])[0]
    attribute = vars(defining[0]).get(name) if defining else None
    return f"{shown.__name__}.{name}", "property" if isinstance(attribute, property) else "method"


def _state_size(value) -> Optional[str]:
    """A ``Metric`` state's size in words: ``"list of 3"`` or ``"tensor [2]"``."""
    if isinstance(value, list):
        return f"list of {len(value)}"
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}"
    return None
