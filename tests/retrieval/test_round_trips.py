"""Database round trips of the store, counted on the wire (``tests/pg_wire.py``), not timed.

A search is one statement (``HYBRID_SQL``: both sides, the ACL filter and the chunk texts in
one round trip), whoever asks and whatever they ask. Writing a document is one transaction of
a fixed number of statements, its chunks in one COPY, whatever the number of chunks.

Each store here has a one-connection pool, so everything it sends goes through the logged
connection. asyncpg's pool also resets a connection when the store releases it (``SELECT
pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``): one more round trip per store
call, counted as ``query: pool reset``, kept on purpose (no SET can leak between callers)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import asyncpg
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


async def test_a_batch_of_documents_is_one_transaction_whole_or_not_at_all(db_url: str) -> None:
    """``write_documents``: the round trips of one document for the whole batch, outcomes in
    order (new, replaced), the permissions and metadata of each row kept, and a batch that
    fails writes none of its documents (an ingestion then re-runs them)."""
    store, wire = await _store(db_url)
    try:
        await store.pool.execute("DELETE FROM documents")
        await store.write_document(_doc("b.md", 2))
        wire.clear()
        batch = [_doc("a.md", 3), _doc("b.md", 4, "2"), _doc("c.md", 0)]
        batch[0] = dataclasses.replace(batch[0], permissions=[], metadata={"k": "v"})
        outcomes = await store.write_documents(batch)
        trips = wire.labels()
        rows = await store.pool.fetch(
            "SELECT source, fingerprint, permissions, metadata, chunk_count,"
            " (SELECT count(*) FROM chunks c WHERE c.document_id = d.id) AS chunks"
            " FROM documents d ORDER BY source"
        )
        with pytest.raises(ValueError, match="at most once"):
            await store.write_documents([_doc("d.md", 1), _doc("d.md", 1)])
        clash = [_doc("e.md", 1), _doc("f.md", 2)]  # f's chunk ids are a.md's: the COPY fails
        clash[1] = dataclasses.replace(clash[1], chunks=batch[0].chunks[:2])
        with pytest.raises(asyncpg.UniqueViolationError):
            await store.write_documents(clash)
        after = await store.counts()
    finally:
        await store.close()

    assert outcomes == ["new", "replaced", "new"]
    assert trips == WRITE_DOCUMENT
    assert [
        (r["source"], r["fingerprint"], list(r["permissions"]), r["chunk_count"], r["chunks"])
        for r in rows
    ] == [
        ("a.md", "1", [], 3, 3),
        ("b.md", "2", ["role:business_staff"], 4, 4),
        ("c.md", "1", ["role:business_staff"], 0, 0),
    ]
    assert json.loads(rows[0]["metadata"]) == {"k": "v"}
    assert after == (3, 7)  # neither e.md nor f.md
