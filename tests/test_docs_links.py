"""The documentation's links resolve, and the front page stays a front page.

Every relative link (inline, image or reference definition) in README.md, docs/**/*.md,
bench/RESULTS.md and bench/results/*.md must name an existing file or folder, and a link with
an ``#anchor`` into a Markdown file must name one of its headings (GitHub's slugs). Links
inside code (fenced blocks, inline spans) are not links. Also: the README is at most 260
lines and links every page of docs/, and docs/layout.md's "may import" column is exactly what
tests/test_layering.py allows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 260


def _pages() -> list[Path]:
    pages = [
        README,
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "bench" / "RESULTS.md",
        *sorted((ROOT / "bench" / "results").glob("*.md")),
    ]
    return [page for page in pages if page.is_file()]


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # the text (one level of brackets inside)
    r"\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"  # (target "optional title")
)
_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _outside_fences(text: str) -> Iterator[str]:
    """The lines of ``text`` outside fenced code blocks."""
    fence: str | None = None
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        yield line


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked."""
    return [_INLINE_CODE.sub("``", line) for line in _outside_fences(text)]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, punctuation removed
    (letters, digits, ``_`` and ``-`` kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors GitHub makes for ``page``: one per heading (a repeated slug gets ``-1``,
    ``-2``, ...), plus explicit ``<a name|id="...">`` anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_fences(page.read_text(encoding="utf-8")):
        heading = _HEADING.match(line)
        if heading:
            slug = github_slug(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(_HTML_ANCHOR.findall(line))
    return frozenset(found)


def links(page: Path) -> list[str]:
    """Every link target in ``page``'s prose: inline links, images, reference definitions."""
    targets: list[str] = []
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        definition = _REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
            continue
        targets.extend(_INLINE_LINK.findall(line))
    return targets


def _shown(path: Path, page: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path.relative_to(page.parent))


def broken_links(page: Path) -> list[str]:
    broken: list[str] = []
    for target in links(page):
        if not target or _SCHEME.match(target) or target.startswith("//"):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
            continue
        if (
            anchor
            and resolved.is_file()
            and resolved.suffix == ".md"
            and unquote(anchor).lower() not in anchors(resolved)
        ):
            broken.append(f"{target}: no heading #{anchor} in {_shown(resolved, page)}")
    return broken


PAGES = _pages()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; reference material belongs in docs/"
    )


def test_the_readme_names_both_commands_and_links_every_guide() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make run" in text and "make test" in text
    linked = {
        (ROOT / unquote(target.partition("#")[0])).resolve()
        for target in links(README)
        if not _SCHEME.match(target)
    }
    unlinked = [
        str(page.relative_to(ROOT))
        for page in sorted((ROOT / "docs").rglob("*.md"))
        if page.resolve() not in linked
    ]
    assert unlinked == []


def test_the_layout_table_says_what_test_layering_allows() -> None:
    from tests.test_layering import ALLOWED

    rows: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "layout.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        package = cells[1].strip("`/")
        if package in ALLOWED:
            rows[package] = {
                name for name in re.findall(r"`([a-z_]+)`", cells[3]) if name in ALLOWED
            }
    assert rows == ALLOWED


# The checker itself, on small inputs.


def test_slugs_follow_github() -> None:
    assert github_slug("Payloads: `OBSERVE_PAYLOADS`") == "payloads-observe_payloads"
    assert github_slug("Hybrid search (`python -m bench.search`, 2026-11-30)") == (
        "hybrid-search-python--m-benchsearch-2026-11-30"
    )
    assert github_slug("How it's built") == "how-its-built"
    assert github_slug("3.6 Usage limits hold (issue 19, item 1)") == (
        "36-usage-limits-hold-issue-19-item-1"
    )


def test_the_checker_finds_broken_links_and_ignores_code(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## A section\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Here\n\n"
        "[ok](other.md) [ok](other.md#a-section) [ok](other.md#a-section-1) [ok](#here)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) ![img](missing.png)\n"
        "[web](https://example.com/x) `[code](missing-in-code.md)`\n"
        "```\n[fenced](missing-in-fence.md)\n```\n"
        "[ref]: missing-ref.md\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nope: no heading #nope in other.md",
        "missing.png: no such file",
        "missing-ref.md: no such file",
    ]
