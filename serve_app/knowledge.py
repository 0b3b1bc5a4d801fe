"""Wiring for the knowledge base: open the configured store, build the retriever.

Used by the CLI, the ingestion job and (later) the Serve deployments, so every entry point
applies the same checks (schema at head, embedding dimension)."""

from __future__ import annotations

from retrieval.acl import caller_entries
from retrieval.embedders import Embedder, build_embedder
from retrieval.rerankers import Reranker, build_reranker
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import PgDocumentStore
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
    )


def retrieval_config(settings: Settings) -> RetrievalConfig:
    return RetrievalConfig(
        top_k_vector=settings.top_k_vector,
        top_k_keyword=settings.top_k_keyword,
        top_k_rerank=settings.top_k_rerank,
        top_k_final=settings.top_k_final,
        rrf_k=settings.rrf_k,
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


__all__ = ["build_retriever", "caller_entries", "open_store", "retrieval_config"]
