"""Where a Python-level collective comes from: the frames of the user's code and of the libraries
(torch, torchmetrics, Lightning, ddpprobe, the standard library), and the fields of the trace's
``collective`` event that name it (``source``, ``key``, ``metric``, ``hook``, ``call_site``, ``origin``)."""

from __future__ import annotations

import os
import sysconfig
from typing import Optional

import torch

from ddpprobe._lightning import fabric, pl

#: Names that read the rank (attributes or functions): a ``self.log`` call whose function uses one of them
#: may log a value that depends on the rank (``log`` events' ``reads_rank``).
RANK_NAMES = frozenset({"global_rank", "local_rank", "node_rank", "get_rank", "rank"})


def _library_dirs() -> tuple:
    import lightning_utilities
    import torchmetrics

    dirs = {os.path.dirname(m.__file__) for m in (torch, torchmetrics, lightning_utilities, pl, fabric)}
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
        loops = pl.loops.loop
        self._loop_types = tuple(
            t for t in (pl.Trainer, getattr(loops, "_Loop", None), getattr(loops, "Loop", None)) if t
        )
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

    def context(self, frame, loops_are_library: bool = False) -> dict:
        """``{"source", "key", "sync", "metric", "states", "state_sizes", "hook", "running", "call_site",
        "origin"}`` of the collective called from ``frame`` (the caller of the ``torch.distributed``
        function): ``sync`` is ``"epoch"`` for a logged key's sync at ``compute()``, ``"step"`` for its
        step sync; ``state_sizes`` each Metric state's size at the sync; ``running`` the hook running.

        With ``loops_are_library``, a collective reached from the user's code only through the Trainer or
        one of its loops (``trainer.fit(...)`` in the user's script, then Lightning's own broadcast or a
        sync at the epoch end) has no call site of its own (a synced key gets the line that logged it),
        so it is ``"library"`` where no key or metric names it, not ``"user"``; the walk up the stack
        stops at that loop."""
        from torchmetrics import Metric

        key = hook = metric = states = sync = state_sizes = None
        source = None
        through_loop = reached_user = False
        f = frame
        while f is not None:
            reached_user = reached_user or not f.f_code.co_filename.startswith((*self.library, "<"))
            owner = f.f_locals.get("self")
            if owner is not None:
                kind = type(owner).__name__
                if loops_are_library and not reached_user and isinstance(owner, self._loop_types):
                    through_loop = True
                    break
                if kind == "_ResultMetric" and key is None:
                    key, hook = owner.meta.name, owner.meta.fx
                    sync = "epoch" if f.f_code.co_name == "compute" else "step"
                    source = source or "self.log"
                elif isinstance(owner, Metric) and metric is None and kind != "_ResultMetric":
                    metric, states = type(owner).__name__, list(getattr(owner, "_defaults", {}))
                    state_sizes = {name: _state_size(getattr(owner, name, None)) for name in states}
                    source = "torchmetrics"
            f = f.f_back
        call_site = None if through_loop else self.user_frame(frame)
        code = frame.f_code
        parts = code.co_filename.replace(os.sep, "/").split("/")
        tail = parts[-3:] if "site-packages" not in parts else parts[parts.index("site-packages") + 1 :]
        origin = f"{'/'.join(tail)}:{frame.f_lineno} in {code.co_name}"
        if call_site is None and key is not None:  # a logged value synced by the loop: where it was logged
            call_site = self.log_sites.get((key, hook))
        if source is None:
            source = "user" if call_site else "library"
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
        }


def _state_size(value) -> Optional[str]:
    """A ``Metric`` state's size in words: ``"list of 3"`` or ``"tensor [2]"``."""
    if isinstance(value, list):
        return f"list of {len(value)}"
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}"
    return None
