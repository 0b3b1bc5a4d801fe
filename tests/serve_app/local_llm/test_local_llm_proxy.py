"""The OpenAI-compatible passthrough the Serve deployment uses, against the scripted
OpenAI-compatible server (real HTTP both sides) and against mock upstreams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import cast

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.servers import run_in_thread
from serve_app.local_llm.proxy import UpstreamProxy, create_proxy_app


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[str, ScriptedLLM]]:
    llm = ScriptedLLM()
    with run_in_thread(create_llm_app(llm)) as url:
        yield url, llm


@pytest.fixture(scope="module")
def proxy_url(scripted: tuple[str, ScriptedLLM]) -> Iterator[str]:
    proxy = UpstreamProxy(scripted[0], timeout_seconds=10, api_key="k")
    with run_in_thread(create_proxy_app(proxy)) as url:
        yield url


@pytest.fixture
def llm(scripted: tuple[str, ScriptedLLM]) -> ScriptedLLM:
    scripted[1].reset()
    return scripted[1]


def chat_body(question: str, **extra: object) -> dict[str, object]:
    return {"model": "local", "messages": [{"role": "user", "content": question}], **extra}


# --- against a real OpenAI-compatible server ---------------------------------------------------


async def test_json_reply_passes_through(llm: ScriptedLLM, proxy_url: str) -> None:
    llm.script({"text": "Hello there."})
    async with httpx.AsyncClient(base_url=proxy_url) as client:
        response = await client.post("/v1/chat/completions", json=chat_body("hi"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "Hello there."
    (recorded,) = llm.chat_requests()
    assert recorded.body["messages"] == [{"role": "user", "content": "hi"}]
    assert "authorization" in recorded.headers  # the proxy's own key (the caller sent none)


async def test_sse_passes_through_chunk_by_chunk(llm: ScriptedLLM, proxy_url: str) -> None:
    text = "abcdefghij" * 5
    llm.script({"text": text, "chunk_chars": 10, "stream_delay_ms": 150})
    arrivals: list[tuple[float, str]] = []
    started = time.perf_counter()
    async with (
        httpx.AsyncClient(base_url=proxy_url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=chat_body("s", stream=True)) as reply,
    ):
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                arrivals.append((time.perf_counter() - started, line[6:]))
    assert arrivals[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in arrivals[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == text
    first_content = next(t for t, data in arrivals if "abcdefghij" in data)
    # Five chunks 150 ms apart: the first must arrive long before the stream ends (a buffering
    # proxy would deliver everything at once).
    assert arrivals[-1][0] - first_content > 0.4


async def test_upstream_errors_pass_through(llm: ScriptedLLM, proxy_url: str) -> None:
    llm.script({"fault": "server_error", "status": 503, "message": "model busy"})
    async with httpx.AsyncClient(base_url=proxy_url) as client:
        response = await client.post("/v1/chat/completions", json=chat_body("x"))
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "model busy"


async def test_models_pass_through(llm: ScriptedLLM, proxy_url: str) -> None:
    async with httpx.AsyncClient(base_url=proxy_url) as client:
        response = await client.get("/v1/models")
    assert response.status_code == 200
    assert "local/scripted" in [m["id"] for m in response.json()["data"]]


async def test_openai_sdk_through_the_proxy(llm: ScriptedLLM, proxy_url: str) -> None:
    from openai import AsyncOpenAI

    llm.script({"text": "streamed words", "chunk_chars": 4})
    sdk = AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)
    stream = await sdk.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "q"}], stream=True
    )
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(parts) == "streamed words"
    assert len([p for p in parts if p]) >= 3
    await sdk.close()


# --- against mock upstreams ---------------------------------------------------------------------


def mock_proxy(
    handler: Callable[[httpx.Request], httpx.Response], api_key: str | None = None
) -> UpstreamProxy:
    return UpstreamProxy("http://up", api_key=api_key, transport=httpx.MockTransport(handler))


def asgi_client(proxy: UpstreamProxy) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_proxy_app(proxy))
    return httpx.AsyncClient(transport=transport, base_url="http://proxy")


def chat_request(body: bytes = b"{}", headers: dict[str, str] | None = None) -> Request:
    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": raw,
        "query_string": b"",
    }
    return Request(scope, receive)


class TrackedStream(httpx.AsyncByteStream):
    """An upstream SSE body that records being closed; optionally breaks after ``fail_after``
    events."""

    def __init__(self, events: int = 10, fail_after: int | None = None) -> None:
        self.events = events
        self.fail_after = fail_after
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(self.events):
            if self.fail_after is not None and i == self.fail_after:
                raise httpx.ReadError("connection reset")
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        self.closed = True


def sse_response(stream: TrackedStream) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)


async def test_unreachable_upstream_is_a_502_in_openai_shape() -> None:
    async with asgi_client(UpstreamProxy("http://127.0.0.1:9", timeout_seconds=2)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body("x"))
        models = await client.get("/v1/models")
        health = await client.get("/health")
    assert response.status_code == 502
    assert response.json()["error"] == {
        "message": "the local model server is unreachable",
        "type": "upstream_error",
        "code": "bad_gateway",
    }
    assert models.status_code == 502
    assert health.status_code == 503
    assert health.json()["status"] == "unavailable"


async def test_a_silent_upstream_is_a_504() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    async with asgi_client(mock_proxy(handler)) as client:
        response = await client.post("/v1/chat/completions", json=chat_body("x"))
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout"


async def test_health_follows_the_upstream() -> None:
    status = {"code": 200}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health"
        return httpx.Response(status["code"], json={"status": "x"})

    proxy = mock_proxy(handler)
    async with asgi_client(proxy) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        status["code"] = 503  # llama.cpp answers 503 while loading
        response = await client.get("/health")
    assert response.status_code == 503
    assert await proxy.probe() == (False, "upstream /health answered 503")


async def test_only_safe_headers_are_forwarded() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    headers = {
        "content-type": "application/json",
        "authorization": "Bearer secret",
        "cookie": "authentication_token=x",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    response = await mock_proxy(handler).chat_completions(chat_request(b'{"a":1}', headers))
    assert response.status_code == 200
    await mock_proxy(handler, "replica-key").chat_completions(chat_request(b"{}", headers))
    plain, with_key = seen
    assert plain.content == b'{"a":1}'
    assert plain.headers["traceparent"] == headers["traceparent"]
    assert plain.headers["connection"] == "close"  # never a pooled connection after a stream
    assert "authorization" not in plain.headers
    assert "cookie" not in plain.headers
    assert with_key.headers["authorization"] == "Bearer replica-key"
    assert "cookie" not in with_key.headers


async def test_a_client_that_goes_away_closes_the_upstream_stream() -> None:
    stream = TrackedStream(events=100)
    response = await mock_proxy(lambda request: sse_response(stream)).chat_completions(
        chat_request()
    )
    assert isinstance(response, StreamingResponse)
    body = cast(AsyncGenerator[bytes, None], response.body_iterator)
    assert await body.__anext__() == b"data: 0\n\n"
    await body.aclose()  # what Starlette/Serve do when the client disconnects
    assert stream.closed


async def test_a_broken_stream_ends_with_an_error_event() -> None:
    stream = TrackedStream(events=5, fail_after=2)
    response = await mock_proxy(lambda request: sse_response(stream)).chat_completions(
        chat_request()
    )
    assert isinstance(response, StreamingResponse)
    chunks = [bytes(chunk) async for chunk in response.body_iterator]  # type: ignore[arg-type]
    assert chunks[:2] == [b"data: 0\n\n", b"data: 1\n\n"]
    error = json.loads(chunks[-1].removeprefix(b"data: "))
    assert error["error"]["code"] == "bad_gateway"
    assert stream.closed
