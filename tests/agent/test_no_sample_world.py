"""The agent knows no sample world (issue 42, item 5): nothing under agent/ (code, comments,
docstrings, prompts) names the sample estate's domains, buildings, rooms or ids, or the sample
corpus's codes and setting names; and no id is parsed by a prefix. The service will run on
estates and documentation no one here has seen: what works for them must come from general
mechanisms, and an example in a docstring is written with invented names.

The names come from the data itself (local_world/worlds/sample.yaml, documentation/), so a
sample that grows is scanned for as it grows."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import yaml

from agent.words import doc_tokens

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"
SAMPLE_WORLD = ROOT / "local_world" / "worlds" / "sample.yaml"
SAMPLE_CORPUS = ROOT / "documentation"
SCANNED = (".py", ".md", ".json", ".txt", ".yaml")
_ID_PREFIX_PARSE = re.compile(r"""startswith\(\s*["'](?:bld|room|rm|sen|bldg)[-_]""")


def _agent_files() -> Iterator[Path]:
    for path in sorted(AGENT.rglob("*")):
        if path.suffix in SCANNED and "__pycache__" not in path.parts:
            yield path


def _estate_terms(node: object) -> Iterator[str]:
    """Every id and name in the world file's domains (recursively)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("id", "name") and isinstance(value, str):
                yield value
            elif key == "sensors" and isinstance(value, dict):
                yield from (str(k) for k in value)
            yield from _estate_terms(value)
    elif isinstance(node, list):
        for item in node:
            yield from _estate_terms(item)


@cache
def sample_terms() -> tuple[str, ...]:
    """The sample's distinctive terms: its domains' ids, its estate's ids and multi-word (or
    coded) names, and the documented tokens of its corpus (error codes, setting keys, rule
    names). A one-word room name ("Lobby", "Cafeteria") is any estate's word, not the
    sample's."""
    world = yaml.safe_load(SAMPLE_WORLD.read_text(encoding="utf-8"))
    terms = set(_estate_terms(world["domains"]))
    for page in SAMPLE_CORPUS.rglob("*.md"):
        terms |= set(doc_tokens(page.read_text(encoding="utf-8")))
    distinctive = {t for t in terms if re.search(r"[\s\d_-]", t)}
    distinctive |= {str(domain["id"]) for domain in world["domains"]}
    return tuple(sorted(distinctive, key=len, reverse=True))


def test_the_scan_knows_the_sample() -> None:
    """The scan itself: it finds the sample's terms where they are (the sample's own data)."""
    terms = sample_terms()
    assert len(terms) > 50
    world_text = SAMPLE_WORLD.read_text(encoding="utf-8")
    assert sum(term in world_text for term in terms) > 20


@pytest.mark.parametrize("path", list(_agent_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_of_the_agent_names_the_sample(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [
        term
        for term in sample_terms()
        if re.search(rf"(?<![\w-]){re.escape(term)}(?![\w-])", text, re.IGNORECASE)
    ]
    assert not found, f"{path.relative_to(ROOT)} names the sample world: {found[:12]}"


@pytest.mark.parametrize("path", list(_agent_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_id_is_parsed_by_its_prefix(path: Path) -> None:
    assert not _ID_PREFIX_PARSE.search(path.read_text(encoding="utf-8"))
