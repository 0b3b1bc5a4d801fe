"""Known-item scoring (``evals.known_item``) against figures computed by hand, with stand-in
searchers (no store, no model)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from evals.known_item import (
    ItemConfig,
    KnownItem,
    KnownItemReport,
    report_jsonl,
    score_known_items,
    summary_markdown,
    summary_table,
)


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    source: str = "synthetic/0.md"
    section: str = ""
    similarity: float | None = None
    rerank_score: float | None = None


@dataclass
class ListSearcher:
    """Returns the chunks of ``ranked[query]`` in order, at most ``top_k``; raises for a
    query in ``failing``; records every ``top_k`` asked."""

    ranked: dict[str, list[str]]
    failing: frozenset[str] = frozenset()
    asked: list[int | None] = field(default_factory=list)

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[Hit]:
        assert acl == ["domain:common"]
        self.asked.append(top_k)
        if query in self.failing:
            raise RuntimeError("tsquery stack too small")
        return [Hit(c) for c in self.ranked.get(query, [])[: top_k or 5]]


ITEMS = [
    KnownItem("q1", "first", "a1"),  # answer at rank 3
    KnownItem("q2", "second", "a2"),  # answer at rank 12: in the pool, not in the top 10
    KnownItem("q3", "third", "a3"),  # not returned
]
FILLER = [f"x{i}" for i in range(30)]
RANKED = {
    "first": ["x1", "x2", "a1", *FILLER],
    "second": [*FILLER[:11], "a2", *FILLER[11:]],
    "third": FILLER,
}


async def test_one_relevant_passage_scores_by_its_rank() -> None:
    searcher = ListSearcher(RANKED)
    config = await score_known_items(
        ITEMS, searcher, "hybrid", final_k=5, pool=20, acl=["domain:common"]
    )
    first, second, third = config.rows
    assert first.ndcg == pytest.approx(1 / math.log2(4))
    assert (first.recall, first.reciprocal_rank, first.hit) == (1.0, pytest.approx(1 / 3), True)
    assert first.scores.first_answer == 3 and first.in_pool
    assert (second.ndcg, second.recall, second.reciprocal_rank) == (0.0, 0.0, 0.0)
    assert second.in_pool  # rank 12 of a pool of 20: a reranker could still lift it
    assert not third.in_pool and third.scores.first_answer is None
    assert searcher.asked == [20, 20, 20]  # one search a query: the pool holds the cuts
    assert config.mean(lambda s: s.ndcg) == pytest.approx((1 / math.log2(4)) / 3)
    assert config.in_pool == pytest.approx(2 / 3)


async def test_a_pool_shallower_than_ten_searches_the_final_cut_on_its_own() -> None:
    searcher = ListSearcher(RANKED)
    config = await score_known_items(
        ITEMS[:1], searcher, "hybrid", final_k=2, pool=5, acl=["domain:common"]
    )
    assert searcher.asked == [10, 2]
    row = config.rows[0]
    assert (row.recall, row.hit) == (0.0, False)  # rank 3 is outside the final 2
    assert row.reciprocal_rank == pytest.approx(1 / 3)


async def test_a_failed_search_is_a_counted_miss() -> None:
    searcher = ListSearcher(RANKED, failing=frozenset({"first"}))
    config = await score_known_items(
        ITEMS[:2], searcher, "keyword only", final_k=5, pool=20, acl=["domain:common"]
    )
    assert config.failed == 1
    failed = config.rows[0]
    assert failed.error == "RuntimeError: tsquery stack too small"
    assert (failed.ndcg, failed.recall, failed.in_pool) == (0.0, 0.0, False)


async def test_the_tables_and_the_jsonl() -> None:
    configs = [
        await score_known_items(
            ITEMS, ListSearcher(RANKED), name, final_k=5, pool=20, acl=["domain:common"]
        )
        for name in ("vector only", "hybrid (RRF)")
    ]
    report = KnownItemReport("Known-item search over 40 paragraphs", 5, 20, configs)
    report.context["date"] = "2026-12-04"
    table = summary_table(report)
    assert table[0] == (
        "| configuration (3 queries) | nDCG@10 | recall@5 | MRR@10 | "
        "in the top 20 (TOP_K_RERANK) | searches failed |"
    )
    assert table[2] == "| vector only | 0.167 | 0.333 | 0.111 | 0.667 | 0 |"
    text = summary_markdown(report)
    assert text.startswith("## Known-item search over 40 paragraphs\n\n- date: 2026-12-04\n")
    lines = [json.loads(line) for line in report_jsonl(report).splitlines()]
    assert len(lines) == 6
    assert lines[0]["id"] == "q1" and lines[0]["first_answer"] == 3
    assert lines[0]["top"][:3] == ["x1", "x2", "a1"] and len(lines[0]["top"]) == 10


def test_an_empty_configuration_means_zero() -> None:
    assert ItemConfig("none").mean(lambda s: s.ndcg) == 0.0
    assert ItemConfig("none").in_pool == 0.0
