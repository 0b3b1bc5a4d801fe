"""Ingestion against the real embedded PostgreSQL and the real MiniLM embedder."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foundation.settings import Settings
from ingest_jobs.pipeline import (
    IngestFailed,
    IngestOptions,
    IngestProgress,
    IngestReport,
    run_ingest,
)
from retrieval.embedders import SentenceTransformerEmbedder
from retrieval.store import (
    VECTOR_INDEX,
    VECTOR_INDEX_EXISTS_SQL,
    DocumentRecord,
    PgDocumentStore,
    WriteOutcome,
)
from serve_app.cli.db import db_up
from serve_app.wiring import ingest_config
from tests.ingest_jobs.corpus import PAGES, HashedEmbedder, write_corpus

pytestmark = pytest.mark.integration


async def _store(url: str) -> PgDocumentStore:
    return await PgDocumentStore.connect(url, embedding_dim=384, max_size=4)


async def _ingest(
    store: Any,
    root: Path,
    embedder: Any,
    *,
    prune: bool = False,
    defer_index: str = "auto",
    batch_size: int = 32,
) -> IngestReport:
    settings = Settings(
        agent_service_home=root.parent / "home", ingest_defer_vector_index=defer_index
    )
    options = IngestOptions(
        roots=[(root, [])], prune=prune, executor="local", max_tokens=120, batch_size=batch_size
    )
    return await run_ingest(store, ingest_config(settings), options, embedder=embedder)


async def snapshot(url: str) -> dict[str, Any]:
    """Everything a clean ingest determines: documents, chunks, embeddings, ACLs."""
    import asyncpg
    from pgvector.asyncpg import register_vector

    conn = await asyncpg.connect(url)
    await register_vector(conn)
    try:
        docs = await conn.fetch(
            "SELECT source, title, content_hash, fingerprint, permissions, chunk_count "
            "FROM documents ORDER BY source"
        )
        chunks = await conn.fetch(
            "SELECT c.id, d.source, c.ordinal, c.text, c.section, c.kind, c.permissions, "
            "c.embedding FROM chunks c JOIN documents d ON d.id = c.document_id ORDER BY c.id"
        )
    finally:
        await conn.close()
    return {
        "documents": [tuple(r) for r in docs],
        "chunks": [tuple(r)[:-1] for r in chunks],
        "embeddings": np.array([_vec(r["embedding"]) for r in chunks]),
    }


def _vec(value: Any) -> Any:
    return value.to_numpy() if hasattr(value, "to_numpy") else np.asarray(value)


def assert_same_store(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["documents"] == b["documents"]
    assert a["chunks"] == b["chunks"]
    assert a["embeddings"].shape == b["embeddings"].shape
    worst = float(np.abs(a["embeddings"] - b["embeddings"]).max(initial=0.0))
    assert worst <= 1e-5, f"embeddings differ by up to {worst:.2e}"


async def test_second_run_is_all_unchanged(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    store = await _store(db_url)
    try:
        first = await _ingest(store, root, minilm)
        assert (first.new, first.unchanged, first.replaced) == (len(PAGES), 0, 0)
        assert first.chunks_written > len(PAGES)
        second = await _ingest(store, root, minilm)
        assert (second.new, second.unchanged, second.replaced, second.chunks_written) == (
            0,
            len(PAGES),
            0,
            0,
        )
        docs, chunks = await store.counts()
        assert (docs, chunks) == (len(PAGES), first.chunks_written)
    finally:
        await store.close()


async def test_detail_hears_what_was_found_then_each_chunk_embedded_and_written(
    db_url: str, tmp_path: Path
) -> None:
    """``run_ingest(detail=...)``, what the CLI's progress display shows: the sources found
    and the documents and chunks to ingest first, then every chunk embedded, then what is
    written; a second run finds nothing to ingest."""
    root = write_corpus(tmp_path / "docs")
    settings = Settings(agent_service_home=tmp_path / "home")
    options = IngestOptions(roots=[(root, [])], executor="local", max_tokens=120)
    heard: list[IngestProgress] = []
    again: list[IngestProgress] = []
    store = await _store(db_url)
    try:
        report = await run_ingest(
            store, ingest_config(settings), options, embedder=HashedEmbedder(), detail=heard.append
        )
        await run_ingest(
            store, ingest_config(settings), options, embedder=HashedEmbedder(), detail=again.append
        )
    finally:
        await store.close()
    n, chunks = len(PAGES), report.chunks_written
    assert heard[0] == IngestProgress(discovered=n, documents=n, chunks=chunks)
    embedded = [p.chunks_embedded for p in heard]
    assert embedded == sorted(embedded) and set(range(chunks + 1)) <= set(embedded)
    written = [(p.documents_written, p.chunks_written) for p in heard]
    assert written == sorted(written) and written[-1] == (n, chunks)
    assert heard[-1].chunks_embedded == chunks
    assert again and set(again) == {IngestProgress(discovered=n, unchanged=n)}


async def test_changed_source_replaces_document_and_chunks(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    store = await _store(db_url)
    try:
        await _ingest(store, root, minilm)
        page = root / "public/overview.md"
        page.write_text(page.read_text() + "\n## Alerts\n\nA brand new paragraph on alerts.\n")
        report = await _ingest(store, root, minilm)
        assert (report.new, report.replaced, report.unchanged) == (0, 1, len(PAGES) - 1)
        rows = await store.pool.fetch(
            "SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id "
            "WHERE d.source = $1",
            page.as_posix(),
        )
        assert any("brand new paragraph" in r["text"] for r in rows)
        assert (
            await store.pool.fetchval(
                "SELECT count(*) FROM documents WHERE source = $1", page.as_posix()
            )
            == 1
        )
        # The replaced store equals a clean ingest of the new files.
        after = await snapshot(db_url)
    finally:
        await store.close()
    clean_url = db_url  # reuse: wipe and ingest from scratch
    store = await _store(clean_url)
    try:
        await store.pool.execute("DELETE FROM documents")
        await _ingest(store, root, minilm)
    finally:
        await store.close()
    assert_same_store(after, await snapshot(clean_url))


async def test_acl_change_in_front_matter_takes_effect(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    store = await _store(db_url)
    try:
        await _ingest(store, root, minilm)
        page = root / "acme/acme-rules.md"
        page.write_text(page.read_text().replace("[domain:acme]", "[domain:globex]"))
        report = await _ingest(store, root, minilm)
        assert report.replaced == 1
        perms = await store.pool.fetch(
            "SELECT DISTINCT c.permissions FROM chunks c JOIN documents d "
            "ON d.id = c.document_id WHERE d.source = $1",
            page.as_posix(),
        )
        assert [list(r["permissions"]) for r in perms] == [["domain:globex"]]
    finally:
        await store.close()


async def test_prune_deletes_documents_whose_source_is_gone(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    store = await _store(db_url)
    try:
        await _ingest(store, root, minilm)
        (root / "public/tour.qd").unlink()
        kept = await _ingest(store, root, minilm)
        assert kept.pruned == 0
        assert (await store.counts())[0] == len(PAGES)
        pruned = await _ingest(store, root, minilm, prune=True)
        assert pruned.pruned == 1
        assert (await store.counts())[0] == len(PAGES) - 1
        orphans = await store.pool.fetchval(
            "SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id = c.document_id "
            "WHERE d.id IS NULL"
        )
        assert orphans == 0
    finally:
        await store.close()


async def test_undecodable_and_malformed_pages_are_skipped_with_a_reason(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    (root / "public/latin1.md").write_bytes("# Caf\xe9 menu\n\nCr\xeape".encode("latin-1"))
    (root / "public/bad-acl.md").write_text("---\npermissions: [superuser]\n---\n# x\n\ny\n")
    (root / "public/empty.md").write_text("")
    store = await _store(db_url)
    try:
        report = await _ingest(store, root, minilm)
        assert report.skipped == 2
        reasons = " | ".join(report.skip_reasons)
        assert "latin1.md" in reasons and "UTF-8" in reasons
        assert "bad-acl.md" in reasons and "superuser" in reasons
        # The empty page is recorded (so it counts as unchanged next time) with no chunks.
        assert report.new == len(PAGES) + 1
        again = await _ingest(store, root, minilm)
        assert again.unchanged == len(PAGES) + 1
    finally:
        await store.close()


class CrashingStore:
    """Delegates to a real store and dies (like a killed process) at the write that would take
    it past ``after`` documents (writes are batches of whole documents)."""

    def __init__(self, inner: PgDocumentStore, after: int) -> None:
        self.inner = inner
        self.after = after
        self.written = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write_documents(self, docs: list[DocumentRecord]) -> list[str]:
        if self.written + len(docs) > self.after:
            raise KeyboardInterrupt("simulated kill between writes")
        self.written += len(docs)
        return list(await self.inner.write_documents(docs))


@pytest.mark.parametrize("crash_after", [0, 1, 3, 6])
async def test_crash_between_documents_then_rerun_equals_clean_ingest(
    pg_admin_url: str,
    db_url: str,
    tmp_path: Path,
    minilm: SentenceTransformerEmbedder,
    crash_after: int,
) -> None:
    root = write_corpus(tmp_path / "docs")
    store = await _store(db_url)
    try:
        crashing = CrashingStore(store, crash_after)
        with pytest.raises(KeyboardInterrupt):
            await _ingest(crashing, root, minilm)
        docs, _ = await store.counts()
        assert docs == crashing.written <= crash_after
        # No half-written document: each one has exactly its chunks.
        bad = await store.pool.fetchval(
            "SELECT count(*) FROM documents d WHERE chunk_count <> "
            "(SELECT count(*) FROM chunks c WHERE c.document_id = d.id)"
        )
        assert bad == 0
        report = await _ingest(store, root, minilm)
        assert report.new == len(PAGES) - crashing.written
        assert report.unchanged == crashing.written
    finally:
        await store.close()
    crashed = await snapshot(db_url)
    await asyncio.sleep(0)
    # A clean ingest of the same files into the same (wiped) schema gives the same store.
    store = await _store(db_url)
    try:
        await store.pool.execute("DELETE FROM documents")
        await _ingest(store, root, minilm)
    finally:
        await store.close()
    assert_same_store(crashed, await snapshot(db_url))


class FailingEmbedder:
    """The real embedder until its ``fail_on``-th batch, which raises (a dying model server,
    an out-of-memory actor: any failure inside the pipeline)."""

    def __init__(self, inner: SentenceTransformerEmbedder, fail_on: int) -> None:
        self.inner, self.fail_on, self.calls = inner, fail_on, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, texts: list[str]) -> Any:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("embedding server went away\nsecond line of detail")
        return self.inner.encode(texts)


async def test_a_failing_pipeline_names_the_cause_and_the_counts_and_a_rerun_finishes(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    settings = Settings(agent_service_home=tmp_path / "home")
    options = IngestOptions(roots=[(root, [])], executor="local", max_tokens=120, batch_size=1)
    store = await _store(db_url)
    try:
        failing: Any = FailingEmbedder(minilm, fail_on=2)
        with pytest.raises(IngestFailed) as caught:
            await run_ingest(store, ingest_config(settings), options, embedder=failing)
        failed = caught.value
        docs, _ = await store.counts()
        written = failed.report.new
        assert 0 < written == docs < len(PAGES)
        assert len(failed.not_ingested) == len(PAGES) - written
        message = str(failed)
        assert "RuntimeError: embedding server went away" in message
        assert "second line" not in message
        assert (
            f"{written} document(s) written whole, {len(PAGES) - written} not ingested" in message
        )
        assert failed.not_ingested[0] in message and "(local)" in message
        report = await run_ingest(store, ingest_config(settings), options, embedder=minilm)
        assert (report.new, report.unchanged) == (len(PAGES) - written, written)
    finally:
        await store.close()


def _edits_once(page: Path) -> Callable[[str, int, int], None]:
    """A progress callback that saves ``page`` when the run starts embedding: after the run
    hashed it, before any executor reads it again (an editor saving a file mid-run). Not
    from inside an encode call: the in-process executor reads the next pages meanwhile."""

    def progress(event: str, done: int, total: int) -> None:
        if event == "start":
            page.write_text("# Edited\n\nSaved while the run was going.\n", encoding="utf-8")

    return progress


async def test_a_page_edited_mid_run_is_not_stored_under_its_old_hash(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    """The run keeps one page's text in memory at a time and reads each page again to chunk
    it: a page whose bytes changed since they were hashed fails the run by name, rather than
    storing the new text under the old fingerprint (a re-run would then skip it forever)."""
    root = write_corpus(tmp_path / "docs")
    pages = sorted(p for p in root.rglob("*") if p.suffix in {".md", ".markdown", ".qd"})
    edited = pages[-1]
    settings = Settings(agent_service_home=tmp_path / "home")
    options = IngestOptions(roots=[(root, [])], executor="local", max_tokens=120, batch_size=1)
    store = await _store(db_url)
    try:
        with pytest.raises(IngestFailed) as caught:
            await run_ingest(
                store,
                ingest_config(settings),
                options,
                embedder=minilm,
                progress=_edits_once(edited),
            )
        assert f"SourceChanged: {edited.as_posix()} changed while it was being ingested" in str(
            caught.value
        )
        assert edited.as_posix() in caught.value.not_ingested
        report = await run_ingest(store, ingest_config(settings), options, embedder=minilm)
        assert report.new == len(caught.value.not_ingested)
        assert (await store.counts())[0] == len(PAGES)
        again = await run_ingest(store, ingest_config(settings), options, embedder=minilm)
        assert (again.new, again.unchanged) == (0, len(PAGES))  # stored under its new hash
    finally:
        await store.close()


class IndexWatchingStore(PgDocumentStore):
    """The real store, noting at every write whether the HNSW index exists."""

    index_at_writes: list[bool]

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]:
        self.index_at_writes = [*getattr(self, "index_at_writes", []), await _has_index(self)]
        return await super().write_documents(docs)


async def _has_index(store: PgDocumentStore) -> bool:
    return bool(await store.pool.fetchval(VECTOR_INDEX_EXISTS_SQL, VECTOR_INDEX))


async def _watching_store(url: str) -> IndexWatchingStore:
    return await IndexWatchingStore.connect(url, embedding_dim=384, max_size=4)


async def test_a_bulk_load_writes_without_the_vector_index_and_builds_it_after(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    store = await _watching_store(db_url)
    try:
        await _ingest(store, root, minilm, defer_index="always")
        assert store.index_at_writes and not any(store.index_at_writes)
        assert await _has_index(store)
        definition = await store.pool.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1", VECTOR_INDEX
        )
        assert "hnsw (embedding vector_cosine_ops)" in definition and "m='16'" in definition
        bulk = await snapshot(db_url)
        await store.pool.execute("DELETE FROM documents")
        store.index_at_writes = []
        await _ingest(store, root, minilm, defer_index="never")
        assert store.index_at_writes and all(store.index_at_writes)
    finally:
        await store.close()
    assert_same_store(bulk, await snapshot(db_url))


async def test_a_failed_bulk_load_still_builds_the_index_and_a_killed_one_is_mended_next_run(
    db_url: str, tmp_path: Path, minilm: SentenceTransformerEmbedder
) -> None:
    root = write_corpus(tmp_path / "docs")
    store = await _store(db_url)
    try:
        failing: Any = FailingEmbedder(minilm, fail_on=2)
        with pytest.raises(IngestFailed):
            await _ingest(store, root, failing, defer_index="always", batch_size=1)
        assert await _has_index(store)
        await store.drop_vector_index()  # as a kill -9 between the drop and the build leaves it
        report = await _ingest(store, root, minilm, defer_index="never")
        assert report.new > 0 and await _has_index(store)
        await store.drop_vector_index()
        report = await _ingest(store, root, minilm, defer_index="never")
        assert report.new == 0 and not await _has_index(store)  # nothing to embed: left alone
        await db_up(Settings(agent_service_home=tmp_path / "home", database_url=db_url))
        assert await _has_index(store)  # `agent-service db up` mends it
    finally:
        await store.close()
