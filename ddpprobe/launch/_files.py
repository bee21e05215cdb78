"""Reading what a rank left on disk: its captured output and the files under its working directory."""

from __future__ import annotations

import os

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
    """``{path relative to root: text}`` for every file under ``root``, sorted; a file over
    ``MAX_FILE_BYTES`` or not UTF-8 holds ``"<N bytes>"`` instead of its text."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            size = os.path.getsize(path)
            if size > MAX_FILE_BYTES:
                files[rel] = f"<{size} bytes>"
                continue
            with open(path, "rb") as fh:
                data = fh.read()
            try:
                files[rel] = data.decode("utf-8")
            except UnicodeDecodeError:
                files[rel] = f"<{size} bytes>"
    return dict(sorted(files.items()))
