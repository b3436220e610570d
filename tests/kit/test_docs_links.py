"""The documentation holds together: every relative link in README.md and docs/*.md names
a file that exists, and every `#anchor` a heading of that file (GitHub's slug rule); the
map in docs/README.md lists every page of docs/; no page cites a document that is not in
the repository ("DESIGN §N")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent.parent
PAGES = [CHECKOUT / "README.md", *sorted((CHECKOUT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name if p.parent.name == "docs"
                         else "README")
def test_every_relative_link_resolves(page):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):              # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"


def test_the_map_lists_every_page():
    listed = set(LINK.findall((CHECKOUT / "docs" / "README.md").read_text()))
    pages = {p.name for p in (CHECKOUT / "docs").glob("*.md")} - {"README.md"}
    missing = sorted(p for p in pages if not any(t.split("#")[0] == p for t in listed))
    assert missing == []


def test_no_page_cites_a_document_outside_the_repository():
    cited = [p.name for p in PAGES if "DESIGN §" in p.read_text(encoding="utf-8")]
    assert cited == []
