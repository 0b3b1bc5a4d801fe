"""``Retriever`` deployment: query embedding (batched across requests), the hybrid SQL on an
asyncpg pool per replica, fusion, and reranking through the ``Reranker`` deployment."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.metrics import RayServeMetrics
from foundation.tracing import use_context
from retrieval.embedders import Embedder, Vectors, build_embedder
from retrieval.rerankers import NoopReranker, Reranker
from retrieval.search import SearchHit
from serve_app.knowledge import LazyStore
from serve_app.metrics import MetricsSink, retrieval_measurement
from serve_app.readiness import ReadinessCheck, lazy_store_checks
from serve_app.wiring import build_retriever, embedder_config, replica_settings, store_config


class _HandleReranker:
    """The ``Reranker`` port over the Reranker deployment's handle."""

    def __init__(self, name: str, handle: DeploymentHandle[Any]) -> None:
        self.name = name
        self._handle = handle

    def score(self, query: str, passages: Sequence[str]) -> list[float]:  # pragma: no cover
        raise RuntimeError("use ascore: the reranker runs in its own deployment")

    async def ascore(self, query: str, passages: Sequence[str]) -> list[float]:
        scores: list[float] = await self._handle.score.remote(query, list(passages))
        return scores


class _BatchedQueryEmbedder:
    """The ``Embedder`` port whose ``aencode`` of one query joins a cross-request batch."""

    def __init__(self, inner: Embedder, batch: Any) -> None:
        self._inner = inner
        self._batch = batch
        self.name = inner.name
        self.dim = inner.dim
        self.max_tokens = inner.max_tokens

    def count_tokens(self, text: str) -> int:
        return self._inner.count_tokens(text)

    def encode(self, texts: Sequence[str]) -> Vectors:
        return self._inner.encode(texts)

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        if len(texts) != 1:
            return await self._inner.aencode(texts)
        row = await self._batch(texts[0])
        return np.asarray([row], dtype=np.float32)


@serve.deployment(
    name="Retriever",
    ray_actor_options={"num_cpus": 0.25},
    max_ongoing_requests=64,
    autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 32},
)
class RetrieverDeployment:
    def __init__(self, reranker: DeploymentHandle[Any]) -> None:
        settings = replica_settings("Retriever")
        self.settings = settings
        self.metrics: MetricsSink = RayServeMetrics()
        self.embedder = build_embedder(embedder_config(settings))
        ranker: Reranker = (
            NoopReranker()
            if settings.retrieval.reranker == "noop"
            else _HandleReranker(settings.retrieval.reranker_model or "cross-encoder", reranker)
        )
        # Opened on first use (and again after a failure), so a replica starts and reports
        # "database down" through /readyz instead of crash-looping while it is away.
        self.store = LazyStore(settings, store_config(settings))
        self.retriever = build_retriever(
            settings,
            self.store,
            embedder=_BatchedQueryEmbedder(self.embedder, self._embed_one),
            reranker=ranker,
        )

    # No wait: a lone query goes at once; queries arriving during a forward pass form the
    # next batch (one batch at a time), so batches still form under load.
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0)
    async def _embed_one(self, queries: list[str]) -> list[Vectors]:
        vectors = await self.embedder.aencode(queries)
        return list(vectors)

    async def search(
        self,
        query: str,
        acl: Sequence[str],
        top_k: int | None = None,
        trace_context: dict[str, str] | None = None,
    ) -> list[SearchHit]:
        started = time.perf_counter()
        with use_context(trace_context):
            hits = await self.retriever.search(query, acl=acl, top_k=top_k)
        self.metrics.record([retrieval_measurement((time.perf_counter() - started) * 1000.0)])
        return hits

    async def readiness(self) -> list[ReadinessCheck]:
        return await lazy_store_checks(self.store, self.settings)
