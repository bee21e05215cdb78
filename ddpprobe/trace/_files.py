"""The files a rank's own code writes: which path, from which line and hook, and what the file held when closed.

:class:`FileWrites` wraps ``builtins.open`` (``io.open`` is the same function) while it is installed. An ``open`` of
a path (not a file descriptor) for writing (``"w"``, ``"a"``, ``"x"`` or ``"+"`` in its mode) whose caller chain
holds the user's code (``CallClassifier.user_code``: outside torch, Lightning, ddpprobe and the standard library,
and outside every installed package, so that Lightning's checkpoints written through fsspec are not the user's) is
noted; when that file is closed (or when the wrapper is uninstalled, for a file still open), ``write("file",
**fields)`` gets:

- ``path``: the absolute path the rank wrote;
- ``key``: the path as every rank of a real launch names it: the audit gives each rank a working directory of its
  own (``<world>/rank<r>``), so a path under any rank's folder of this world is written ``./<relative path>``
  (ranks launched together share one working directory, where ``preds.csv`` is one file; a folder rank 0 chose
  and broadcast, such as ``trainer.log_dir``, is under rank 0's folder on every rank), any other path as is;
- ``mode``, ``call_site`` (``"file.py:42 in on_test_epoch_end"``, the user's line), ``hook`` (the module's
  ``_current_fx_name`` at the ``open``);
- ``size`` (bytes), ``lines`` (newline characters) and ``sha1`` (hex) of what this rank wrote through that file
  object (what another rank wrote to the same path is not in it).

What a rank's code writes through Python's ``open`` is seen, as the name ``open`` (or ``io.open``) finds it at
the call, and what it saves with ``torch.save`` to a path (torch's C++ writer opens the file itself, so ``open``
never sees it): ``torch.save`` is wrapped while installed, and its event carries ``writer: "torch.save"``, the
file's ``size`` on disk, ``lines`` 0, ``sha1`` over the saved object's structure and tensors (:func:`saved_content`:
equal objects, equal digests, whatever the zip file's layout), and ``saved``: up to 20 ``[key, shape]`` pairs of a
dict (a ``state_dict``), so a file saved from the DDP wrap (keys prefixed ``module.``) shows it. Other C extensions
open files on their own, and a library that kept a reference to ``open`` from before the run (``numpy.savetxt``
through ``numpy.lib._datasource``) is not seen. What the
contract reads of a dataset (ddpprobe/contract/) is not the user's writing, even where ``__getitem__`` writes.

Reads only: the user's code gets the very file object ``open`` returned (its type, ``repr`` and ``isinstance``
checks unchanged); its ``write``, ``writelines`` and ``close`` are wrapped on the instance until it is closed. A
file the code never closes is held by those wrappers until the wrapper is uninstalled at the end of the stage,
then released as without the audit (its buffer is flushed then, not when the code dropped it).
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import re
import sys
from typing import Callable

#: Characters of a mode that make an ``open`` one for writing.
WRITE_MODES = set("wax+")


def path_key(path: str, cwd: str) -> str:
    """``path`` as every rank of a real launch names it: ``./<relative>`` under ``cwd`` or, where ``cwd`` is a rank's
    folder of a world (``<world>/rank<r>``), under any rank's folder of that world; else ``path`` itself."""
    cwd = os.path.abspath(cwd)
    roots = [cwd]
    if re.fullmatch(r"rank\d+", os.path.basename(cwd)):
        world = os.path.dirname(cwd)
        match = re.match(re.escape(os.path.join(world, "")) + r"(rank\d+)" + re.escape(os.sep), path)
        if match:
            roots.append(os.path.join(world, match.group(1)))
    for root in roots:
        if path.startswith(os.path.join(root, "")):
            return "./" + os.path.relpath(path, root)
    return path


#: Folders of installed packages: a frame there is a library's, whoever ``user_code`` counts as the user.
INSTALLED = ("site-packages", "dist-packages")


def _own_code(user_code: Callable) -> Callable:
    """``frame -> the innermost frame at or above it that ``user_code`` counts as the user's and that lies outside
    every installed package (``INSTALLED``), or None``: a file pandas or fsspec opens for the user's
    ``df.to_csv("preds.csv")`` is noted at the user's line, and one they open for Lightning (a checkpoint) not at
    all."""

    def find(frame):
        if _reading_for_the_contract(frame):
            return None
        while frame is not None:
            frame = user_code(frame)
            if frame is None:
                return None
            parts = frame.f_code.co_filename.replace(os.sep, "/").split("/")
            if not any(folder in parts for folder in INSTALLED):
                return frame
            frame = frame.f_back
        return None

    return find


_CONTRACT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "contract", "")


def _reading_for_the_contract(frame) -> bool:
    """The call runs under ddpprobe's contract records (a dataset's items read for its digest)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_CONTRACT):
            return True
        frame = frame.f_back
    return False


class FileWrites:
    """Note the files the user's code opens for writing (module docstring) while installed.

    Args:
        write: called as ``write("file", **fields)`` once per written file, when it is closed.
        user_code: ``frame -> the user's frame or None`` (``CallClassifier.user_code``).
        hook: ``() -> the hook running`` (the module's ``_current_fx_name``).
    """

    def __init__(self, write: Callable, user_code: Callable, hook: Callable):
        self.write, self.hook = write, hook
        self.user_code = _own_code(user_code)
        self.cwd = os.getcwd()
        self._open: dict = {}  # token -> (fields, _Written, file) of the files not written yet
        self._installed = None

    def install(self) -> None:
        original = builtins.open
        self._installed = original
        notes = self

        def open(file, mode="r", *args, **kwargs):  # noqa: A001 - it stands in for the builtin
            fh = original(file, mode, *args, **kwargs)
            if isinstance(file, (str, bytes, os.PathLike)) and WRITE_MODES & set(mode):
                user = notes.user_code(sys._getframe(1))
                if user is not None:
                    return notes._recorded(fh, os.fsdecode(os.path.abspath(file)), mode, user)
            return fh

        builtins.open = io.open = open
        self._install_save()

    def _install_save(self) -> None:
        torch = sys.modules.get("torch")
        serialization = sys.modules.get("torch.serialization")
        if torch is None or serialization is None or getattr(torch.save, "_ddpprobe_original", None):
            return
        original, notes = torch.save, self

        def save(obj, f, *args, **kwargs):
            out = original(obj, f, *args, **kwargs)
            if isinstance(f, (str, bytes, os.PathLike)):
                user = notes.user_code(sys._getframe(1))
                if user is not None:
                    notes._saved(obj, os.fsdecode(os.path.abspath(f)), user)
            return out

        save._ddpprobe_original = original
        torch.save = serialization.save = save
        self._saved_original = original

    def _saved(self, obj, path: str, user) -> None:
        from ddpprobe.trace._classify import call_site_of

        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        self.write(
            "file",
            path=path,
            key=path_key(path, self.cwd),
            mode="wb",
            call_site=call_site_of(user),
            hook=self.hook(),
            writer="torch.save",
            size=size,
            lines=0,
            **saved_content(obj),
        )

    def uninstall(self) -> None:
        """Restore ``open``; write the files still open as this rank has written them so far, and take the wrappers
        off them."""
        if self._installed is not None:
            builtins.open = io.open = self._installed
            self._installed = None
        original = getattr(self, "_saved_original", None)
        if original is not None:
            import torch

            torch.save = torch.serialization.save = original
            self._saved_original = None
        for token in list(self._open):
            self._closed(token)

    def _recorded(self, fh, path: str, mode: str, user):
        from ddpprobe.trace._classify import call_site_of

        fields = {
            "path": path,
            "key": path_key(path, self.cwd),
            "mode": mode,
            "call_site": call_site_of(user),
            "hook": self.hook(),
        }
        written = _Written(getattr(fh, "encoding", None))
        token = object()
        self._open[token] = (fields, written, fh)
        kind, notes = type(fh), self

        def write(data):
            out = kind.write(fh, data)
            written.add(data)
            return out

        def writelines(lines):  # as io.IOBase.writelines: one write per line
            for line in lines:
                write(line)

        def close():
            try:
                kind.close(fh)
            finally:
                notes._closed(token)

        try:
            fh.write, fh.writelines, fh.close = write, writelines, close
        except AttributeError:  # a file type without an instance dict: its writes are not counted
            self._open.pop(token)
        return fh

    def _closed(self, token) -> None:
        entry = self._open.pop(token, None)
        if entry is None:
            return
        fields, written, fh = entry
        for name in _WRAPPED:
            fh.__dict__.pop(name, None)
        self.write("file", **fields, **written.content())


#: The methods wrapped on a written file's instance (taken off again when it is closed).
_WRAPPED = ("write", "writelines", "close")


class _Written:
    """What one rank wrote through one file object: bytes, newlines and a SHA-1 of them (text encoded as the file
    encodes it)."""

    def __init__(self, encoding):
        self.encoding = encoding or "utf-8"
        self.size = self.lines = 0
        self.sha1 = hashlib.sha1()

    def add(self, data) -> None:
        raw = data.encode(self.encoding, "replace") if isinstance(data, str) else bytes(data)
        self.size += len(raw)
        self.lines += raw.count(b"\n")
        self.sha1.update(raw)

    def content(self) -> dict:
        return {"size": self.size, "lines": self.lines, "sha1": self.sha1.hexdigest()}


#: Keys of a saved dict listed in a ``torch.save`` event (``saved``); the digest covers them all.
SAVED_KEYS = 20


def saved_content(obj) -> dict:
    """``{"sha1", "saved"}`` of an object given to ``torch.save``: ``sha1`` over its structure (dict keys, sequence
    lengths, types) and every tensor's dtype, shape and bytes; ``saved``: ``[[key, shape or type name]]`` of its
    first :data:`SAVED_KEYS` entries where it is a dict, ``[["", shape]]`` for a tensor, else ``[]``. Reads only (a
    tensor is copied to the CPU to be read, never changed); an object it cannot read gives
    ``{"sha1": "unreadable: <reason>"}``."""
    digest = hashlib.sha1()
    try:
        _digest_into(digest, obj, 0)
    except Exception as exc:  # noqa: BLE001 - a record never fails the run
        return {"sha1": f"unreadable: {type(exc).__name__}", "saved": []}
    listed = []
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        listed.append(["", list(obj.shape)])
    elif isinstance(obj, dict):
        for key, value in list(obj.items())[:SAVED_KEYS]:
            shape = list(value.shape) if hasattr(value, "shape") else type(value).__name__
            listed.append([str(key), shape])
    return {"sha1": digest.hexdigest(), "saved": listed}


def _digest_into(digest, obj, depth: int) -> None:
    torch = sys.modules.get("torch")
    if depth > 20:
        digest.update(b"...")
        return
    if torch is not None and isinstance(obj, torch.Tensor):
        value = obj.detach()
        digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        if value.device.type != "meta" and not value.is_sparse:
            value = value.cpu().contiguous().reshape(-1)  # a 0-d tensor cannot be viewed as bytes as it is
            digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
        return
    if isinstance(obj, dict):
        digest.update(f"D{len(obj)}".encode())
        for key, value in obj.items():
            digest.update(repr(key).encode())
            _digest_into(digest, value, depth + 1)
        return
    if isinstance(obj, (list, tuple)):
        digest.update(f"L{len(obj)}".encode())
        for value in obj:
            _digest_into(digest, value, depth + 1)
        return
    digest.update(_ADDRESS.sub("at 0x?", repr(obj)).encode())


_ADDRESS = re.compile(r"at 0x[0-9a-fA-F]+")
