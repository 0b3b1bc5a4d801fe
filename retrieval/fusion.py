"""Reciprocal Rank Fusion: score(d) = sum over lists of 1 / (k + rank_d), ranks from 1.

Only positions matter, so a cosine distance and a ts_rank never need a common scale."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def rrf_score(
    ranks: Sequence[int | None], k: int = 60, weights: Sequence[float] | None = None
) -> float:
    """Fused score of one item from its 1-based rank in each list (None: absent); each
    list's term times its weight (weighted RRF; all 1 by default)."""
    if k <= 0:
        raise ValueError("RRF k must be positive")
    weights = weights if weights is not None else [1.0] * len(ranks)
    if len(weights) != len(ranks):
        raise ValueError("one RRF weight per ranked list")
    return sum(w / (k + r) for r, w in zip(ranks, weights, strict=True) if r is not None)


def rrf_fuse(rankings: Sequence[Sequence[K]], k: int = 60) -> list[tuple[K, float]]:
    """Fuse ranked lists of ids into one list of (id, score), best first.

    Ties keep the order of first appearance (list by list), so the result is deterministic."""
    if k <= 0:
        raise ValueError("RRF k must be positive")
    scores: dict[K, float] = {}
    for ranking in rankings:
        seen: set[K] = set()
        for position, item in enumerate(ranking, start=1):
            if item in seen:  # a duplicate within one list counts once, at its best rank
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + position)
    order = {item: i for i, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))
