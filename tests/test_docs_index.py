"""docs/index.md links every document in docs/, so none is reachable only through another (or not at all)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = ROOT / "docs/index.md"
LINK = re.compile(r"\]\(([^)#\s]+\.md)\)")


def unlisted(index_text: str, docs: list[str]) -> list[str]:
    """The docs (file names in docs/) that the index does not link."""
    linked = {Path(link).name for link in LINK.findall(index_text) if "/" not in link}
    return sorted(set(docs) - linked)


def test_the_index_links_every_doc() -> None:
    docs = [p.name for p in DOCS.glob("*.md") if p != INDEX]
    assert len(docs) >= 8
    assert unlisted(INDEX.read_text(), docs) == []


def test_a_doc_missing_from_the_index_is_named() -> None:
    a, b, c = (name + ".md" for name in "abc")  # made-up docs, built so test_docs_citations does not take them for citations
    assert unlisted(f"- [{a}]({a})\n- [b](../{b})\n", [a, b, c]) == [b, c]


def test_the_readme_points_to_the_index() -> None:
    assert f"]({INDEX.relative_to(ROOT)})" in (ROOT / "README.md").read_text()
