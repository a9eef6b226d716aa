"""Every relative link in the README, CONTRIBUTING.md and docs/*.md resolves, and the README stays a map.

A link `[text](path#anchor)` must name a file or directory that exists (relative to the linking file) and,
with an anchor, a heading of the target markdown file under GitHub's slug rules (lower case, punctuation
dropped, spaces to hyphens, `-1`, `-2` for repeated headings). External links (`http://`, `https://`,
`mailto:`) are not checked. Links inside fenced code blocks and inline code are not links.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 320

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
MD_LINK_TEXT = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
EXTERNAL = ("http://", "https://", "mailto:")


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers."""
    lines: list[tuple[int, str]] = []
    fenced = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((lineno, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: rendered text, lower case, punctuation out, spaces to hyphens."""
    text = MD_LINK_TEXT.sub(r"\1", heading)
    text = text.replace("`", "").lower()
    kept = []
    for char in text:
        category = unicodedata.category(char)
        if char in " -" or category[0] in "LMN" or category == "Pc":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = ATX_HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """The link targets of a markdown file (images included), with their line numbers."""
    found: list[tuple[int, str]] = []
    for lineno, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            found.append((lineno, target))
    return found


def broken_links(path: Path) -> list[str]:
    broken: list[str] = []
    for lineno, target in links(path):
        if not target or target.startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{lineno}: ({target})"
        if not resolved.exists():
            broken.append(f"{where}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where}: no heading with that anchor")
    return broken


def test_every_relative_link_and_anchor_resolves() -> None:
    documents = _documents()
    assert len(documents) > 10, documents
    assert sum(len(links(p)) for p in documents) > 40, "the link parser found almost no links"
    broken = [b for path in documents for b in broken_links(path)]
    assert broken == [], "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Start locally, run the tests", "start-locally-run-the-tests"),
        ("What `make dev` starts", "what-make-dev-starts"),
        ("Will it scale? (`llmfleet simulate`)", "will-it-scale-llmfleet-simulate"),
        ("§1 Error shapes", "1-error-shapes"),
        ("Gateway — built: [the handover](x.md)", "gateway--built-the-handover"),
        ("Configuration (`LLMFLEET_*`)", "configuration-llmfleet_"),
    ],
)
def test_slugs_follow_githubs_rules(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_missing_file_or_heading_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Title\n\n## Part one\n\n## Part one\n", encoding="utf-8")
    doc = tmp_path / "a.md"
    doc.write_text(
        "[ok](b.md#part-one) [ok](b.md#part-one-1) [ok](#here) [ext](https://example.com/x#y)\n"
        "## Here\n[bad](b.md#part-two) [gone](c.md) `[code](c.md)`\n```\n[fenced](c.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(doc) == [
        "a.md:3: (b.md#part-two): no heading with that anchor",
        "a.md:3: (c.md): no such file",
    ]


def test_the_readme_is_a_map_not_a_manual() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move reference material to docs/"
    )


def test_the_readme_links_every_doc() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"docs the README's map does not link: {unlinked}"
