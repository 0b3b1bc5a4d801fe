"""The second documentation corpus (``documentation-second/``, issue 42): it ingests under the
same conventions as ``documentation/`` (front matter, typed ACLs, the folder defaults of its
``DOC_ROOTS``), its restricted pages are the ones its README lists, its codes and settings are
its own, the settings its guides quote agree with its reference, and every fact of its
``FACTS.md`` holds: leak tokens unique to their page across both corpora, exact tokens in the
page, and each caller seeing exactly what the ACLs allow."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from foundation.acl import caller_entries, is_visible
from foundation.settings import Settings
from ingest_jobs.sources import PreparedSource, chunk_rows, discover, prepare

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "documentation-second"
SECOND_DOC_ROOTS = "documentation-second/guides=,documentation-second/reference=role:business_staff"
SAMPLE_ROOTS = [(ROOT / "documentation" / "user", []), (ROOT / "documentation" / "developer", [])]
CODE = re.compile(r"\b[A-Z]{2}-\d{3}\b")


def _roots(doc_roots: str) -> list[tuple[Path, list[str]]]:
    settings = Settings(_env_file=None, doc_roots=doc_roots)  # type: ignore[call-arg]
    return [(ROOT / path, acl) for path, acl in settings.ingestion.doc_root_acls]


@cache
def pages() -> dict[str, PreparedSource]:
    """The second corpus as ingestion prepares it, by path relative to the corpus."""
    prepared: dict[str, PreparedSource] = {}
    for file in discover(_roots(SECOND_DOC_ROOTS)):
        page = prepare(file, embedder_name="test", max_tokens=200)
        assert isinstance(page, PreparedSource), page
        prepared[str(file.path.relative_to(CORPUS))] = page
    return prepared


@cache
def every_ingested_text() -> dict[str, str]:
    """Both corpora's ingested pages (title and body), by path relative to the repository."""
    files = discover([*_roots(SECOND_DOC_ROOTS), *SAMPLE_ROOTS])
    return {str(f.path.relative_to(ROOT)): f.path.read_text(encoding="utf-8") for f in files}


@cache
def facts() -> dict[str, Any]:
    text = (CORPUS / "FACTS.md").read_text(encoding="utf-8")
    block = text.split("## Machine-readable form", 1)[1].split("```yaml", 1)[1].split("```")[0]
    data: dict[str, Any] = yaml.safe_load(block)
    return data


def _held(caller: str) -> list[str]:
    memberships = facts()["callers"][caller]["memberships"]
    return caller_entries([m["role"] for m in memberships], [m["domain"] for m in memberships])


def _sees(caller: str, page: str) -> bool:
    return is_visible(pages()[page].permissions, _held(caller))


def test_it_ingests_like_the_first_corpus() -> None:
    assert 10 <= len(pages()) <= 16
    assert {p.split("/")[0] for p in pages()} == {"guides", "reference"}
    for name, page in pages().items():
        assert page.title, name
        assert len(page.body.split()) > 300, name  # real pages, not stubs
        assert page.body.lstrip().startswith("# "), name
    # README.md and FACTS.md sit beside the roots and are not ingested
    assert not any(name.endswith(("README.md", "FACTS.md")) for name in pages())


def test_it_chunks_into_sections() -> None:
    """Chunked as ingestion does (200 tokens, counted as words here): several sections a page,
    nothing oversized, every chunk under a heading."""
    for name, page in pages().items():
        rows = chunk_rows(page, lambda text: len(text.split()), 200)
        assert len(rows) >= 4, name
        assert not any(row["oversized"] for row in rows), name
        assert all(row["section"] for row in rows), name


def test_its_restricted_pages_are_the_ones_its_readme_lists() -> None:
    defaults = {"guides": [], "reference": ["role:business_staff"]}
    restricted = {
        name: page.permissions
        for name, page in pages().items()
        if page.permissions != defaults[name.split("/")[0]]
    }
    assert restricted == {
        "reference/evacuation-override-runbook.md": ["role:admin"],
        "guides/aurelia-infection-control-limits.md": ["domain:aurelia-health"],
        "guides/workplace-plans-and-licences.md": ["role:business_admin"],
    }
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    for name, acl in restricted.items():
        assert f"| `{name}` | `[{', '.join(acl)}]` |" in readme


def test_its_codes_are_its_own_and_all_listed() -> None:
    summary = pages()["reference/workplace-error-codes.md"].body.split("## Booking")[0]
    listed = set(CODE.findall(summary))
    used = {code for page in pages().values() for code in CODE.findall(page.body)}
    assert used == listed and len(listed) >= 20
    assert not any(re.search(r"CV-E1\d{3}", page.body) for page in pages().values())
    sample = " ".join(
        text for path, text in every_ingested_text().items() if path.startswith("documentation/")
    )
    assert not listed & set(CODE.findall(sample))


def _settings_rows(text: str) -> dict[str, str]:
    """``key -> default`` from the Markdown tables of a page (rows starting with a key)."""
    rows = re.findall(r"^\| `([a-z_]+(?:\.[a-z0-9_]+)+)` \| ([^|]+) \|", text, re.M)
    return {key: default.strip() for key, default in rows}


def test_the_guides_quote_the_settings_reference() -> None:
    reference = _settings_rows(pages()["reference/workplace-settings-reference.md"].body)
    assert len(reference) >= 40
    quoted = 0
    for name, page in pages().items():
        if name.startswith("guides/"):
            for key, default in _settings_rows(page.body).items():
                assert reference.get(key) == default, (name, key, default)
                quoted += 1
    assert quoted >= 30


def test_leak_tokens_are_unique_to_their_page_across_both_corpora() -> None:
    texts = {path: text.lower() for path, text in every_ingested_text().items()}
    for page in facts()["restricted_pages"]:
        source = f"documentation-second/{page['source']}"
        for token in page["leak_tokens"]:
            holders = [path for path, text in texts.items() if token.lower() in text]
            assert holders == [source], (page["id"], token, holders)


def _all_facts() -> list[dict[str, Any]]:
    data = facts()
    return [*data["restricted_pages"], *data["config_keys"], *data["error_codes"]]


@pytest.mark.parametrize("fact", _all_facts(), ids=lambda f: f["id"])
def test_each_fact_holds(fact: dict[str, Any]) -> None:
    source = fact["source"]
    text = pages()[source].body.lower()
    for token in fact["exact_tokens"]:
        assert token.lower() in text, (fact["id"], token)
    for also in fact.get("also_in", []):
        assert fact["exact_tokens"][0].lower() in pages()[also].body.lower(), (fact["id"], also)
    first = fact["exact_tokens"][0].lower()
    holders = [name for name, page in pages().items() if first in page.body.lower()]
    if "hidden_from" in fact:  # a restricted page: who sees the page itself
        assert holders == [source]
        for caller in fact["visible_to"]:
            assert _sees(caller, source), (fact["id"], caller)
        for caller in fact["hidden_from"]:
            assert not _sees(caller, source), (fact["id"], caller)
    for caller in fact["visible_to"]:  # can get the fact from some page
        assert any(_sees(caller, name) for name in holders), (fact["id"], caller)
    for caller in fact.get("hidden_from_exact_token", []):
        assert not any(_sees(caller, name) for name in holders), (fact["id"], caller)
    callers = set(facts()["callers"])
    named = set(fact["visible_to"]) | set(fact.get("hidden_from", []))
    named |= set(fact.get("hidden_from_exact_token", []))
    assert named <= callers


def test_the_attribute_traps_quote_real_figures() -> None:
    for trap in facts()["attribute_traps"]:
        body = pages()[trap["source"]].body
        assert re.search(rf"(?<![\d.]){re.escape(trap['figure'])}(?![\d])", body), trap


def test_the_second_world_and_corpus_agree() -> None:
    """The pages that name rooms of the second world quote their capacities."""
    from local_world.world import build_world
    from local_world.world_file import WORLDS_DIR

    world = build_world(path=WORLDS_DIR / "second.yaml")
    capacity = {room.name: room.capacity for room in world.rooms}
    aurelia = pages()["guides/aurelia-infection-control-limits.md"].body
    for name, standard, amber, red in re.findall(
        r"^\| ([A-Z][A-Za-z ]+) \| (\d+) \| (\d+) \| (\d+) \|$", aurelia, re.M
    ):
        assert capacity[name] == int(standard), name
        assert int(amber) == int(standard) * 6 // 10 and int(red) == int(standard) * 4 // 10
    assert (
        capacity["Physiotherapy Gym"] == 24 and "(24 people standard, 14 amber, 9 red)" in aurelia
    )
    api = pages()["reference/bookings-api.md"].body
    assert (
        '"name": "Azure Ballroom"' in api
        and f'"bookableCapacity": {capacity["Azure Ballroom"]}' in api
    )
    domains = {d.id for d in world.domains}
    assert {
        m["domain"] for c in facts()["callers"].values() for m in c["memberships"]
    } - domains == {
        "crowdvision-ops",
        "business_admin",
    }
