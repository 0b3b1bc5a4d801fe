"""Wiring for the knowledge base: open the configured store, build the retriever.

Used by the CLI, the ingestion job and (later) the Serve deployments, so every entry point
applies the same checks (schema at head, embedding dimension)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from retrieval.acl import caller_entries
from retrieval.embedders import Embedder, build_embedder
from retrieval.rerankers import Reranker, build_reranker
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import (
    Candidate,
    DocumentRecord,
    PgDocumentStore,
    StoredDocument,
    WriteOutcome,
)
from serve_app.config import Settings
from serve_app.database import migrate, resolve_database_url


async def open_store(settings: Settings, *, migrate_first: bool = False) -> PgDocumentStore:
    """Connect to DATABASE_URL (or the embedded server, started on demand).

    Raises ``DatabaseError`` with an actionable message when the schema is missing or its
    dimension differs from EMBEDDING_DIM."""
    url = await resolve_database_url(settings)
    if migrate_first:
        migrate(url, settings.resolved_embedding_dim)
    return await PgDocumentStore.connect(
        url,
        embedding_dim=settings.resolved_embedding_dim,
        min_size=settings.db_pool_min_size,
        max_size=settings.db_pool_max_size,
        ef_search=settings.hnsw_ef_search,
        keyword_common_rows=settings.keyword_common_rows,
    )


def retrieval_config(settings: Settings) -> RetrievalConfig:
    return RetrievalConfig(
        top_k_vector=settings.top_k_vector,
        top_k_keyword=settings.top_k_keyword,
        top_k_rerank=settings.top_k_rerank,
        top_k_final=settings.top_k_final,
        rrf_k=settings.rrf_k,
        observe_payloads=settings.observe_payloads,
    )


def build_retriever(
    settings: Settings,
    store: PgDocumentStore,
    *,
    embedder: Embedder | None = None,
    reranker: Reranker | None = None,
) -> HybridRetriever:
    return HybridRetriever(
        store,
        embedder or build_embedder(settings),
        reranker or build_reranker(settings),
        retrieval_config(settings),
    )


class LazyStore:
    """The ``DocumentStore`` port over a ``PgDocumentStore`` opened on first use (and again
    after a failed attempt). ``PgDocumentStore.connect`` checks the schema and dimension."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._url: str | None = None
        self._store: PgDocumentStore | None = None
        self._lock = asyncio.Lock()

    @property
    def opened(self) -> PgDocumentStore | None:
        return self._store

    async def url(self) -> str:
        """DATABASE_URL, or the embedded server's (started on demand, once)."""
        if self._url is None:
            self._url = await resolve_database_url(self._settings)
        return self._url

    async def get(self) -> PgDocumentStore:
        if self._store is not None:
            return self._store
        async with self._lock:
            if self._store is None:
                settings = self._settings
                self._store = await PgDocumentStore.connect(
                    await self.url(),
                    embedding_dim=settings.resolved_embedding_dim,
                    min_size=settings.db_pool_min_size,
                    max_size=settings.db_pool_max_size,
                    ef_search=settings.hnsw_ef_search,
                    keyword_common_rows=settings.keyword_common_rows,
                )
            return self._store

    async def documents(self) -> dict[str, StoredDocument]:
        return await (await self.get()).documents()

    async def write_document(self, doc: DocumentRecord) -> WriteOutcome:
        return await (await self.get()).write_document(doc)

    async def delete_sources(self, sources: Iterable[str]) -> int:
        return await (await self.get()).delete_sources(sources)

    async def hybrid_candidates(
        self,
        query_text: str,
        query_vector: np.ndarray[Any, np.dtype[np.float32]],
        acl: Sequence[str],
        *,
        k_vector: int,
        k_keyword: int,
    ) -> list[Candidate]:
        store = await self.get()
        return await store.hybrid_candidates(
            query_text, query_vector, acl, k_vector=k_vector, k_keyword=k_keyword
        )

    async def counts(self) -> tuple[int, int]:
        return await (await self.get()).counts()

    async def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()


__all__ = ["LazyStore", "build_retriever", "caller_entries", "open_store", "retrieval_config"]
