"""Every relative link in README.md and docs/ (benchmark pages included) reaches a file of the
repository, and its ``#anchor``, where it has one, a heading of that file (GitHub's slugs)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target): the target up to a space or ")"; images too. Code spans and blocks are dropped.
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; repeated headings get ``-1``, ``-2``, as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> Iterator[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text()))
    for target in LINK.findall(text):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):
            yield target


def problem(document: Path, target: str) -> str | None:
    """Why ``target``, linked from ``document``, does not resolve, or None."""
    file_part, _, anchor = target.partition("#")
    linked = (document.parent / file_part).resolve() if file_part else document
    if not linked.exists():
        return f"{target}: no file {linked}"
    if ROOT not in linked.parents and linked != ROOT:
        return f"{target}: outside the repository"
    if anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
        return f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    problems = [p for target in relative_links(document) if (p := problem(document, target))]
    assert problems == [], f"{document.relative_to(ROOT)}: {problems}"


def test_benchmark_pages_exist_and_the_index_links_every_one() -> None:
    pages = sorted((ROOT / "docs" / "benchmarks").glob("*.md"))
    index = ROOT / "docs" / "benchmarks" / "README.md"
    assert index in pages and len(pages) > 1
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in relative_links(index)}
    assert {p for p in pages if p != index} <= linked


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("OpenAI HTTP: security and limits", "openai-http-security-and-limits"),
        ("vLLM backend (`server/engine/vllm_engine.py`)", "vllm-backend-serverenginevllm_enginepy"),
        ("The issue's measurement, before and after", "the-issues-measurement-before-and-after"),
    ],
)
def test_slugs_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_link_and_a_missing_anchor_are_caught() -> None:
    assert problem(ROOT / "README.md", "docs/nope.md") is not None
    assert problem(ROOT / "README.md", "docs/route.md#no-such-heading") is not None
    assert problem(ROOT / "README.md", "docs/route.md#failures") is None
