"""The pages a user reads: README.md and every page of the docs site (docs/**/*.md), and their
fenced code blocks.

`docs/_incoming/` holds notes not folded into a page yet (not part of the site) and is left out;
so is `docs/_hooks/` (build code). The tests that run or check what the pages show read them here,
so a block moved from one page to another stays tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
#: Folders of docs/ that are not pages of the site.
NOT_PAGES = ("_incoming", "_hooks")

_FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<code>.*?)^```$", re.S | re.M)


def pages() -> list[Path]:
    """README.md, then the site's pages in path order."""
    found = [p for p in sorted(DOCS.rglob("*.md")) if not set(p.relative_to(DOCS).parts) & set(NOT_PAGES)]
    return [README, *found]


def page_name(path: Path) -> str:
    return str(path.relative_to(REPO))


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its opening fence, its language, its code, the
    nearest heading above it, and the line right before the fence (for markers)."""

    page: Path
    line: int
    lang: str
    code: str
    heading: str
    before: str


def blocks(text: str, page: Path = README) -> list[Block]:
    """Every fenced block of `text`, in order (one pattern for every language: a pattern for one
    language alone would take the closing fence of another block for an opening one)."""
    found = []
    for m in _FENCE.finditer(text):
        prior = text[: m.start()].rstrip("\n").splitlines()
        outside = _FENCE.sub("", text[: m.start()]).splitlines()  # a `# comment` in a block is no heading
        headings = [line.lstrip("#").strip() for line in outside if re.match(r"#{1,6} ", line)]
        found.append(Block(page=page, line=text.count("\n", 0, m.start()) + 1, lang=m["lang"], code=m["code"],
                           heading=headings[-1] if headings else "top", before=prior[-1] if prior else ""))
    return found


def all_blocks(lang: str | None = None) -> list[Block]:
    """The blocks of every page (of one language when given)."""
    return [b for p in pages() for b in blocks(p.read_text(), p) if lang is None or b.lang == lang]
