"""Hybrid retrieval: embed the query, run both searches in one round trip (ACL in SQL), fuse
by RRF, rerank, keep the top ``TOP_K_FINAL``.

The steps are separate methods so a Serve deployment can put the embedder and the reranker in
their own deployments and still reuse the same fusion and selection code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from opentelemetry import context as otel_context

from foundation.observability import attributes as attr
from foundation.observability.spans import Observer, tracer
from retrieval.embedders import Embedder
from retrieval.fusion import rrf_score
from retrieval.rerankers import Reranker
from retrieval.store import Candidate, DocumentStore


@dataclass(frozen=True)
class SearchHit:
    chunk_id: str
    source: str
    title: str | None
    section: str
    kind: str
    text: str
    fused_score: float
    rerank_score: float | None
    vector_rank: int | None
    keyword_rank: int | None
    # Cosine similarity of the query's and the chunk's embeddings (None: found by keyword
    # only): an absolute measure of how close the chunk is, where the ranks are relative.
    similarity: float | None = None

    @property
    def score(self) -> float:
        return self.rerank_score if self.rerank_score is not None else self.fused_score

    def as_dict(self) -> dict[str, object]:
        return {
            "chunk_id": self.chunk_id,
            "source": self.source,
            "title": self.title,
            "section": self.section,
            "kind": self.kind,
            "text": self.text,
            "score": self.score,
            "fused_score": self.fused_score,
            "rerank_score": self.rerank_score,
            "vector_rank": self.vector_rank,
            "keyword_rank": self.keyword_rank,
        }


# Which candidate lists a search draws from: both, fused by RRF (the service), or one alone
# (the retrieval-quality benchmark compares each side with their fusion).
Sides = Literal["hybrid", "vector", "keyword"]


@dataclass(frozen=True)
class RetrievalConfig:
    # TOP_K_KEYWORD and RRF_K were tuned on data: bench/RESULTS.md, "Fusion and depth tuned
    # on a training split" (issue 16, item 4).
    top_k_vector: int = 40
    top_k_keyword: int = 80
    top_k_rerank: int = 20
    top_k_final: int = 5
    rrf_k: int = 10
    # The keyword list's weight in the fusion (the vector list's is 1): RRF_KEYWORD_WEIGHT.
    keyword_weight: float = 1.0
    observe_payloads: bool = False  # OBSERVE_PAYLOADS: query and chunk text on the spans
    sides: Sides = "hybrid"

    @property
    def k_vector(self) -> int:
        """Vector candidates asked of the store: none when only the keyword side runs."""
        return 0 if self.sides == "keyword" else self.top_k_vector

    @property
    def k_keyword(self) -> int:
        """Keyword candidates asked of the store: none when only the vector side runs."""
        return 0 if self.sides == "vector" else self.top_k_keyword


def fuse_candidates(
    candidates: Sequence[Candidate], rrf_k: int, keyword_weight: float = 1.0
) -> list[tuple[Candidate, float]]:
    """RRF over the two rank columns, the keyword one weighted; ties broken by vector rank
    then chunk id (stable)."""
    weights = (1.0, keyword_weight)
    scored = [(c, rrf_score([c.vector_rank, c.keyword_rank], rrf_k, weights)) for c in candidates]
    scored.sort(
        key=lambda cs: (
            -cs[1],
            cs[0].vector_rank if cs[0].vector_rank is not None else 1 << 30,
            cs[0].chunk_id,
        )
    )
    return scored


def embedding_input(section: str, text: str) -> str:
    """What gets embedded for a chunk: its heading path gives the text its context."""
    return f"{section}\n\n{text}" if section else text


class HybridRetriever:
    def __init__(
        self,
        store: DocumentStore,
        embedder: Embedder,
        reranker: Reranker,
        config: RetrievalConfig | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.reranker = reranker
        self.config = config or RetrievalConfig()

    async def embed_query(self, query: str) -> np.ndarray[Any, np.dtype[np.float32]]:
        vectors = await self.embedder.aencode([query])
        return np.asarray(vectors[0], dtype=np.float32)

    async def candidates(
        self, query: str, vector: np.ndarray[Any, np.dtype[np.float32]], acl: Sequence[str]
    ) -> list[tuple[Candidate, float]]:
        rows = await self.store.hybrid_candidates(
            query,
            vector,
            acl,
            k_vector=self.config.k_vector,
            k_keyword=self.config.k_keyword,
        )
        # One side alone: RRF over a single rank is that side's own order.
        return fuse_candidates(rows, self.config.rrf_k, self.config.keyword_weight)

    async def rerank(
        self, query: str, fused: Sequence[tuple[Candidate, float]], top_k: int
    ) -> list[SearchHit]:
        pool = list(fused[: max(self.config.top_k_rerank, top_k)])
        scores: list[float | None]
        if self.reranker.name == "noop":
            scores = [None] * len(pool)
        else:
            texts = [embedding_input(c.section, c.text) for c, _ in pool]
            scores = list(await self.reranker.ascore(query, texts))
        hits = [
            SearchHit(
                chunk_id=c.chunk_id,
                source=c.source,
                title=c.title,
                section=c.section,
                kind=c.kind,
                text=c.text,
                fused_score=fused_score,
                rerank_score=score,
                vector_rank=c.vector_rank,
                keyword_rank=c.keyword_rank,
                similarity=None if c.distance is None else 1.0 - c.distance,
            )
            for (c, fused_score), score in zip(pool, scores, strict=True)
        ]
        if self.reranker.name != "noop":
            hits.sort(key=lambda h: -(h.rerank_score or 0.0))
        return hits[:top_k]

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[SearchHit]:
        """Top chunks the caller (whose ACL entries are ``acl``) may see, best first.

        Traced as ``retrieve.embed``, ``retrieve.vector`` + ``retrieve.keyword`` (both sides run
        in one SQL round trip, so the two spans cover the same interval and say so), and
        ``retrieve.rerank``; children of the current span (the ``tool.search_docs`` span)."""
        k = top_k or self.config.top_k_final
        observer = Observer(payloads=self.config.observe_payloads)
        with tracer().start_as_current_span(
            "retrieve.embed",
            attributes={
                attr.LANGFUSE_TYPE: "embedding",
                attr.GEN_AI_OPERATION: "embeddings",
                attr.GEN_AI_REQUEST_MODEL: self.embedder.name,
                attr.GEN_AI_EMBEDDING_DIM: self.embedder.dim,
            },
            record_exception=False,  # Observer.fail: the message only with payloads on
            set_status_on_exception=False,
        ) as span:
            observer.payload(span, attr.LANGFUSE_INPUT, query)
            try:
                vector = await self.embed_query(query)
            except Exception as exc:
                observer.fail(span, "embedder_error", message=str(exc), exception=exc)
                raise

        parent = otel_context.get_current()
        sides = [
            observer.start(
                f"retrieve.{side}",
                "retriever",
                parent=parent,
                attributes={
                    attr.GEN_AI_OPERATION: "retrieval",
                    attr.GEN_AI_RETRIEVAL_TOP_K: top,
                    attr.RETRIEVE_SHARED_ROUND_TRIP: True,
                },
            )
            for side, top in (
                ("vector", self.config.k_vector),
                ("keyword", self.config.k_keyword),
            )
        ]
        try:
            fused = await self.candidates(query, vector, acl)
        except BaseException as exc:
            for span in sides:
                observer.fail(span, "store_error", message=str(exc), exception=exc)
                span.end()
            raise
        for span, side in zip(sides, ("vector", "keyword"), strict=True):
            ranked = sorted(
                (rank, c.chunk_id, c)
                for c, _ in fused
                if (rank := c.vector_rank if side == "vector" else c.keyword_rank) is not None
            )
            span.set_attribute(attr.GEN_AI_RETRIEVAL_COUNT, len(ranked))
            observer.payload(span, attr.GEN_AI_RETRIEVAL_QUERY, query)
            observer.payload(span, attr.LANGFUSE_INPUT, query)
            if observer.payloads:
                documents = [
                    {"id": c.chunk_id, "rank": rank, "source": c.source} for rank, _, c in ranked
                ]
                observer.payload(span, attr.GEN_AI_RETRIEVAL_DOCUMENTS, documents)
                observer.payload(span, attr.LANGFUSE_OUTPUT, documents)
            span.end()

        with tracer().start_as_current_span(
            "retrieve.rerank",
            attributes={
                attr.LANGFUSE_TYPE: "retriever",
                attr.GEN_AI_OPERATION: "rerank",
                attr.RETRIEVE_RERANKER: self.reranker.name,
                attr.RETRIEVE_CANDIDATES: len(fused),
                attr.GEN_AI_RETRIEVAL_TOP_K: k,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                hits = await self.rerank(query, fused, k)
            except Exception as exc:
                observer.fail(span, "reranker_error", message=str(exc), exception=exc)
                raise
            span.set_attribute(attr.GEN_AI_RETRIEVAL_COUNT, len(hits))
            if observer.payloads:
                documents = [
                    {"id": h.chunk_id, "score": h.score, "source": h.source, "text": h.text}
                    for h in hits
                ]
                observer.payload(span, attr.GEN_AI_RETRIEVAL_QUERY, query)
                observer.payload(span, attr.LANGFUSE_INPUT, query)
                observer.payload(span, attr.GEN_AI_RETRIEVAL_DOCUMENTS, documents)
                observer.payload(span, attr.LANGFUSE_OUTPUT, documents)
        return hits
