"""The files a rank's own code writes: which path, from which line and hook, and what the file held when closed.

:class:`FileWrites` wraps ``builtins.open`` (``io.open`` is the same function) while it is installed. An ``open`` of
a path (not a file descriptor) for writing (``"w"``, ``"a"``, ``"x"`` or ``"+"`` in its mode) whose caller chain
holds the user's code (``CallClassifier.user_code``: outside torch, Lightning, ddpprobe and the standard library,
and outside every installed package, so that Lightning's checkpoints written through fsspec are not the user's) is
noted; when that file is closed (or when the wrapper is uninstalled, for a file still open), ``write("file",
**fields)`` gets:

- ``path``: the absolute path the rank wrote;
- ``key``: the path as every rank of a real launch names it: the audit gives each rank a working directory of its
  own, so a path under it is written ``./<relative path>`` (ranks launched together share one working directory,
  where ``preds.csv`` is one file), any other path as is;
- ``mode``, ``call_site`` (``"file.py:42 in on_test_epoch_end"``, the user's line), ``hook`` (the module's
  ``_current_fx_name`` at the ``open``);
- ``size`` (bytes), ``lines`` (newline characters) and ``sha1`` (hex) of what this rank wrote through that file
  object (what another rank wrote to the same path is not in it).

Only what a rank's code writes through Python's ``open`` is seen: ``torch.save`` to a path and C extensions open
files on their own. Reads only: the user's code gets the file ``open`` returned inside a thin wrapper that passes
every attribute through and counts what ``write`` and ``writelines`` pass (registered as an ``io.TextIOBase`` or
``io.BufferedIOBase``, so ``isinstance`` checks still hold); it holds no reference cycle, so a file the code never
closes is still closed when it is dropped.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import sys
from typing import Callable

#: Characters of a mode that make an ``open`` one for writing.
WRITE_MODES = set("wax+")


def path_key(path: str, cwd: str) -> str:
    """``path`` as every rank of a real launch names it: ``./<relative>`` under ``cwd`` (the rank's own working
    directory in the audit, one shared directory in a real launch), else ``path`` itself."""
    cwd = os.path.join(os.path.abspath(cwd), "")
    return "./" + os.path.relpath(path, cwd) if path.startswith(cwd) else path


#: Folders of installed packages: a frame there is a library's, whoever ``user_code`` counts as the user.
INSTALLED = ("site-packages", "dist-packages")


def _own_code(user_code: Callable) -> Callable:
    """``frame -> the innermost frame at or above it that ``user_code`` counts as the user's and that lies outside
    every installed package (``INSTALLED``), or None``: a file pandas or fsspec opens for the user's
    ``df.to_csv("preds.csv")`` is noted at the user's line, and one they open for Lightning (a checkpoint) not at
    all."""

    def find(frame):
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
        self._open: dict = {}  # token -> (fields, _Written) of the files not written yet
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

    def uninstall(self) -> None:
        """Restore ``open`` and write the files still open as this rank has written them so far."""
        if self._installed is not None:
            builtins.open = io.open = self._installed
            self._installed = None
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
        self._open[token] = (fields, written)
        kind = _RecordedText if isinstance(fh, io.TextIOBase) else _RecordedBinary
        return kind(fh, written, lambda: self._closed(token))

    def _closed(self, token) -> None:
        entry = self._open.pop(token, None)
        if entry is not None:
            fields, written = entry
            self.write("file", **fields, **written.content())


class _Recorded:
    """The file object ``open`` returned, as the user's code gets it: every attribute is the file's, and what
    ``write`` and ``writelines`` pass is counted into a :class:`_Written`; ``close``, leaving a ``with`` block or
    dropping the last reference (the file itself is then dropped and closes, as without the wrapper) writes the
    record once."""

    __slots__ = ("_file", "_written", "_done", "__weakref__")

    def __init__(self, file, written, done):
        object.__setattr__(self, "_file", file)
        object.__setattr__(self, "_written", written)
        object.__setattr__(self, "_done", done)

    def write(self, data):
        out = self._file.write(data)
        self._written.add(data)
        return out

    def writelines(self, lines):
        lines = list(lines)
        self._file.writelines(lines)
        for line in lines:
            self._written.add(line)

    def close(self):
        try:
            self._file.close()
        finally:
            self._done()

    def __enter__(self):
        self._file.__enter__()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __iter__(self):
        return iter(self._file)

    def __next__(self):
        return next(self._file)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __setattr__(self, name, value):
        setattr(self._file, name, value)

    def __del__(self):
        done = getattr(self, "_done", None)
        if done is not None:
            done()


class _RecordedText(_Recorded):
    __slots__ = ()


class _RecordedBinary(_Recorded):
    __slots__ = ()


io.TextIOBase.register(_RecordedText)
io.BufferedIOBase.register(_RecordedBinary)


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
