"""``Reranker`` deployment: a cross-encoder behind ``@serve.batch`` (or the noop reranker)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ray import serve

from retrieval.rerankers import CrossEncoderReranker, build_reranker
from serve_app.wiring import replica_settings, reranker_config


@serve.deployment(
    name="Reranker",
    ray_actor_options={"num_cpus": 0.25},
    max_ongoing_requests=64,
    autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 32},
)
class RerankerDeployment:
    def __init__(self) -> None:
        settings = replica_settings("Reranker")
        self.reranker = build_reranker(reranker_config(settings))
        self._batch_sizes: deque[int] = deque(maxlen=1000)

    def name(self) -> str:
        return self.reranker.name

    def batch_sizes(self) -> list[int]:
        """How many searches each recent cross-encoder call scored together."""
        return list(self._batch_sizes)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def _score_many(self, items: list[tuple[str, list[str]]]) -> list[list[float]]:
        # Several requests' (query, passage) pairs in one cross-encoder call.
        assert isinstance(self.reranker, CrossEncoderReranker)
        self._batch_sizes.append(len(items))
        pairs = [(query, passage) for query, passages in items for passage in passages]
        flat = self.reranker.score_pairs(pairs)
        out: list[list[float]] = []
        start = 0
        for _, passages in items:
            out.append(flat[start : start + len(passages)])
            start += len(passages)
        return out

    async def score(self, query: str, passages: Sequence[str]) -> list[float]:
        if not isinstance(self.reranker, CrossEncoderReranker):
            return await self.reranker.ascore(query, passages)
        result: list[float] = await self._score_many((query, list(passages)))
        return result
