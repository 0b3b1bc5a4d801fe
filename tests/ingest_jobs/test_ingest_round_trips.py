"""Database round trips of an ingestion run, counted on the wire (``tests/pg_wire.py``), not
timed: one statement to list what is stored, one to find the vector index, then the same
fixed transaction per batch of changed documents whatever their number of chunks, and
nothing else. An unchanged re-run writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundation.settings import Settings
from ingest_jobs.pipeline import IngestOptions, IngestReport, run_ingest
from retrieval.embedders import SentenceTransformerEmbedder
from retrieval.store import PgDocumentStore
from serve_app.wiring import ingest_config
from tests.ingest_jobs.corpus import PAGES, write_corpus
from tests.pg_wire import (
    FIND_VECTOR_INDEX,
    LIST_DOCUMENTS,
    WRITE_DOCUMENT,
    WireLog,
    log_pool,
)

pytestmark = pytest.mark.integration

# A page that chunks into ~30 chunks at 120 tokens (one per section).
LONG_PAGE = "# Long reference\n\n" + "".join(
    f"## Setting {i}\n\n"
    + " ".join(f"Setting {i} controls the zone {i} sensor behaviour in detail." for _ in range(6))
    + "\n\n"
    for i in range(30)
)


async def _ingest(
    store: PgDocumentStore, root: Path, embedder: SentenceTransformerEmbedder
) -> IngestReport:
    settings = Settings(agent_service_home=root.parent / "home")
    options = IngestOptions(roots=[(root, [])], executor="local", max_tokens=120)
    return await run_ingest(store, ingest_config(settings), options, embedder=embedder)


async def test_each_batch_of_documents_costs_one_fixed_transaction_and_a_rerun_writes_nothing(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs", {**PAGES, "public/long.md": LONG_PAGE})
    n_docs = len(PAGES) + 1
    store = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=1)
    wire: WireLog = await log_pool(store.pool)
    try:
        first = await _ingest(store, root, minilm)
        first_run = wire.labels(setup=False)
        setup = wire.setup_trips()
        wire.clear()
        second = await _ingest(store, root, minilm)
        second_run = wire.labels()
        chunk_counts = [
            r["chunk_count"] for r in await store.pool.fetch("SELECT chunk_count FROM documents")
        ]
    finally:
        await store.close()

    assert (first.new, first.unchanged) == (n_docs, 0)
    # Documents from 1 to ~30 chunks...
    assert min(chunk_counts) == 1 and max(chunk_counts) >= 25, chunk_counts
    # ...are written in batches (whole documents, as the embedder finishes them), each batch
    # the same 8 round trips (7 statements, all its chunks in one COPY): the run is 2, then 2
    # to find the vector index there (a small run inserts into it), then 8 per batch, and
    # there are at most as many batches as documents.
    batches = (len(first_run) - 4) // 8
    assert 1 <= batches <= n_docs
    assert first_run == LIST_DOCUMENTS + FIND_VECTOR_INDEX + WRITE_DOCUMENT * batches
    # On top, each statement is prepared once for the whole run (the connection's statement
    # cache): 6 statements, plus at most one close of the type-introspection statement that
    # pgvector's register_vector (the pool's init) leaves behind.
    prepared = [t.sql for t in setup if t.kind == "prepare"]
    assert len(prepared) == len(set(prepared)) == 6, prepared
    assert len(setup) <= 7, setup

    # An unchanged re-run reads the fingerprints (one statement, already prepared) and writes
    # nothing.
    assert (second.unchanged, second.new, second.replaced, second.chunks_written) == (
        n_docs,
        0,
        0,
        0,
    )
    assert second_run == LIST_DOCUMENTS
