"""Known-item retrieval: every query has exactly one relevant passage (the one it was taken
from), scored with the labelled benchmark's metrics and tables (``retrieval_metrics``,
``retrieval_quality``).

A query's passage is graded as an answer (2), everything else 0, so nDCG@10 is the
discounted gain of that one passage (1 / log2(rank + 1)), MRR@10 is 1 / its rank, and
recall@k equals hit@k (one relevant key). One more column says whether the passage was in
the reranker's pool (the top ``TOP_K_RERANK`` of the fusion): what a reranker could
reorder at all. A search that fails (an error from the store) scores zero and is counted.

Each query is searched once for ``max(DEEP_K, pool)`` chunks: with ``TOP_K_RERANK`` at least
``DEEP_K`` the pipeline reranks the same pool whatever ``top_k`` asks for, so the first
``final_k`` and first ``DEEP_K`` of that list are exactly what searches for ``final_k`` and for
``DEEP_K`` return. With a smaller ``TOP_K_RERANK`` the final cut is searched on its own.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evals.retrieval_labels import ANSWERS
from evals.retrieval_metrics import RankScores, rank_scores
from evals.retrieval_quality import (
    DEEP_K,
    RankedScore,
    Searcher,
    fmt,
    markdown_table,
    metric_names,
)

MISSED = RankScores(ndcg=0.0, recall=0.0, reciprocal_rank=0.0, hit=False, first_answer=None)


@dataclass(frozen=True)
class KnownItem:
    id: str
    query: str
    answer: str  # the chunk id of the passage the query was taken from


@dataclass(frozen=True)
class ItemScore:
    item: KnownItem
    returned: tuple[str, ...]  # chunk ids, best first, up to the pool's depth
    scores: RankScores
    in_pool: bool  # the answer among the top ``pool`` (what a reranker could reorder)
    error: str | None = None  # the search failed (scores are zero)

    @property
    def ndcg(self) -> float:
        return self.scores.ndcg

    @property
    def recall(self) -> float:
        return self.scores.recall

    @property
    def reciprocal_rank(self) -> float:
        return self.scores.reciprocal_rank

    @property
    def hit(self) -> bool:
        return self.scores.hit


@dataclass
class ItemConfig:
    name: str
    rows: list[ItemScore] = field(default_factory=list)

    def mean(self, metric: Callable[[RankedScore], float | None]) -> float:
        values = [v for s in self.rows if (v := metric(s)) is not None]
        return statistics.fmean(values) if values else 0.0

    @property
    def in_pool(self) -> float:
        """The share of queries whose answer was in the reranker's pool."""
        return statistics.fmean(s.in_pool for s in self.rows) if self.rows else 0.0

    @property
    def failed(self) -> int:
        return sum(s.error is not None for s in self.rows)


@dataclass
class KnownItemReport:
    title: str
    final_k: int
    pool: int
    configs: list[ItemConfig]
    context: dict[str, str] = field(default_factory=dict)


def score_lists(
    item: KnownItem, final: Sequence[str], deep: Sequence[str], *, final_k: int, pool: int
) -> ItemScore:
    """One query's figures from the chunk ids of its final cut and of its deep search."""
    scores = rank_scores(
        list(final),
        list(deep),
        {item.answer: ANSWERS},
        {item.answer},
        final_k=final_k,
        deep_k=DEEP_K,
    )
    return ItemScore(item, tuple(deep[:pool]), scores, item.answer in deep[:pool])


async def score_known_items(
    items: Sequence[KnownItem],
    searcher: Searcher,
    name: str,
    *,
    final_k: int,
    pool: int,
    acl: Sequence[str],
) -> ItemConfig:
    """Every query through one configuration, as a caller holding ``acl``."""
    config = ItemConfig(name)
    depth = max(DEEP_K, pool)
    for item in items:
        try:
            deep = [h.chunk_id for h in await searcher.search(item.query, acl=acl, top_k=depth)]
            if pool >= DEEP_K:
                final = deep[:final_k]
            else:
                hits = await searcher.search(item.query, acl=acl, top_k=final_k)
                final = [h.chunk_id for h in hits]
        except Exception as exc:  # e.g. PostgreSQL refusing an odd tsquery: a miss, counted
            config.rows.append(ItemScore(item, (), MISSED, False, f"{type(exc).__name__}: {exc}"))
            continue
        config.rows.append(score_lists(item, final, deep, final_k=final_k, pool=pool))
    return config


def summary_table(report: KnownItemReport) -> list[str]:
    metrics = metric_names(report.final_k)
    del metrics[f"hit@{report.final_k}"]  # one relevant passage: hit@k is recall@k
    n = len(report.configs[0].rows) if report.configs else 0
    header = [
        f"configuration ({n} queries)",
        *metrics,
        f"in the top {report.pool} (TOP_K_RERANK)",
        "searches failed",
    ]
    rows = [
        [
            c.name,
            *(fmt(c.mean(m)) for m in metrics.values()),
            fmt(c.in_pool),
            str(c.failed),
        ]
        for c in report.configs
    ]
    return markdown_table(header, rows)


def summary_markdown(report: KnownItemReport) -> str:
    lines = [f"## {report.title}", ""]
    lines += [f"- {key}: {value}" for key, value in report.context.items()]
    lines += ["", *summary_table(report)]
    errors = [(c.name, s) for c in report.configs for s in c.rows if s.error]
    if errors:
        lines += ["", "Failed searches (scored as misses):"]
        lines += [f"- {name}: `{s.item.id}`: {s.error}" for name, s in errors[:20]]
    return "\n".join(lines) + "\n"


def report_jsonl(report: KnownItemReport) -> str:
    """One JSON line per query and configuration: its answer's rank and what came back."""
    lines = []
    for config in report.configs:
        for s in config.rows:
            line = {
                "id": s.item.id,
                "config": config.name,
                "query": s.item.query,
                "answer": s.item.answer,
                "first_answer": s.scores.first_answer,
                "in_pool": s.in_pool,
                "top": list(s.returned[:DEEP_K]),
                "error": s.error,
            }
            lines.append(json.dumps(line, ensure_ascii=False))
    return "\n".join(lines) + "\n"
