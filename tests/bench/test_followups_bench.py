"""``bench.followups`` without a database: the real dataset loads, its retrieval part scores
a searcher (here one that returns a fixed page), and its end-to-end part runs two of the
conversations through the real agent, tools and in-process simulators with the scripted
model and a fake retriever, in each condition; and its over-HTTP mode against a fake
service (``httpx.MockTransport``). The benchmark's figures are in
bench/RESULTS.md; this only keeps the module working (well under 5 s)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import jwt

from agent.answer import AgentAnswer, CitationOut
from bench import followups as bench
from evals.followups import load_followups
from local_world.clock import FixedClock
from local_world.world import build_world
from retrieval.search import SearchHit

ROOT = Path(__file__).resolve().parent.parent.parent
CLOCK_SKEW = "Error code reference > Ingestion (CV-E1030 – CV-E1034) > CV-E1033 – Clock skew"


def _hit(section: str, text: str) -> SearchHit:
    return SearchHit(
        chunk_id="c-" + str(abs(hash(section)) % 10_000),
        source=str(ROOT / "documentation/developer/error-codes.md"),
        title="Error code reference",
        section=section,
        kind="text",
        text=text,
        fused_score=0.03,
        rerank_score=None,
        vector_rank=1,
        keyword_rank=1,
        similarity=0.7,
    )


@dataclass
class CodeSearcher:
    """Finds the clock-skew entry only when the query names CV-E1033."""

    queries: list[str]

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[SearchHit]:
        self.queries.append(query)
        if "CV-E1033" not in query:
            return []
        return [_hit(CLOCK_SKEW, "CV-E1033 – Clock skew. Fix: enable NTP on the gateway.")]


def test_the_dataset_has_thirty_conversations_of_two_and_three_turns() -> None:
    dataset = load_followups(ROOT / "evals/datasets/followups.yaml", repo_root=ROOT)
    assert len(dataset.conversations) >= 30
    assert {len(c.turns) for c in dataset.conversations} == {2, 3}
    assert all(c.turns[i].standalone for c, i in dataset.follow_ups())


async def test_retrieval_and_end_to_end_on_two_conversations() -> None:
    dataset = load_followups(ROOT / "evals/datasets/followups.yaml", repo_root=ROOT)
    chosen = [c for c in dataset.conversations if c.id in ("err-clock-skew", "live-floors")]
    dataset = replace(dataset, conversations=tuple(chosen))
    searcher = CodeSearcher([])
    world = build_world()

    rows = await bench.score_retrieval(dataset, searcher, world)
    fix = next(r for r in rows if r.conversation == "err-clock-skew" and r.turn == 2)
    assert fix.queries["raw"] == "How do I fix it?"
    assert fix.recall == {"raw": 0.0, "rewritten": 1.0, "standalone": 1.0}
    floors = next(r for r in rows if r.conversation == "live-floors")
    assert floors.resolved == {"raw": False, "rewritten": True, "standalone": True}

    make, client = bench.in_process_tools(world, searcher, FixedClock(bench.PINNED))
    try:
        runs = await bench.run_e2e(dataset, make)
    finally:
        await client.aclose()
    outcome = {(r.conversation, r.turn, r.condition): r.passed for r in runs}
    assert outcome[("err-clock-skew", 2, "raw")] is False  # "How do I fix it?" finds nothing
    assert outcome[("err-clock-skew", 2, "rewritten")] is True
    assert outcome[("err-clock-skew", 2, "standalone")] is True
    assert outcome[("live-floors", 2, "raw")] is False  # no building to ground
    assert outcome[("live-floors", 2, "rewritten")] is True
    report = bench.Report(dataset, rows, runs)
    summary = bench.summary_markdown(report)
    assert "| rewritten |" in summary and "End to end" in summary


SECRET = "test-secret-0123456789abcdef0123456789abcdef"


def fake_service(asked: list[dict[str, Any]]) -> httpx.MockTransport:
    """An /ask that keeps threads: it cites the clock-skew entry when the question or an
    earlier turn of its thread names CV-E1033; it refuses the live-floors first question."""
    threads: dict[str, list[str]] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/readyz":
            return httpx.Response(200, json={"ok": True})
        body = json.loads(request.content)
        token = request.headers["authorization"].removeprefix("Bearer ")
        claims = jwt.decode(token, SECRET, algorithms=["HS256"])
        asked.append({**body, "sub": claims["sub"], "domains": claims["domains"]})
        if body["question"] == "Which rooms does Northwind HQ have?":
            return httpx.Response(503, json={"error": {"code": "backend_unavailable"}})
        thread = body.get("conversation_id") or str(uuid.uuid4())
        threads.setdefault(thread, []).append(body["question"])
        found = any("CV-E1033" in q for q in threads[thread])
        hit = _hit(CLOCK_SKEW, "CV-E1033 – Clock skew.")
        answer = AgentAnswer(
            answer="See the documentation." if found else "I don't know.",
            decision="answered" if found else "idk",
            answered_by="model",
            idk=not found,
            model="fake/model",
            citations=[
                CitationOut(
                    chunk_id=hit.chunk_id, source=hit.source, section=hit.section, snippet=hit.text
                )
            ]
            if found
            else [],
        )
        return httpx.Response(
            200, json={**answer.model_dump(mode="json"), "conversation_id": thread}
        )

    return httpx.MockTransport(handle)


async def test_over_http_threaded_and_standalone() -> None:
    dataset = load_followups(ROOT / "evals/datasets/followups.yaml", repo_root=ROOT)
    chosen = [c for c in dataset.conversations if c.id in ("err-clock-skew", "live-floors")]
    dataset = replace(dataset, conversations=tuple(chosen))
    asked: list[dict[str, Any]] = []

    report = await bench.run_service(dataset, "http://svc/", SECRET, transport=fake_service(asked))

    outcome = {(r.conversation, r.turn, r.condition): r for r in report.e2e}
    assert outcome[("err-clock-skew", 2, "threaded")].passed  # the thread names CV-E1033
    assert outcome[("err-clock-skew", 2, "standalone")].passed
    assert not outcome[("err-clock-skew", 3, "threaded")].passed  # cites the wrong page
    floors = outcome[("live-floors", 2, "threaded")]  # turn 1 refused: no thread to continue
    assert (floors.passed, floors.decision, floors.latency_ms) == (False, "error", None)
    assert outcome[("live-floors", 2, "standalone")].decision == "idk"
    assert all(r.latency_ms is not None for r in report.e2e if r.decision != "error")
    # warm-up, err-clock-skew 3 turns + 2 standalone, live-floors turn 1 + 1 standalone
    assert len(asked) == 1 + 5 + 2
    threaded = asked[1:4]
    assert "conversation_id" not in threaded[0]
    assert threaded[1]["conversation_id"] == threaded[2]["conversation_id"]
    assert "conversation_id" not in asked[4]  # standalone: a new conversation
    assert asked[1]["sub"] == "bench-staff_acme" and asked[1]["domains"] == ["acme"]
    summary = bench.summary_markdown(report)
    assert "| threaded | 1/3 (33%) |" in summary and "p95 |" in summary
    assert "2 of 2" in report.context["conversations run"]
    assert "turn 2, threaded" in bench.report_markdown(report)


def test_the_split_picks_the_conversations_and_the_summary_says_which() -> None:
    default = bench.parse_args([])
    assert default.split == "dev"
    assert [p.name for p in default.datasets] == ["followups.yaml", "test-followups.yaml"]
    dev = default.load()
    assert {c.split for c in dev.conversations} == {"dev"}
    assert len(dev.conversations) == 41
    frozen = bench.parse_args(["--split", "test", "--world", "sample"]).load()
    assert {c.split for c in frozen.conversations} == {"test"}
    assert frozen.worlds == ("sample",)
    one = bench.parse_args(["--dataset", str(ROOT / "evals/datasets/followups.yaml")])
    assert len(one.load().conversations) == 41
    summary = bench.summary_markdown(bench.Report(frozen, []))
    assert summary.startswith(f"split test: {len(frozen.conversations)} conversations")
    assert "test-followups.yaml" in summary
