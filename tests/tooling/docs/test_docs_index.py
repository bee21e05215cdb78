"""docs/README.md is the manual's index: every page under docs/ is listed there once, as a numbered line
that links it, so a page added without an entry (or an entry left for a page that is gone) fails here."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.not_a_fact("checks docs/README.md against the pages under docs/, not a fact about DDP")

ROOT = Path(__file__).resolve().parents[3]
INDEX = ROOT / "docs" / "README.md"


def _indexed_pages(text: str) -> list:
    """The pages the index's numbered lines link (``1. [install.md](install.md): ...``), in their order."""
    return re.findall(r"^\d+\. \[[^\]]+\]\(([^)#]+\.md)\)", text, re.M)


def test_the_index_reads_its_own_numbered_lines():
    text = "1. [a.md](a.md): what a answers?\n   wrapped line (a.md)\n2. [b.md](b.md): what b answers?\n"
    assert _indexed_pages(text) == ["a.md", "b.md"]


def test_docs_readme_lists_every_page_under_docs_once():
    pages = sorted(p.name for p in INDEX.parent.glob("*.md") if p != INDEX)
    listed = _indexed_pages(INDEX.read_text(encoding="utf-8"))
    twice = sorted({p for p in listed if listed.count(p) > 1})
    assert not twice, f"docs/README.md lists these pages more than once: {twice}"
    missing, stale = sorted(set(pages) - set(listed)), sorted(set(listed) - set(pages))
    assert not missing and not stale, (
        f"docs/README.md: pages without an entry {missing}, entries without a page {stale}; "
        "add one line per page saying which question it answers"
    )
