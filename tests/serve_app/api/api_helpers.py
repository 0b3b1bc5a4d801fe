"""Helpers for the HTTP API tests (a uniquely named module, so it never clashes with another
test directory's helpers): callers, a fake backend, an SSE reader, a spy backend."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.answer import AgentAnswer, AgentEvent, DoneEvent, TokenEvent
from agent.request import AgentRequest
from conversations.feedback import FeedbackStore, InMemoryFeedbackStore
from conversations.memory import InMemoryConversationStore
from foundation.identity import AuthUser
from local_world.claims import encode_claims
from serve_app.backend import IngestRequest, IngestRun
from serve_app.limits import RequestLimits
from serve_app.metrics import MetricsSink
from serve_app.readiness import Readiness, ReadinessCheck

SECRET = "test-eval-secret-0123456789abcdef-xyz"  # >= 32 bytes
CLAIMS = "x-gateway-claims"


def claims(sub: str, *memberships: tuple[str, str]) -> dict[str, str]:
    """Headers of a mesh-authenticated caller."""
    return {CLAIMS: encode_claims(sub, memberships)}


ADMIN = claims("root", ("acme", "admin"))
NORTHWIND_ADMIN = claims("nora", ("northwind", "business_admin"))
NORTHWIND_STAFF = claims("nina", ("northwind", "business_staff"))
CUSTOMER = claims("carl", ("civic", "standard_customer"))


def is_envelope(body: Any, code: str | None = None) -> bool:
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    error = body["error"]
    ok = isinstance(error.get("code"), str) and isinstance(error.get("message"), str)
    return ok and (code is None or error["code"] == code)


async def expect_401(response: httpx.Response, *, says: str | None = None) -> None:
    """A 401 with the envelope, ``WWW-Authenticate: Bearer``, and never the eval secret."""
    assert response.status_code == 401, response.text
    body = response.json()
    assert is_envelope(body, "unauthenticated"), body
    assert response.headers["www-authenticate"] == "Bearer"
    assert SECRET not in response.text
    if says is not None:
        assert says in body["error"]["message"], body


# --- building credentials by hand (for the auth tests) -------------------------------------------


def b64(raw: bytes | str) -> str:
    data = raw.encode() if isinstance(raw, str) else raw
    return base64.b64encode(data).decode()


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], body: dict[str, Any], signature: bytes = b"") -> str:
    head = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(body).encode())
    return head + "." + b64url(signature)


def hs256_with_header(header: dict[str, Any], body: dict[str, Any], key: str) -> str:
    """A token whose header claims ``header['alg']`` but is HMAC-SHA256-signed with ``key``
    (the classic RS256 -> HS256 confusion, from the other side)."""
    head = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(body).encode())
    signature = hmac.new(key.encode(), head.encode(), hashlib.sha256).digest()
    return head + "." + b64url(signature)


def answer(text: str = "ok", **fields: Any) -> AgentAnswer:
    return AgentAnswer(
        answer=text,
        decision=fields.pop("decision", "answered"),
        answered_by=fields.pop("answered_by", "model"),
        model="m",
        **fields,
    )


@dataclass
class FakeBackend:
    """A scriptable ``ApiBackend`` for route-level tests; records who asked what."""

    asks: list[tuple[AuthUser, AgentRequest]] = field(default_factory=list)
    ask_result: AgentAnswer | Exception = field(default_factory=answer)
    stream_events: list[AgentEvent | Exception] = field(
        default_factory=lambda: [TokenEvent(text="ok"), DoneEvent(response=answer())]
    )
    readiness_result: Readiness | Exception = field(
        default_factory=lambda: Readiness(ready=True, checks=[ReadinessCheck(name="x", ok=True)])
    )
    runs: dict[str, IngestRun] = field(default_factory=dict)
    stream_closed: bool = False
    conversations: InMemoryConversationStore = field(default_factory=InMemoryConversationStore)
    limits: RequestLimits = field(default_factory=RequestLimits.disabled)
    metrics: MetricsSink | None = None
    feedback: FeedbackStore = field(init=False)

    def __post_init__(self) -> None:
        # Beside the conversations, as serve_app.feedback.feedback_store_for keeps them.
        self.feedback = InMemoryFeedbackStore(self.conversations)

    async def ask(self, request: AgentRequest) -> AgentAnswer:
        self.asks.append((request.user, request))
        if isinstance(self.ask_result, Exception):
            raise self.ask_result
        return self.ask_result

    async def ask_stream(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        self.asks.append((request.user, request))
        try:
            for item in self.stream_events:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.stream_closed = True

    async def visible_chunks(self, user: AuthUser, chunk_ids: Collection[str]) -> set[str]:
        return set(chunk_ids)  # no knowledge base here: every cited chunk is visible

    async def start_ingest(self, user: AuthUser, request: IngestRequest) -> IngestRun:
        run = IngestRun(run_id=f"run-{len(self.runs)}", status="pending")
        self.runs[run.run_id] = run
        return run

    async def ingest_status(self, run_id: str) -> IngestRun | None:
        return self.runs.get(run_id)

    async def readiness(self) -> Readiness:
        if isinstance(self.readiness_result, Exception):
            raise self.readiness_result
        return self.readiness_result

    async def close(self) -> None:
        return None


class SpyBackend:
    """Wraps a backend; records the stream's events and when its iterator was closed (from
    the server's thread: a ``threading.Event``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.events: list[str] = []
        self.closed = threading.Event()
        self.closed_at: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def ask_stream(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        inner = self.inner.ask_stream(request)

        async def spy() -> AsyncIterator[AgentEvent]:
            try:
                async for event in inner:
                    self.events.append(event.type)
                    yield event
            finally:
                self.closed_at = time.monotonic()
                await inner.aclose()
                self.closed.set()

        return spy()


@dataclass
class SseEvent:
    event: str
    data: Any
    at: float  # time.monotonic() when it arrived


async def read_sse(
    response: httpx.Response, *, stop: Callable[[SseEvent], bool] | None = None
) -> list[SseEvent]:
    """Parse a streamed ``text/event-stream`` response as it arrives (any line ending)."""
    events: list[SseEvent] = []
    name, data_lines = "message", list[str]()
    async for line in response.aiter_lines():
        line = line.rstrip("\r")
        if not line:
            if data_lines:
                event = SseEvent(name, json.loads("\n".join(data_lines)), time.monotonic())
                events.append(event)
                if stop is not None and stop(event):
                    return events
            name, data_lines = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data_lines.append(line[len("data:") :].lstrip(" "))
    return events


def parse_sse_text(text: str) -> list[tuple[str, Any]]:
    """A whole buffered ``text/event-stream`` body -> ``[(event, data), ...]``."""
    out: list[tuple[str, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            out.append((name, json.loads("\n".join(data))))
    return out
