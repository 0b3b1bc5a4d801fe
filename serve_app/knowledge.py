"""``LazyStore``: the knowledge base opened on first use (and again after a failure)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from foundation.database import resolve_database_url
from foundation.settings import Settings
from retrieval.store import (
    Candidate,
    DocumentRecord,
    PgDocumentStore,
    StoreConfig,
    StoredDocument,
    WriteOutcome,
)
from serve_app.lazy import OpenedOnFirstUse


async def connect_store(config: StoreConfig, url: str) -> PgDocumentStore:
    """A pool on ``url``; checks the schema is at head with EMBEDDING_DIM
    (``config``: ``serve_app.wiring.store_config``)."""
    return await PgDocumentStore.open(url, config)


class LazyStore:
    """The ``DocumentStore`` port over a ``PgDocumentStore`` opened on first use (and again
    after a failed attempt). ``PgDocumentStore.connect`` checks the schema and dimension."""

    def __init__(self, settings: Settings, config: StoreConfig) -> None:
        self._settings = settings  # DATABASE_URL, or the embedded server under its home
        self._config = config
        self._url: str | None = None
        self._store = OpenedOnFirstUse(self._connect)

    @property
    def opened(self) -> PgDocumentStore | None:
        return self._store.opened

    async def url(self) -> str:
        """DATABASE_URL, or the embedded server's (started on demand, once)."""
        if self._url is None:
            self._url = await resolve_database_url(self._settings)
        return self._url

    async def _connect(self) -> PgDocumentStore:
        return await connect_store(self._config, await self.url())

    async def get(self) -> PgDocumentStore:
        return await self._store.get()

    async def documents(self) -> dict[str, StoredDocument]:
        return await (await self.get()).documents()

    async def write_document(self, doc: DocumentRecord) -> WriteOutcome:
        return await (await self.get()).write_document(doc)

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]:
        return await (await self.get()).write_documents(docs)

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

    async def visible_chunk_ids(self, chunk_ids: Iterable[str], acl: Sequence[str]) -> set[str]:
        return await (await self.get()).visible_chunk_ids(chunk_ids, acl)

    async def counts(self) -> tuple[int, int]:
        return await (await self.get()).counts()

    async def close(self) -> None:
        await self._store.close()


__all__ = ["LazyStore", "connect_store"]
