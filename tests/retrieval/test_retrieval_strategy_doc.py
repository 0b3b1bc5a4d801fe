"""docs/adding-a-retrieval-strategy.md stays true: its worked example keeps the inner search's
order, at most two chunks of a page, passes the caller's ACL through unchanged, and can only
drop chunks, never add one."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from retrieval.search import SearchHit

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-retrieval-strategy.md"


def hit(chunk_id: str, source: str) -> SearchHit:
    text = f"text {chunk_id}"
    return SearchHit(chunk_id, source, None, "Section", "prose", text, 0.1, None, 1, 1)


class InMemoryRetriever:
    """Ranked hits, and what each search asked for."""

    def __init__(self, hits: Sequence[SearchHit]) -> None:
        self.hits = list(hits)
        self.calls: list[tuple[str, tuple[str, ...], int | None]] = []

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[SearchHit]:
        self.calls.append((query, tuple(acl), top_k))
        return self.hits[: top_k or 5]


def per_page_retriever(inner: InMemoryRetriever, **options: Any) -> Any:
    [block] = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    namespace: dict[str, Any] = {
        "Counter": Counter,
        "DEFAULT_TOP_K": 5,
        "Retriever": Any,
        "SearchHit": SearchHit,
        "Sequence": Sequence,
    }
    exec(block, namespace)
    return namespace["PerPageRetriever"](inner, **options)


async def test_at_most_two_chunks_of_a_page_in_the_inner_order() -> None:
    ranked = [hit("a1", "a.md"), hit("a2", "a.md"), hit("a3", "a.md"), hit("b1", "b.md")]
    ranked += [hit("a4", "a.md"), hit("c1", "c.md"), hit("b2", "b.md"), hit("b3", "b.md")]
    inner = InMemoryRetriever(ranked)
    strategy = per_page_retriever(inner)
    found = await strategy.search("cooldown", acl=["role:business_staff", "domain:acme"], top_k=4)
    assert [h.chunk_id for h in found] == ["a1", "a2", "b1", "c1"]
    # The caller's ACL goes to the inner search as it came; more candidates are asked for.
    assert inner.calls == [("cooldown", ("role:business_staff", "domain:acme"), 12)]
    assert {h.chunk_id for h in found} <= {h.chunk_id for h in ranked}


async def test_the_default_depth_and_fewer_candidates_than_asked() -> None:
    inner = InMemoryRetriever([hit("a1", "a.md"), hit("b1", "b.md")])
    found = await per_page_retriever(inner, per_page=1).search("q", acl=[])
    assert [h.chunk_id for h in found] == ["a1", "b1"]
    assert inner.calls[0][2] == 15  # DEFAULT_TOP_K x widen
