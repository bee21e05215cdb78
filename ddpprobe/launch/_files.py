"""Reading what a rank left on disk: its captured output and the files under its working directory."""

from __future__ import annotations

import os
import stat

#: Largest file (bytes) whose text a ``RankResult.files`` entry holds; larger files are listed by size.
MAX_FILE_BYTES = 1 << 20


def read_text(path: str) -> str:
    """The text of ``path`` (undecodable bytes replaced), or "" if it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def snapshot(root: str) -> dict:
    """``{path relative to root: text}`` for every entry under ``root``, sorted.

    Regular files hold their text; a file over ``MAX_FILE_BYTES`` or not UTF-8 holds ``"<N bytes>"``.
    Nothing else is opened (opening a FIFO would block, a link to ``/dev/zero`` would never end):
    a symbolic link holds ``"<symlink -> target>"``, a FIFO ``"<fifo>"``, a socket ``"<socket>"``,
    a device ``"<device>"``, and an entry that vanished or cannot be read ``"<unreadable: reason>"``.
    """
    files = {}
    for folder, dirs, names in os.walk(root):  # os.walk does not follow symlinked folders
        for name in names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            files[os.path.relpath(path, root)] = _describe(path)
    return dict(sorted(files.items()))


def _describe(path: str) -> str:
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return f"<symlink -> {os.readlink(path)}>"
        if stat.S_ISFIFO(st.st_mode):
            return "<fifo>"
        if stat.S_ISSOCK(st.st_mode):
            return "<socket>"
        if not stat.S_ISREG(st.st_mode):
            return "<device>"
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return f"<unreadable: {exc.strerror or exc}>"
    if len(data) > MAX_FILE_BYTES:
        return f"<{st.st_size} bytes>"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(data)} bytes>"
