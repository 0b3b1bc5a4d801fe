"""``RetrievalConfig.sides``: one side of the hybrid search alone (what the retrieval-quality
benchmark compares with their fusion), and the default left as it was."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from foundation.acl import caller_entries
from retrieval.embedders import SentenceTransformerEmbedder
from retrieval.rerankers import NoopReranker
from retrieval.search import HybridRetriever, RetrievalConfig, Sides
from retrieval.store import Candidate, PgDocumentStore


@dataclass
class RecordingStore:
    """Returns a fixed candidate list and records the depths it was asked for."""

    rows: list[Candidate]
    asked: list[tuple[int, int]] = field(default_factory=list)

    async def hybrid_candidates(
        self,
        query_text: str,
        query_vector: np.ndarray[Any, np.dtype[np.float32]],
        acl: Sequence[str],
        *,
        k_vector: int,
        k_keyword: int,
    ) -> list[Candidate]:
        self.asked.append((k_vector, k_keyword))
        # As the SQL does: each side's list is cut at its depth; a chunk in neither is gone.
        found = [
            dataclasses.replace(
                c,
                vector_rank=c.vector_rank if (c.vector_rank or k_vector + 1) <= k_vector else None,
                keyword_rank=c.keyword_rank
                if (c.keyword_rank or k_keyword + 1) <= k_keyword
                else None,
            )
            for c in self.rows
        ]
        return [c for c in found if c.vector_rank or c.keyword_rank]

    async def documents(self) -> dict[str, Any]:
        return {}

    async def write_document(self, doc: Any) -> Any:
        raise NotImplementedError

    async def write_documents(self, docs: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    async def delete_sources(self, sources: Iterable[str]) -> int:
        return 0

    async def counts(self) -> tuple[int, int]:
        return 0, 0

    async def close(self) -> None:
        return None


class OneVector:
    name, dim, max_tokens = "fake", 2, 64

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def encode(self, texts: Sequence[str]) -> Any:
        return np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2)

    async def aencode(self, texts: Sequence[str]) -> Any:
        return self.encode(texts)


def _candidate(chunk: str, vector: int | None, keyword: int | None) -> Candidate:
    distance = None if vector is None else 0.1 * vector
    return Candidate(chunk, "s.md", None, "S", "prose", chunk, vector, keyword, distance)


CANDIDATES = [
    _candidate("both", 2, 1),
    _candidate("vector-first", 1, None),
    _candidate("keyword-second", None, 2),
]


@pytest.mark.parametrize(
    ("sides", "depths", "order"),
    [
        ("hybrid", (40, 80), ["both", "vector-first", "keyword-second"]),
        ("vector", (40, 0), ["vector-first", "both"]),
        ("keyword", (0, 80), ["both", "keyword-second"]),
    ],
)
async def test_a_side_alone_asks_the_store_for_none_of_the_other(
    sides: Sides, depths: tuple[int, int], order: list[str]
) -> None:
    store = RecordingStore(CANDIDATES)
    config = RetrievalConfig(sides=sides)
    retriever = HybridRetriever(store, OneVector(), NoopReranker(), config)
    hits = await retriever.search("q", acl=[], top_k=5)
    assert store.asked == [depths]
    assert [h.chunk_id for h in hits] == order  # that side's own rank order
    if sides != "hybrid":
        assert all(h.vector_rank is None or h.keyword_rank is None for h in hits)


def test_the_default_is_the_hybrid_search() -> None:
    config = RetrievalConfig()
    assert config.sides == "hybrid"
    assert (config.k_vector, config.k_keyword) == (config.top_k_vector, config.top_k_keyword)


@pytest.fixture(scope="module")
async def store(sample_docs_url: str) -> AsyncIterator[PgDocumentStore]:
    opened = await PgDocumentStore.connect(sample_docs_url, embedding_dim=384, max_size=2)
    yield opened
    await opened.close()


@pytest.mark.integration
async def test_each_side_alone_in_the_real_store(
    store: PgDocumentStore, minilm: SentenceTransformerEmbedder
) -> None:
    acl = caller_entries(["business_staff"], ["acme"])
    query = "What does CV-E1033 on the MQTT error topic mean?"

    async def search(sides: Sides) -> list[Any]:
        retriever = HybridRetriever(
            store, minilm, NoopReranker(), RetrievalConfig(top_k_final=5, sides=sides)
        )
        return await retriever.search(query, acl=acl, top_k=10)

    vector, keyword = await search("vector"), await search("keyword")
    hybrid = await search("hybrid")
    assert [h.vector_rank for h in vector] == list(range(1, 11))
    assert all(h.keyword_rank is None and h.similarity is not None for h in vector)
    assert [h.keyword_rank for h in keyword] == list(range(1, 11))
    assert all(h.vector_rank is None and h.similarity is None for h in keyword)
    assert any(h.vector_rank and h.keyword_rank for h in hybrid)  # both sides, fused
