"""Code and docs cite a design note (docs/design/*.md) by its name and a section's title, never by
a section's number: numbers shift whenever a note is rewritten. Every note that a .py file or a
doc names exists, and every section it names by title (`serving.md, "Budgets"`) is a heading or
a bold paragraph lead of that note. The checker is tried on planted citations first, so a
pattern that matches nothing cannot pass for a clean code base."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design"
SOURCES = ("ndstore", "blaze", "lambdas", "benchmarks", "tests", "deploy")
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
NOTE = r"(?P<path>docs/design/)?(?P<note>[\w-]+)\.md"
# serving.md section 10 / serving.md, sections 5 and 21 / (serving.md) section 3 / serving.md §10
BY_NUMBER = re.compile(NOTE + r"[,;:)]?\s*\(?\s*(?:sections?\s*|§\s*)\d")
BY_TITLE = re.compile(NOTE + r"\)?,\s*\"(?P<title>[^\"]+)\"")
BY_PATH = re.compile(r"docs/design/(?P<note>[\w.-]+)\.md")


def flat(text: str) -> str:
    """The text with its lines joined, a comment's leading `#` dropped: citations wrap."""
    return re.sub(r"\s*\n\s*(?:#+\s)?\s*", " ", text)


@cache
def sections(note: str) -> frozenset[str]:
    """The note's headings and the bold leads of its paragraphs (`**Page-ins after the answer.**`)."""
    text = (DESIGN / f"{note}.md").read_text()
    heads = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    leads = {lead.rstrip(".") for lead in re.findall(r"\*\*([^*]+)\*\*", text)}
    return frozenset(heads | leads)


def is_note(match: re.Match[str]) -> bool:
    return bool(match["path"]) or (DESIGN / f"{match['note']}.md").is_file()


def titled(note: str, title: str) -> bool:
    """Whether ``title`` names a section of ``note``: a heading or bold lead, or its start before
    a parenthesis or colon ("Direct I/O coherence (`ndstore/engine/direct.py`)", "The record:
    every NDBlaze write, before its 201")."""
    return any(h == title or h.startswith((title + " (", title + ":")) for h in sections(note))


def problems(text: str) -> list[str]:
    """What is wrong with the design-note citations in ``text``."""
    text = flat(text)
    found = [f"cites a section by number: {m[0]!r}" for m in BY_NUMBER.finditer(text) if is_note(m)]
    found += [f"names a note that does not exist: docs/design/{m['note']}.md" for m in BY_PATH.finditer(text)
              if not (DESIGN / f"{m['note']}.md").is_file()]
    found += [f"names a section its note does not have: {m[0]!r}" for m in BY_TITLE.finditer(text)
              if is_note(m) and (DESIGN / f"{m['note']}.md").is_file() and not titled(m["note"], m["title"])]
    return found


def sources() -> list[Path]:
    this = Path(__file__).resolve()
    return [p for name in SOURCES for p in sorted((ROOT / name).rglob("*.py")) if p.resolve() != this]


@pytest.mark.parametrize("text", [
    "(docs/design/serving.md section 10)",
    "# a worker's first request (serving.md,\n# section 27).",
    "(docs/design/serving.md, sections 5 and 21)",
    "see cache-tier.md §3",
    "(serving.md) section 3",
    "(docs/design/no-such-note.md)",
    '(docs/design/serving.md, "No such section")',
    '(serving.md, "Which\n    requests go by number")',
])
def test_a_planted_citation_is_found(text: str) -> None:
    assert problems(text), text


@pytest.mark.parametrize("text", [
    '(docs/design/serving.md, "Budgets")',
    '# the same (serving.md, "Which\n# requests go without locks").',
    '(docs/design/cache-tier.md, "Direct I/O coherence")',
    '(cache-tier.md, "Page-ins after the answer")',
    'loss-detection.md, "The record"',
    "the brief's DESIGN §8 and docs/reliability.md section 3 are not design notes",
    "docs/design/serving.md says why",
])
def test_a_citation_by_title_passes(text: str) -> None:
    assert problems(text) == [], text


def test_code_cites_design_notes_by_title_and_every_note_it_names_exists() -> None:
    files = sources()
    assert len(files) > 100  # the walk found the code base
    found = [f"{p.relative_to(ROOT)}: {problem}" for p in files for problem in problems(p.read_text())]
    assert found == [], "\n".join(found)


def test_docs_cite_design_notes_by_title_and_every_section_they_name_exists() -> None:
    found = [f"{p.relative_to(ROOT)}: {problem}" for p in DOCS for problem in problems(p.read_text())]
    assert found == [], "\n".join(found)
