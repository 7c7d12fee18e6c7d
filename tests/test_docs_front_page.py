"""README.md is a front page, and the documentation's links lead somewhere.

The README stays short (the two commands, one example, the status, a map of docs/), and every
relative link in it and in docs/*.md names a file that exists and, for `page.md#anchor`, a heading
of that page (GitHub's anchors). Pure file reading: no server, no model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# The pages the README's map names, one per subject.
MAPPED = ["serving", "judging", "training", "store-and-dashboard", "configuration", "environments", "engines", "benchmarks"]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a `# comment` in a shell block is no heading)."""
    lines, fence = [], None
    for line in text.splitlines():
        opening = FENCE.match(line)
        if opening:
            if fence is None:
                fence = opening.group(1)
            elif opening.group(1) == fence:
                fence = None
            continue
        if fence is None:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2, ... for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    """The targets of the page's links and images that are not URLs (inline code is not a link)."""
    targets = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
            continue
        targets += INLINE_LINK.findall(INLINE_CODE.sub("", line))
    return [target for target in targets if target and not SCHEME.match(target)]


def test_the_readme_is_a_front_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines; the rest belongs in docs/"
    assert "make demo" in text and "make test" in text
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


@pytest.mark.parametrize("name", MAPPED)
def test_the_readme_maps_each_subject_to_its_page(name: str) -> None:
    assert (ROOT / "docs" / f"{name}.md").is_file()
    assert f"(docs/{name}.md)" in README.read_text(encoding="utf-8"), f"README.md does not link docs/{name}.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_slugs_are_githubs() -> None:
    assert slug("What the model judge costs (`--judge engine`)") == "what-the-model-judge-costs---judge-engine"
    assert slug("`--judge engine+rule`") == "--judge-enginerule"
    assert slug("Dashboard (DESIGN §11)") == "dashboard-design-11"
    assert slug("Sessions, turn kinds, next states") == "sessions-turn-kinds-next-states"
