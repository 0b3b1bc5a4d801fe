"""Hybrid retrieval over the sample documentation, in the real embedded PostgreSQL, with the
real MiniLM embedder: exact tokens via full-text, paraphrases via vectors, ACLs in SQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foundation.acl import caller_entries, is_visible
from foundation.database import DimensionMismatchError
from retrieval.embedders import SentenceTransformerEmbedder
from retrieval.rerankers import NoopReranker
from retrieval.search import HybridRetriever, RetrievalConfig, SearchHit
from retrieval.store import ChunkRecord, DocumentRecord, PgDocumentStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEV = (ROOT / "documentation/developer").as_posix()
USER = (ROOT / "documentation/user").as_posix()
RUNBOOK = f"{DEV}/operator-runbook-gateway-keys-and-sensor-lockout.md"
NORTHWIND = f"{USER}/northwind-harbor-capacity-rules.md"
BILLING = f"{USER}/billing-and-seats.md"
CONFIG_REF = f"{DEV}/configuration-reference.md"
ERRORS = f"{DEV}/error-codes.md"

CALLERS: dict[str, tuple[list[str], list[str]]] = {
    "std_acme": (["standard_customer"], ["acme"]),
    "staff_acme": (["business_staff"], ["acme"]),
    "badmin_acme": (["business_admin"], ["acme"]),
    "admin_ops": (["admin"], ["crowdvision-ops"]),
    "std_northwind": (["standard_customer"], ["northwind"]),
    "std_domain_named_admin": (["standard_customer"], ["admin"]),
    "std_domain_named_business_admin": (["standard_customer"], ["business_admin"]),
    "no_memberships": ([], []),
}


@pytest.fixture(scope="module")
async def retriever(
    sample_docs_url: str, minilm: SentenceTransformerEmbedder
) -> AsyncIterator[HybridRetriever]:
    store = await PgDocumentStore.connect(sample_docs_url, embedding_dim=384, max_size=2)
    yield HybridRetriever(store, minilm, NoopReranker(), RetrievalConfig(top_k_final=5))
    await store.close()


async def _search(r: HybridRetriever, q: str, caller: str, k: int = 5) -> list[SearchHit]:
    roles, domains = CALLERS[caller]
    return await r.search(q, acl=caller_entries(roles, domains), top_k=k)


@pytest.mark.parametrize(
    ("query", "source"),
    [
        ("SENSOR_STALE_AFTER_SECONDS", CONFIG_REF),
        ("DOOR_COUNTER_DRIFT_RESET_HOUR", CONFIG_REF),
        ("CV-E1033", ERRORS),
        ("CV-E1014", ERRORS),
    ],
)
async def test_exact_tokens_are_found_by_the_keyword_side(
    retriever: HybridRetriever, query: str, source: str
) -> None:
    hits = await _search(retriever, query, "staff_acme")
    assert hits[0].source == source
    assert hits[0].keyword_rank == 1
    assert query in hits[0].section + hits[0].text


@pytest.mark.parametrize(
    ("query", "source"),
    [
        (
            "Which configuration variable decides at what hour the door-counter people count "
            "is zeroed every night?",
            CONFIG_REF,
        ),
        (
            "Our gateway's readings are being dropped because the timestamp is too far "
            "from server time",
            ERRORS,
        ),
    ],
)
async def test_paraphrases_are_found_by_the_vector_side(
    retriever: HybridRetriever, query: str, source: str
) -> None:
    hits = await _search(retriever, query, "staff_acme", k=10)
    vector_hits = [
        h for h in hits if h.source == source and h.vector_rank is not None and h.vector_rank <= 3
    ]
    assert vector_hits, [(h.source, h.section, h.vector_rank) for h in hits]


RESTRICTED = {
    RUNBOOK: {"admin_ops"},
    NORTHWIND: {"std_northwind"},
    BILLING: {"badmin_acme", "admin_ops"},
}
PROBES = [
    "What is Procedure KESTREL-7 and which cvctl command locks out a compromised sensor gateway?",
    "How often are the signing keys of the claims gateway rotated?",
    "What does rule set NW-HARBOR-CAP-3 do to the capacity of Dock Hall B?",
    "Northwind Harbor warehouse cold store dwell escalation extension 4417",
    "How long is the seat grace period for the SP-25 pack?",
    "billing seats invoice",
]


@pytest.mark.parametrize("caller", sorted(CALLERS))
async def test_restricted_pages_reach_exactly_the_callers_allowed(
    retriever: HybridRetriever, caller: str
) -> None:
    seen: set[str] = set()
    for probe in PROBES:
        seen.update(h.source for h in await _search(retriever, probe, caller, k=50))
    for source, allowed in RESTRICTED.items():
        if caller in allowed:
            assert source in seen, f"{caller} should see {source}"
        else:
            assert source not in seen, f"{caller} must not see {source}"
    if caller in {"std_acme", "no_memberships", "std_domain_named_admin"}:
        assert not any(s.startswith(DEV) for s in seen), "developer docs are staff-and-above"


async def test_every_candidate_is_visible_to_the_caller(
    retriever: HybridRetriever, sample_docs_url: str
) -> None:
    store = retriever.store
    assert isinstance(store, PgDocumentStore)
    acl_by_chunk = {
        r["id"]: list(r["permissions"])
        for r in await store.pool.fetch("SELECT id, permissions FROM chunks")
    }
    for caller, (roles, domains) in CALLERS.items():
        held = caller_entries(roles, domains)
        for probe in PROBES:
            vec = await retriever.embed_query(probe)
            for cand in await store.hybrid_candidates(probe, vec, held, k_vector=50, k_keyword=50):
                assert is_visible(acl_by_chunk[cand.chunk_id], held), (caller, cand.source)


async def test_configured_dimension_must_match_the_column(sample_docs_url: str) -> None:
    with pytest.raises(DimensionMismatchError, match="vector\\(384\\)"):
        await PgDocumentStore.connect(sample_docs_url, embedding_dim=768)


async def test_restrictive_acl_still_fills_k_rows_with_iterative_scan(db_url: str) -> None:
    """2,000 chunks, 3% visible to one domain: the HNSW side must still return k rows."""
    rng = np.random.default_rng(7)
    store = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=2)
    try:
        for d in range(20):
            acl = ["domain:rare"] if d < 1 else ["domain:common"]
            vecs = rng.normal(size=(100, 384)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            await store.write_document(
                DocumentRecord(
                    source=f"synthetic/{d}.md",
                    title=None,
                    content_hash=str(d),
                    fingerprint=str(d),
                    permissions=acl,
                    chunks=[
                        ChunkRecord(f"s{d}-{i}", i, f"text {d} {i}", "", "prose", 3, vecs[i])
                        for i in range(100)
                    ],
                )
            )
        await store.pool.execute("ANALYZE chunks")
        query = rng.normal(size=384).astype(np.float32)
        query /= np.linalg.norm(query)
        rare = await store.hybrid_candidates(
            "zzz", query, ["domain:rare"], k_vector=40, k_keyword=40
        )
        assert len([c for c in rare if c.vector_rank is not None]) == 40
        assert all(c.source == "synthetic/0.md" for c in rare)
        none = await store.hybrid_candidates(
            "zzz", query, ["domain:nobody"], k_vector=40, k_keyword=40
        )
        assert none == []
    finally:
        await store.close()


async def test_planner_settings_survive_connection_reuse(db_url: str) -> None:
    """asyncpg's pool runs RESET ALL on release; the search settings must outlive it."""
    store = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=1, ef_search=123)
    try:
        for _ in range(3):
            async with store.pool.acquire() as conn:
                assert await conn.fetchval("SHOW hnsw.iterative_scan") == "relaxed_order"
                assert await conn.fetchval("SHOW hnsw.ef_search") == "123"
                assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
                await conn.execute("SET hnsw.ef_search = 7")  # reset on release
    finally:
        await store.close()


async def test_keyword_side_matches_any_word_of_a_question(retriever: HybridRetriever) -> None:
    """websearch_to_tsquery ANDs every word; a question rarely has all of its words in one
    chunk, so the keyword side ORs them and lets the ranking (KEYWORD_RANKING) order them."""
    hits = await _search(
        retriever, "How long is the alert cooldown and how do I change it?", "std_acme"
    )
    assert hits[0].keyword_rank is not None
    assert "cooldown" in (hits[0].section + hits[0].text).lower()


async def test_a_negated_word_keeps_and_semantics(retriever: HybridRetriever) -> None:
    vec = await retriever.embed_query("cooldown -alert")
    held = caller_entries(["standard_customer"], [])
    cands = await retriever.store.hybrid_candidates(
        "cooldown -alert", vec, held, k_vector=5, k_keyword=50
    )
    for cand in cands:
        if cand.keyword_rank is not None:
            text = (cand.section + " " + cand.text).lower()
            assert "cooldown" in text and "alert" not in text


@pytest.mark.parametrize(
    "query",
    [
        "how long is the alert cooldown " + "-" * 300,
        ("alert cooldown\n" + "- " * 60 + "\n") * 4,
        "-" * 5000,
    ],
    ids=["dash-run", "spaced-dashes", "only-dashes"],
)
async def test_dash_runs_are_searched_not_a_postgres_error(
    retriever: HybridRetriever, query: str
) -> None:
    """websearch_to_tsquery nests a NOT per dash and fails past ~100 ("tsquery stack too
    small"): a pasted Markdown rule or a row of dashes is text, not an error."""
    vec = await retriever.embed_query(query)
    held = caller_entries(["standard_customer"], [])
    cands = await retriever.store.hybrid_candidates(query, vec, held, k_vector=5, k_keyword=20)
    assert len(cands) >= 5  # the vector side at least; no exception
    if "cooldown" in query:
        assert any(c.keyword_rank is not None for c in cands)


async def _keyword_hits(
    store: PgDocumentStore, query: str, vec: np.ndarray[Any, np.dtype[np.float32]]
) -> list[str]:
    cands = await store.hybrid_candidates(query, vec, ["domain:all"], k_vector=1, k_keyword=100)
    ranked = sorted(
        (c for c in cands if c.keyword_rank is not None), key=lambda c: c.keyword_rank or 0
    )
    return [c.chunk_id for c in ranked]


async def test_common_words_rank_but_do_not_select_keyword_candidates(db_url: str) -> None:
    """A word in more chunks than keyword_common_rows (by the planner's statistics) does not
    pull every chunk that has it into the ranking, but still ranks the chunks a rarer word
    selected; a query of common words only still requires them all; 0 turns it off."""
    vec = np.zeros(384, dtype=np.float32)
    vec[0] = 1.0
    texts = {f"common-{i}": f"building occupancy report number {i}" for i in range(60)}
    texts["common-7"] = "building occupancy humidity report"
    texts["rare-only"] = "humidity threshold"
    texts["other"] = "occupancy heatmap"
    chunks = [
        ChunkRecord(cid, i, text, "", "prose", 4, vec)
        for i, (cid, text) in enumerate(texts.items())
    ]
    setup = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=1)
    try:
        await setup.write_document(DocumentRecord("kw.md", None, "h", "f", ["domain:all"], chunks))
        await setup.pool.execute("ANALYZE chunks")
    finally:
        await setup.close()

    store = await PgDocumentStore.connect(
        db_url, embedding_dim=384, max_size=1, keyword_common_rows=20
    )
    off = await PgDocumentStore.connect(
        db_url, embedding_dim=384, max_size=1, keyword_common_rows=0
    )
    try:
        # "building" (60 chunks) is common; "humidity" selects, "building" ranks common-7 first.
        assert await _keyword_hits(store, "building humidity", vec) == ["common-7", "rare-only"]
        # Turned off: every chunk with either word is ranked, as before.
        everything = await _keyword_hits(off, "building humidity", vec)
        assert everything[0] == "common-7" and len(everything) == 61
        # Common words only: all must match (nothing that has just one of them).
        both = await _keyword_hits(store, "building occupancy", vec)
        assert set(both) == {f"common-{i}" for i in range(60)}
        # A negation keeps websearch's AND semantics.
        assert await _keyword_hits(store, "humidity -building", vec) == ["rare-only"]
        # Rare words only: unchanged.
        assert await _keyword_hits(store, "heatmap", vec) == ["other"]
    finally:
        await store.close()
        await off.close()


async def test_keyword_ranking_ts_rank_orders_by_the_chosen_function(db_url: str) -> None:
    """KEYWORD_RANKING picks one of two fixed statements: the keyword list is ordered by
    ts_rank (the default) or ts_rank_cd over the same query, exactly as PostgreSQL ranks it."""
    vec = np.zeros(384, dtype=np.float32)
    vec[0] = 1.0
    texts = {
        "three-words": "the eval token signs a jwt with the shared secret",
        "use-twice": "use the panel, then use the export",
        "use-far": "use " + "filler " * 30 + "secret",
        "jwt-twice": "jwt jwt rotation",
        "none": "humidity threshold",
    }
    chunks = [
        ChunkRecord(cid, i, text, "", "prose", 4, vec)
        for i, (cid, text) in enumerate(texts.items())
    ]
    cd = await PgDocumentStore.connect(
        db_url, embedding_dim=384, max_size=1, keyword_ranking="ts_rank_cd"
    )
    plain = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=1)
    try:
        await cd.write_document(DocumentRecord("kw.md", None, "h", "f", ["domain:all"], chunks))
        query = "What is EVAL_JWT_SECRET used for?"
        expected = {}
        for function in ("ts_rank_cd", "ts_rank"):  # the statement's any-word query, by hand
            rows = await cd.pool.fetch(
                f"""SELECT c.id FROM chunks c,
                     (SELECT replace(websearch_to_tsquery('english', $1)::text, ' & ', ' | ')
                         ::tsquery AS q) AS w
                   WHERE c.tsv @@ w.q ORDER BY {function}(c.tsv, w.q, 32) DESC, c.id""",
                query,
            )
            expected[function] = [r["id"] for r in rows]
        assert await _keyword_hits(cd, query, vec) == expected["ts_rank_cd"]
        assert await _keyword_hits(plain, query, vec) == expected["ts_rank"]
        assert "none" not in expected["ts_rank"]
        assert expected["ts_rank"] != expected["ts_rank_cd"]  # the data tell them apart
    finally:
        await cd.close()
        await plain.close()


def test_an_unknown_keyword_ranking_is_refused() -> None:
    """The statement is chosen from a fixed table, never formatted from the name."""
    with pytest.raises(ValueError, match="keyword_ranking"):
        PgDocumentStore(None, keyword_ranking="ts_rank_cd(c.tsv, q, 1); DROP TABLE chunks")  # type: ignore[arg-type]
