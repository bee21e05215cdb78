"""Where a field that breaks was last written: the user's line that last set it, where the guard can see the set,
else the hooks each rank ran between the last check where it was equal and the check where it differs.

What the guard sees (one :class:`Writers` per guard, reset at each stage's start):

- **module and datamodule attributes**: every set of an attribute from the user's code, through the trace's
  :class:`~ddpprobe.trace._writers.AttributeWriters` (the audit's writer records, the same paths:
  ``"module.attr.noise_std"``);
- **optimizer settings**: every set of a param group's key (``group["lr"] /= 2``), the group dicts of each optimizer
  replaced by a ``dict`` subclass that notes its sets (:class:`_WatchedGroup`; ``"optimizer[0].group[0].lr"``). A set
  torch's scheduler or Lightning's loop makes is noted as no line of the user's (Lightning's loop lies between);
- **hooks**: each hook of the user's code and each callback hook Lightning runs (pytorch_lightning/trainer/call.py
  ``_call_lightning_module_hook``, ``_call_callback_hooks``, ``_call_lightning_datamodule_hook``,
  ``_call_strategy_hook`` for the ``*_step`` methods), by its last run, so the hooks that ran since a check are
  known without keeping a log that grows with the run.

After each check that compared state and passed, every compared field notes that check as its last equal one
(:meth:`Writers.passed`). Only when the ranks' digests differ does a rank add what it saw to its record
(:meth:`Writers.annotate`), and :func:`lines` words the ranks' records under each differing field.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Optional

from ddpprobe.trace import call_site_of
from ddpprobe.trace._writers import AttributeWriters

#: Hooks of Lightning's own callbacks that only display (the progress bars', the model summary's): no state.
_DISPLAY_ONLY = ("ProgressBar", "ModelSummary", "RichModelSummary")


class _WatchedGroup(dict):
    """An optimizer's param group that notes each set of one of its keys (``group["lr"] = ...``, ``/=``,
    ``update``, ``setdefault``) as ``"<path>.<key>"``. A plain ``dict`` in every other respect: torch's optimizers
    and schedulers read and write it as before, and ``state_dict()`` copies it into a plain dict."""

    _path = ""
    _writers = None

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if self._writers is not None:
            self._writers.note(f"{self._path}.{key}", sys._getframe(1))

    def update(self, *args, **kwargs):
        before = dict(self)
        super().update(*args, **kwargs)
        if self._writers is not None:
            for key in self:
                if key not in before or before[key] is not self[key]:
                    self._writers.note(f"{self._path}.{key}", sys._getframe(1))

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def __reduce_ex__(self, protocol):  # a copy or pickle is a plain dict, as torch makes it
        return (dict, (dict(self),))


class Writers:
    """What one rank saw written since its stage began (module docstring).

    Args:
        classifier: the guard's ``CallClassifier`` (which frames are the user's, which are Lightning's loops).
        module: the LightningModule (its ``_current_fx_name`` is the hook running).
    """

    def __init__(self, classifier, module):
        self.classifier = classifier
        self.module = module
        #: ``{field path: "file.py:12 in fn" or None}``: the last set seen, None where it was not the user's line.
        self.last: dict = {}
        #: ``{hook label: the sequence number of its last run}``.
        self.ran: dict = {}
        self.seq = 0
        #: ``{field path: (check number, hook sequence number then, the check in words)}`` of its last equal check.
        self.equal_at: dict = {}
        self._attributes = AttributeWriters(self._user_line, self._running)
        self._attributes.last = self.last
        self._watched: list = []
        self._groups: list = []

    # -- what is watched -----------------------------------------------------------------------------------

    def watch(self, trainer) -> None:
        """Watch the module's and the datamodule's attributes (once) and every optimizer's param groups (again at
        each call: ``load_state_dict`` replaces the groups)."""
        if not self._watched:
            self._attributes.watch(self.module, "module")
            self._attributes.watch(getattr(trainer, "datamodule", None), "datamodule")
            self._watched.append(True)
        for i, optimizer in enumerate(getattr(trainer, "optimizers", None) or []):
            inner = getattr(optimizer, "optimizer", optimizer)
            groups = getattr(inner, "param_groups", None)
            if not isinstance(groups, list):
                continue
            for j, group in enumerate(groups):
                if isinstance(group, _WatchedGroup) and group._writers is self:
                    continue
                watched = _WatchedGroup(group)
                watched._path, watched._writers = f"optimizer[{i}].group[{j}]", self
                groups[j] = watched
                self._groups.append(watched)

    def unwatch(self) -> None:
        """Put the watched classes' ``__setattr__`` back; the watched groups stay dicts that note nothing."""
        self._attributes.unwatch()
        for group in self._groups:
            group._writers = None
        self._groups = []
        self._watched = []

    def _running(self) -> Optional[str]:
        return getattr(self.module, "_current_fx_name", None)

    def _user_line(self, frame):
        """The innermost frame of the user's code at or above ``frame``, or None where a frame of Lightning's loops
        or Trainer lies between (a set Lightning or a scheduler it steps made, under the user's ``trainer.fit``)."""
        loops = self.classifier._loop_types
        while frame is not None:
            if self.classifier._is_user(frame):
                return frame
            if isinstance(frame.f_locals.get("self"), loops):
                return None
            frame = frame.f_back
        return None

    def note(self, path: str, frame) -> None:
        """A set of ``path`` from ``frame``: its user's line, or None where it was not the user's."""
        user = self._user_line(frame)
        if user is None:
            self.last[path] = None
            return
        site, hook = call_site_of(user), self._running()
        inside = hook and not site.endswith(f" in {hook}")
        self.last[path] = site + (f" (in {hook})" if inside else "")

    def hook(self, label: str) -> None:
        self.seq += 1
        self.ran[label] = self.seq

    # -- checks ----------------------------------------------------------------------------------------------

    def passed(self, n: int, record: dict) -> None:
        """The check ``n`` that compared ``record``'s fields passed: each is equal there."""
        at = (n, self.seq, f"check #{n}, {record['hook']} (epoch {record['epoch']}, step {record['step']})")
        for path in record["fields"]:
            self.equal_at[path] = at

    def annotate(self, entry: dict) -> None:
        """Add to a state-bearing ``entry``'s record what this rank saw (only sent when the digests differ):
        ``written_at`` (the last set of each field, where seen), ``equal_at`` (each field's last equal check, as
        ``[check number, hook sequence number, words]``) and ``hooks`` (``[label, sequence number of its last run]``
        in the order they last ran)."""
        record = entry.get("record")
        if not record:
            return
        fields = record["fields"]
        record["written_at"] = {p: self.last[p] for p in fields if p in self.last}
        record["equal_at"] = {p: list(self.equal_at[p]) for p in fields if p in self.equal_at}
        record["hooks"] = sorted(([label, s] for label, s in self.ran.items()), key=lambda pair: pair[1])


def lines(field: str, records: list) -> list:
    """The lines under ``field`` in a ``StateDiverged``, from the ranks' annotated records (rank order): where the
    user's code last set it (on the ranks where the guard saw a set), else the hooks each rank ran since the last
    check where it was equal (or since the stage began), those only some ranks ran named with their ranks."""
    sites = [(r.get("written_at") or {}).get(field) for r in records]
    if any(sites):
        if len(set(sites)) == 1:
            return [f"    last set at {sites[0]} on every rank"]
        parts = [f"rank {r} at {s}" if s else f"rank {r} not by code the guard saw" for r, s in enumerate(sites)]
        return ["    last set: " + ", ".join(parts)]
    since = [(r.get("equal_at") or {}).get(field) for r in records]
    ran = []
    for record, at in zip(records, since):
        after = at[1] if at else 0
        ran.append([label for label, s in record.get("hooks") or [] if s > after])
    if not any(ran):
        return []
    every = [label for label in ran[0] if all(label in r for r in ran)]
    some = {}
    for rank, labels in enumerate(ran):
        for label in labels:
            if label not in every:
                some.setdefault(label, []).append(rank)
    start = f"since it was equal at {since[0][2]}" if since[0] else "since the stage began (never compared before)"
    text = f"    no set of it by your code seen; {start} the ranks ran: " + (", ".join(every) or "none alike")
    if some:
        text += "; only " + "; ".join(f"rank(s) {ranks} ran {label}" for label, ranks in some.items())
    return [text]


def first_site(field: str, records: list) -> Optional[tuple]:
    """``(rank, "file.py:12 in fn")`` of the lowest rank whose user's code last set ``field``, or None."""
    for rank, record in enumerate(records):
        site = (record.get("written_at") or {}).get(field)
        if site:
            return rank, site
    return None


# -- the hooks Lightning runs ----------------------------------------------------------------------------------

_LABELS: dict = {}
_PATCHED: list = []


def _is_library_code(code, classifier) -> bool:
    return code.co_filename.startswith((*classifier.library, "<"))


def _label(owner, hook_name: str, classifier, user_only: bool) -> Optional[str]:
    """``"LitClassifier.on_train_epoch_start (m.py:24)"`` of ``owner``'s ``hook_name`` where its class defines it
    (the user's code only where ``user_only``; never a display-only callback of Lightning's), else None. Cached
    per class and hook."""
    key = (type(owner), hook_name, user_only)
    if key in _LABELS:
        return _LABELS[key]
    label = None
    function = getattr(type(owner), hook_name, None)
    code = getattr(function, "__code__", None)
    if code is not None:
        library = _is_library_code(code, classifier)
        base = any(getattr(vars(c).get(hook_name), "__code__", None) is code for c in _bases())
        display = any(c.__name__.endswith(_DISPLAY_ONLY) for c in type(owner).__mro__)
        if not base and not display and not (user_only and library):
            where = "" if library else f" ({call_site_of_code(code)})"
            label = f"{type(owner).__name__}.{hook_name}{where}"
    _LABELS[key] = label
    return label


def call_site_of_code(code) -> str:
    """``"m.py:24"``: the file and first line of a function's code."""
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _bases() -> tuple:
    from ddpprobe._lightning import pl

    return (pl.LightningModule, pl.LightningDataModule, pl.Callback)


def _writers_of(trainer) -> Optional[Writers]:
    for callback in getattr(trainer, "callbacks", None) or ():
        writers = getattr(callback, "_writers", None)
        if isinstance(writers, Writers):
            return writers
    return None


def _wrap(original, owner: str):
    @functools.wraps(original)
    def run(trainer, hook_name, *args, **kwargs):
        writers = _writers_of(trainer)
        if writers is not None:
            try:
                _note_hook(writers, trainer, owner, hook_name, kwargs)
            except Exception:  # noqa: BLE001 - a note only: the hook runs whatever happens here
                pass
        return original(trainer, hook_name, *args, **kwargs)

    return run


def _note_hook(writers: Writers, trainer, owner: str, hook_name: str, kwargs: dict) -> None:
    classifier = writers.classifier
    if owner == "module":
        target = kwargs.get("pl_module") or trainer.lightning_module
        label = _label(target, hook_name, classifier, user_only=True)
        if label:
            writers.hook(label)
    elif owner == "strategy":
        if hook_name.endswith("_step"):
            label = _label(trainer.lightning_module, hook_name, classifier, user_only=True)
            if label:
                writers.hook(label)
    elif owner == "datamodule":
        label = _label(trainer.datamodule, hook_name, classifier, user_only=True)
        if label:
            writers.hook(label)
    else:
        from ddpprobe.guard._callback import CollectiveGuard

        for callback in trainer.callbacks:
            if isinstance(callback, CollectiveGuard):
                continue
            label = _label(callback, hook_name, classifier, user_only=False)
            if label:
                writers.hook(label)


_RUNNERS = {
    "_call_lightning_module_hook": "module",
    "_call_lightning_datamodule_hook": "datamodule",
    "_call_callback_hooks": "callbacks",
    "_call_strategy_hook": "strategy",
}


def patch_hook_runners() -> None:
    """Wrap Lightning's hook runners (pytorch_lightning/trainer/call.py) once per process: a Trainer holding a guard
    with a session notes each hook of the user's code and each callback hook; any other passes through unchanged.
    Left installed for the life of the process."""
    if _PATCHED:
        return
    _PATCHED.append(True)
    from ddpprobe._lightning import pl

    try:
        module = importlib.import_module(f"{pl.__name__}.trainer.call")
    except ImportError:
        return
    for name, owner in _RUNNERS.items():
        original = getattr(module, name, None)
        if original is not None:
            setattr(module, name, _wrap(original, owner))
