"""A generated block of a docs page: the text between two markers (``<!-- name -->`` ... ``<!-- /name -->``) that a
test checks against what its generator gives, and that ``--write`` rewrites. One helper for every such block
(docs/audit.md's table of hazards and its table of the DDP contract)."""

from __future__ import annotations

import re


def markers(name: str) -> tuple:
    """``("<!-- name -->", "<!-- /name -->")``."""
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def block(path: str, name: str) -> str:
    """The text between the markers ``name`` in the file ``path`` ("" where the markers are missing)."""
    begin, end = markers(name)
    with open(path, encoding="utf-8") as handle:
        found = re.search(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), handle.read(), re.S)
    return found.group(1) if found else ""


def write_block(path: str, name: str, text: str) -> None:
    """Put ``text`` between the markers ``name`` in the file ``path``."""
    begin, end = markers(name)
    with open(path, encoding="utf-8") as handle:
        page = handle.read()
    page = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: f"{begin}\n{text}\n{end}", page, flags=re.S)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
