"""Database round trips of the store, counted on the wire (``tests/pg_wire.py``), not timed.

A search is one statement (``HYBRID_SQL``: both sides, the ACL filter and the chunk texts in
one round trip), whoever asks and whatever they ask. Writing a document is one transaction of
a fixed number of statements, its chunks in one COPY, whatever the number of chunks.

Each store here has a one-connection pool, so everything it sends goes through the logged
connection. asyncpg's pool also resets a connection when the store releases it (``SELECT
pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``): one more round trip per store
call, counted as ``query: pool reset``, kept on purpose (no SET can leak between callers)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from foundation.acl import caller_entries
from retrieval.embedders import SentenceTransformerEmbedder
from retrieval.rerankers import NoopReranker
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import HYBRID_SQL, ChunkRecord, DocumentRecord, PgDocumentStore
from tests.pg_wire import SEARCH, WRITE_DOCUMENT, WRITE_EMPTY_DOCUMENT, WireLog, log_pool

pytestmark = pytest.mark.integration


async def _store(url: str) -> tuple[PgDocumentStore, WireLog]:
    store = await PgDocumentStore.connect(url, embedding_dim=384, max_size=1)
    return store, await log_pool(store.pool)


@pytest.fixture(scope="module")
async def logged(
    sample_docs_url: str, minilm: SentenceTransformerEmbedder
) -> AsyncIterator[tuple[HybridRetriever, WireLog]]:
    store, wire = await _store(sample_docs_url)
    yield HybridRetriever(store, minilm, NoopReranker(), RetrievalConfig()), wire
    await store.close()


@pytest.mark.parametrize(
    ("query", "roles", "domains", "top_k"),
    [
        ("SENSOR_STALE_AFTER_SECONDS", ["business_staff"], ["acme"], 5),
        ("How often are the signing keys of the claims gateway rotated?", ["admin"], [], 5),
        ("What does rule set NW-HARBOR-CAP-3 do?", ["standard_customer"], ["northwind"], 50),
        ("billing seats invoice", [], [], 5),  # no memberships: public pages only
        ("zzqx unmatched words qqzz", ["business_admin"], ["acme"], 5),  # no keyword hits
    ],
)
async def test_a_search_is_one_statement(
    logged: tuple[HybridRetriever, WireLog],
    query: str,
    roles: list[str],
    domains: list[str],
    top_k: int,
) -> None:
    retriever, wire = logged
    acl = caller_entries(roles, domains)
    await retriever.search(query, acl=acl, top_k=top_k)  # the statement cache is warm after it
    wire.clear()

    hits = await retriever.search(query, acl=acl, top_k=top_k)

    # One statement (no ACL lookup, no second query for texts), from the statement cache,
    # plus the pool's reset on release.
    assert wire.labels() == SEARCH, wire.trips
    assert [t.sql for t in wire.trips if t.kind == "execute"] == [HYBRID_SQL]
    assert all(h.text for h in hits)  # the texts came with that one statement


async def test_the_hybrid_statement_is_prepared_once_per_connection(
    sample_docs_url: str, minilm: SentenceTransformerEmbedder
) -> None:
    store, wire = await _store(sample_docs_url)
    try:
        retriever = HybridRetriever(store, minilm, NoopReranker(), RetrievalConfig())
        acl = caller_entries(["business_staff"], ["acme"])
        for query in ("alert cooldown", "CV-E1033", "door counter reset hour"):
            await retriever.search(query, acl=acl)
    finally:
        await store.close()

    assert wire.labels(setup=False) == SEARCH * 3
    assert [t.sql for t in wire.trips if t.kind == "prepare"] == [HYBRID_SQL]
    # Besides that prepare, at most one close of the type-introspection statement that
    # pgvector's register_vector (the pool's init) leaves behind.
    assert len(wire.setup_trips()) <= 2, wire.trips


def _doc(source: str, n_chunks: int, version: str = "1") -> DocumentRecord:
    rng = np.random.default_rng(n_chunks)
    vectors = rng.normal(size=(n_chunks, 384)).astype(np.float32)
    return DocumentRecord(
        source=source,
        title=source,
        content_hash=version,
        fingerprint=version,
        permissions=["role:business_staff"],
        chunks=[
            ChunkRecord(f"{source}#{i}", i, f"chunk {i} of {source}", "S", "prose", 5, vectors[i])
            for i in range(n_chunks)
        ],
    )


async def test_writing_a_document_costs_the_same_whatever_its_chunk_count(db_url: str) -> None:
    store, wire = await _store(db_url)
    try:
        await store.write_document(_doc("warm-up.md", 2))  # fills the statement cache
        per_write: dict[str, list[str]] = {}
        for source, n_chunks, version in [
            ("one.md", 1, "1"),
            ("thirty.md", 30, "1"),
            ("empty.md", 0, "1"),
            ("thirty.md", 30, "2"),  # a changed document: replaced in the same transaction
        ]:
            wire.clear()
            outcome = await store.write_document(_doc(source, n_chunks, version))
            per_write[f"{source} v{version} ({outcome})"] = wire.labels()
        counts = await store.counts()
    finally:
        await store.close()

    assert per_write == {
        "one.md v1 (new)": WRITE_DOCUMENT,
        "thirty.md v1 (new)": WRITE_DOCUMENT,
        "empty.md v1 (new)": WRITE_EMPTY_DOCUMENT,
        "thirty.md v2 (replaced)": WRITE_DOCUMENT,
    }
    assert len(WRITE_DOCUMENT) == 8  # 7 statements; the COPY waits twice
    assert counts == (4, 2 + 1 + 30)
