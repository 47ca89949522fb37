"""Relative links in the README and docs/ point at files and headings that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to -."""
    anchors = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def relative_links(page: Path) -> list[str]:
    links = LINK.findall(FENCE.sub("", page.read_text()))
    return [link for link in links if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        is_page = target.suffix == ".md"
        if not target.exists() or (anchor and is_page and anchor not in heading_anchors(target)):
            broken.append(link)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files or headings: {broken}"


def test_the_anchor_rule_matches_github() -> None:
    page = ROOT / "docs" / "results" / "baselines.md"
    assert "bert4rec-on-ml-1m" in heading_anchors(page)
    assert "duorec-on-beauty" in heading_anchors(page)
