"""The usage limits over real HTTP (uvicorn on 127.0.0.1) on the real embedded PostgreSQL (a
fresh database at head per test), with the real Agent in ``LocalBackend`` s, the real Cedar
policies and in-process models.

Two replicas: two app instances, each with its own backend and its own pool on the one
database, served by two uvicorn servers, are sent N+k requests concurrently; exactly k are
refused. That is the claim across Ingress replicas without a second Ray Serve stack: the
counter is the database's, whichever process asks (the Serve Ingress builds the same
``RequestLimits``; its replicas are processes like these). The clock is fixed, so no run
straddles a minute boundary."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from api_helpers import ADMIN, NORTHWIND_STAFF, is_envelope, read_sse

from agent.llm.base import ChatRequest, StreamEvent, TextDelta
from agent.testing import FunctionModel, text_reply
from foundation.settings import Settings
from serve_app.limits import build_request_limits
from serve_app.local_backend import LocalBackend
from serve_app.wiring import limit_policy

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 4, 14, 0, 10, tzinfo=UTC)


@pytest.fixture
def settings(make_settings: Callable[..., Settings], db_url: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return make_settings(
            database_url=db_url,
            embedding_backend="openai",  # never called here: no search_docs
            embedding_model="openai/text-embedding-3-small",
            embedding_dim=384,
            **overrides,
        )

    return make


@pytest.fixture
def replica(
    make_backend: Callable[..., LocalBackend], serve_local: Callable[..., str]
) -> Callable[..., str]:
    """One app instance (its own backend, limits and pool) on uvicorn: its base URL."""

    def start(s: Settings, llm: Any = None) -> str:
        model = llm or FunctionModel(lambda request: text_reply("ok"), model="local/fast")
        limits = build_request_limits(s, limit_policy(s), clock=lambda: NOW)
        return serve_local(s, make_backend(s, llm=model, limits=limits))

    return start


async def usage_rows(db_url: str) -> dict[tuple[str, str], tuple[int, int, float]]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT subject, window_kind, requests, tokens, cost_usd FROM usage_counters"
        )
    finally:
        await conn.close()
    return {
        (r["subject"], r["window_kind"]): (r["requests"], r["tokens"], r["cost_usd"]) for r in rows
    }


async def test_n_plus_k_requests_across_two_replicas_get_exactly_k_429s(
    settings: Callable[..., Settings], replica: Callable[..., str], db_url: str
) -> None:
    n, k = 12, 7
    s = settings(rate_limit_user_per_minute=n, rate_limit_domain_per_minute=1000)
    urls = [replica(s), replica(s)]
    async with httpx.AsyncClient(timeout=60) as http:

        async def ask(i: int, headers: dict[str, str]) -> httpx.Response:
            return await http.post(
                f"{urls[i % 2]}/ask", json={"question": f"hello {i}"}, headers=headers
            )

        staff = await asyncio.gather(*(ask(i, NORTHWIND_STAFF) for i in range(n + k)))
        # the admin is exempt (Cedar's UseLimitTier): never refused, never counted
        admin = await asyncio.gather(*(ask(i, ADMIN) for i in range(n + k)))
    statuses = sorted(r.status_code for r in staff)
    assert statuses == [200] * n + [429] * k, statuses
    for refused in (r for r in staff if r.status_code == 429):
        assert is_envelope(refused.json(), "rate_limited")
        assert refused.headers["retry-after"] == "50"  # the minute's 50 s left
        assert refused.json()["error"]["exceeded"][0]["limit"] == "requests"
    remaining = sorted(int(r.headers["x-ratelimit-remaining"]) for r in staff)
    assert remaining[k:] == list(range(n))  # each admitted request saw its own count
    assert [r.status_code for r in admin] == [200] * (n + k)
    assert "x-ratelimit-remaining" not in admin[0].headers
    rows = await usage_rows(db_url)
    assert rows[("user:nina", "minute")][0] == n
    assert rows[("domain:northwind", "minute")][0] == n  # refused ones counted nowhere
    assert not [key for key in rows if key[0] in ("user:root", "domain:acme")]


class EndlessModel(FunctionModel):
    """Streams words until it is cancelled (and says so)."""

    def __init__(self) -> None:
        super().__init__(lambda request: text_reply("unused"), model="local/endless")
        self.cancelled = threading.Event()
        self.words = 0

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        try:
            while True:
                self.words += 1
                yield TextDelta("word ")
                await asyncio.sleep(0.002)
        finally:
            self.cancelled.set()


async def test_a_stream_crossing_the_token_budget_ends_in_an_error_event_and_is_counted(
    settings: Callable[..., Settings], replica: Callable[..., str], db_url: str
) -> None:
    s = settings(budget_user_tokens=300)
    model = EndlessModel()
    url = replica(s, model)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = {"question": "tell me more", "stream": True}
        async with http.stream("POST", "/ask", json=body, headers=NORTHWIND_STAFF) as response:
            assert response.status_code == 200
            assert response.headers["x-budget-tokens-remaining"] == "300"
            events = await read_sse(response)
        assert events[-1].event == "error", [e.event for e in events][-5:]
        assert is_envelope(events[-1].data, "budget_exceeded")
        assert "done" not in [e.event for e in events]
        assert await asyncio.to_thread(model.cancelled.wait, 10)  # the model call stopped
        estimate = events[-1].data["error"]["used_tokens_estimate"]
        assert 300 < estimate < 320
        # counted in the database: the same estimate
        assert (await usage_rows(db_url))[("user:nina", "day")][1] == estimate
        after = await http.post("/ask", json={"question": "again"}, headers=NORTHWIND_STAFF)
    assert after.status_code == 429
    assert is_envelope(after.json(), "budget_exceeded")
    assert int(after.headers["retry-after"]) == 10 * 3600 - 10  # the UTC day's end
    assert len(model.requests) == 1  # the refused request never reached the model


async def test_a_json_answers_usage_is_counted_in_the_database(
    settings: Callable[..., Settings], replica: Callable[..., str], db_url: str
) -> None:
    s = settings(budget_domain_tokens=100_000, budget_user_cost_usd=5.0)
    url = replica(s)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        answers = [
            (await http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)).json()
            for _ in range(3)
        ]
    spent = sum(a["usage"]["input_tokens"] + a["usage"]["output_tokens"] for a in answers)
    rows = await usage_rows(db_url)
    assert spent > 0 and rows[("domain:northwind", "day")][1] == spent
    assert rows[("user:nina", "day")][1] == spent  # local/ models cost 0: tokens still count
