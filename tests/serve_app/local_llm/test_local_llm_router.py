"""Routing one base URL to several models by the body's ``model``: the router in plain Python,
then the application's routes over real HTTP to two scripted OpenAI-compatible servers (one
per "model"), then over mock upstreams for health and disconnects."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, cast

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.servers import run_in_thread
from serve_app.local_llm.proxy import UpstreamProxy
from serve_app.local_llm.router import (
    MODEL_HEADER,
    InvalidModelFieldError,
    ModelBackend,
    ModelNotServedError,
    ModelRouter,
    RoutedLLM,
    create_router_app,
    requested_model,
)

BIG = "qwen2.5-coder-1.5b-instruct"
SMALL = "qwen2.5-coder-0.5b-instruct"


# --- the router -----------------------------------------------------------------------------


def test_select_by_name_case_and_local_prefix() -> None:
    router = ModelRouter([(BIG, "big"), (SMALL, "small")])
    assert router.names == (BIG, SMALL)
    assert router.select(BIG) == (BIG, "big")
    assert router.select(SMALL) == (SMALL, "small")
    assert router.select("Qwen2.5-Coder-0.5B-Instruct") == (SMALL, "small")
    assert router.select("local/qwen2.5-coder-0.5b-instruct") == (SMALL, "small")
    assert router.select(" LOCAL/Qwen2.5-Coder-1.5B-Instruct ") == (BIG, "big")


def test_no_model_is_the_first_model() -> None:
    router = ModelRouter([(BIG, "big"), (SMALL, "small")])
    assert router.select(None) == (BIG, "big")
    assert router.select("") == (BIG, "big")
    assert router.select("  ") == (BIG, "big")
    assert ModelRouter([(SMALL, "small"), (BIG, "big")]).select(None) == (SMALL, "small")


def test_an_unknown_model_is_refused_listing_the_served_ones() -> None:
    router = ModelRouter([(BIG, "big"), (SMALL, "small")])
    for name in ("gpt-4o-mini", "local/", "qwen2.5-coder", "remote/qwen2.5-coder-0.5b-instruct"):
        with pytest.raises(ModelNotServedError) as caught:
            router.select(name)
        assert caught.value.requested == name
        assert caught.value.served == (BIG, SMALL)
        assert f"{BIG}, {SMALL}" in str(caught.value)


def test_a_single_custom_model_keeps_its_own_name() -> None:
    router = ModelRouter([("Mine", "m")])
    assert router.select("mine") == ("Mine", "m")
    assert router.select("local/MINE") == ("Mine", "m")
    with pytest.raises(ModelNotServedError):
        router.select(BIG)


def test_router_construction_errors() -> None:
    with pytest.raises(ValueError, match="at least one model"):
        ModelRouter([])
    with pytest.raises(ValueError, match="two served models are named"):
        ModelRouter([(BIG, 1), (f"local/{BIG.upper()}", 2)])
    with pytest.raises(ValueError, match="needs a name"):
        ModelRouter([(" ", 1)])


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model": "a", "messages": []}', "a"),
        (b'{"messages": []}', None),
        (b'{"model": null}', None),
        (b"{not json", None),  # the model's server reports the broken body itself
        (b"[1, 2]", None),
        (b"", None),
        ('{"model": "qwen\u00e9"}'.encode(), "qwen\u00e9"),
    ],
)
def test_requested_model(body: bytes, expected: str | None) -> None:
    assert requested_model(body) == expected


def test_a_model_that_is_not_a_string_is_invalid() -> None:
    with pytest.raises(InvalidModelFieldError, match="must be a string, got int"):
        requested_model(b'{"model": 5}')


# --- the routes over real HTTP, two scripted upstreams -----------------------------------------


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, tuple[str, ScriptedLLM]]]:
    big, small = ScriptedLLM(), ScriptedLLM()
    with (
        run_in_thread(create_llm_app(big)) as big_url,
        run_in_thread(create_llm_app(small)) as (small_url),
    ):
        yield {BIG: (big_url, big), SMALL: (small_url, small)}


@pytest.fixture(scope="module")
def router_url(upstreams: dict[str, tuple[str, ScriptedLLM]]) -> Iterator[str]:
    backends: list[tuple[str, ModelBackend]] = [
        (name, UpstreamProxy(url, timeout_seconds=10, api_key="k"))
        for name, (url, _) in upstreams.items()
    ]
    with run_in_thread(create_router_app(RoutedLLM(ModelRouter(backends)))) as url:
        yield url


@pytest.fixture
def llms(upstreams: dict[str, tuple[str, ScriptedLLM]]) -> dict[str, ScriptedLLM]:
    for _, llm in upstreams.values():
        llm.reset()
    return {name: llm for name, (_, llm) in upstreams.items()}


def chat(model: str | None, question: str = "q", **extra: object) -> dict[str, object]:
    body: dict[str, object] = {"messages": [{"role": "user", "content": question}], **extra}
    if model is not None:
        body["model"] = model
    return body


async def test_each_request_goes_to_the_model_it_names(
    llms: dict[str, ScriptedLLM], router_url: str
) -> None:
    llms[BIG].script({"text": "from the big one"}, mode="loop")
    llms[SMALL].script({"text": "from the small one"}, mode="loop")
    cases = [
        (BIG, BIG),
        (SMALL, SMALL),
        (f"local/{SMALL}", SMALL),
        ("Qwen2.5-Coder-0.5B-Instruct", SMALL),
        (f"LOCAL/{BIG.upper()}", BIG),
    ]
    async with httpx.AsyncClient(base_url=router_url, timeout=10) as client:
        for requested, served in cases:
            reply = await client.post("/v1/chat/completions", json=chat(requested))
            assert reply.status_code == 200, reply.text
            assert reply.headers[MODEL_HEADER] == served
            expected = "from the big one" if served == BIG else "from the small one"
            assert reply.json()["choices"][0]["message"]["content"] == expected
    small_seen = [r.body.get("model") for r in llms[SMALL].chat_requests()]
    assert small_seen == [SMALL, f"local/{SMALL}", "Qwen2.5-Coder-0.5B-Instruct"]  # unchanged
    assert [r.body.get("model") for r in llms[BIG].chat_requests()] == [BIG, f"LOCAL/{BIG.upper()}"]


async def test_a_request_without_a_model_goes_to_the_first_model(
    llms: dict[str, ScriptedLLM], router_url: str
) -> None:
    async with httpx.AsyncClient(base_url=router_url, timeout=10) as client:
        for body in (chat(None), chat("")):
            reply = await client.post("/v1/chat/completions", json=body)
            assert reply.headers[MODEL_HEADER] == BIG
            # llama.cpp answers without a model; the scripted server, like OpenAI, wants one
            # and says so: the body went up unchanged.
            assert reply.status_code == 400
            assert "model" in reply.json()["error"]["message"]
    assert len(llms[BIG].chat_requests()) == 2
    assert llms[SMALL].requests == []


async def test_an_unknown_model_is_a_404_in_openai_shape(
    llms: dict[str, ScriptedLLM], router_url: str
) -> None:
    async with httpx.AsyncClient(base_url=router_url, timeout=10) as client:
        reply = await client.post("/v1/chat/completions", json=chat("openai/gpt-4o-mini"))
        bad_type = await client.post("/v1/chat/completions", json={**chat(None), "model": 7})
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "model_not_found")
    assert "'openai/gpt-4o-mini' is not served here" in error["message"]
    assert f"served models: {BIG}, {SMALL}" in error["message"]
    assert bad_type.status_code == 400
    assert bad_type.json()["error"]["code"] == "invalid_model"
    assert llms[BIG].requests == [] and llms[SMALL].requests == []


async def test_a_broken_body_goes_to_the_default_model_which_reports_it(
    llms: dict[str, ScriptedLLM], router_url: str
) -> None:
    async with httpx.AsyncClient(base_url=router_url, timeout=10) as client:
        reply = await client.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    assert reply.status_code == 400
    assert "error" in reply.json()
    assert reply.headers[MODEL_HEADER] == BIG
    assert len(llms[BIG].requests) == 1


async def test_streaming_is_passed_through_chunk_by_chunk_from_the_chosen_model(
    llms: dict[str, ScriptedLLM], router_url: str
) -> None:
    text = "klmnopqrst" * 5
    llms[SMALL].script({"text": text, "chunk_chars": 10, "stream_delay_ms": 150})
    arrivals: list[tuple[float, str]] = []
    started = time.perf_counter()
    body = chat(f"local/{SMALL}", "s", stream=True)
    async with (
        httpx.AsyncClient(base_url=router_url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as reply,
    ):
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert reply.headers[MODEL_HEADER] == SMALL
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                arrivals.append((time.perf_counter() - started, line[6:]))
    assert arrivals[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in arrivals[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == text
    first_content = next(t for t, data in arrivals if "klmnopqrst" in data)
    assert arrivals[-1][0] - first_content > 0.4  # not buffered
    assert llms[BIG].requests == []


async def test_the_openai_sdk_picks_models_per_request(
    llms: dict[str, ScriptedLLM], router_url: str
) -> None:
    from openai import AsyncOpenAI, NotFoundError

    llms[BIG].script({"text": "big words", "chunk_chars": 3})
    llms[SMALL].script({"text": "small words", "chunk_chars": 3})
    sdk = AsyncOpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0)
    try:
        for model, expected in ((f"local/{BIG}", "big words"), (SMALL, "small words")):
            stream = await sdk.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "q"}], stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            assert "".join(parts) == expected
        with pytest.raises(NotFoundError, match="not served here"):
            await sdk.chat.completions.create(
                model="local/qwen2.5-coder-7b-instruct", messages=[{"role": "user", "content": "q"}]
            )
        listed = await sdk.models.list()
        assert [m.id for m in listed.data] == [BIG, SMALL]
    finally:
        await sdk.close()


# --- models and health over mock upstreams --------------------------------------------------------


def mock_proxy(handler: Any) -> UpstreamProxy:
    return UpstreamProxy("http://up", transport=httpx.MockTransport(handler))


def routed(**backends: ModelBackend) -> RoutedLLM:
    return RoutedLLM(ModelRouter(list(backends.items())))


def asgi_client(routes: RoutedLLM) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_router_app(routes))
    return httpx.AsyncClient(transport=transport, base_url="http://router")


def llama_models(alias: str) -> httpx.Response:
    entry = {"id": alias, "object": "model", "created": 1, "owned_by": "llamacpp"}
    return httpx.Response(200, json={"object": "list", "data": [{**entry, "meta": {"n": 1}}]})


async def test_models_lists_every_served_model_with_its_upstream_details() -> None:
    big = mock_proxy(lambda request: llama_models(BIG))
    down = UpstreamProxy("http://127.0.0.1:9", timeout_seconds=2)
    async with asgi_client(routed(big=big, small=down)) as client:
        reply = await client.get("/v1/models")
    assert reply.status_code == 200
    first, second = reply.json()["data"]
    assert first == {"id": "big", "object": "model", "created": 1, "owned_by": "llamacpp"} | {
        "meta": {"n": 1}
    }
    assert second["id"] == "small" and second["object"] == "model"  # listed even when down


async def test_health_is_ok_only_when_every_model_is() -> None:
    codes = {"big": 200, "small": 200}

    def handler_for(name: str) -> Any:
        return lambda request: httpx.Response(codes[name], json={"status": "x"})

    routes = routed(big=mock_proxy(handler_for("big")), small=mock_proxy(handler_for("small")))
    async with asgi_client(routes) as client:
        healthy = await client.get("/health")
        codes["small"] = 503  # llama.cpp answers 503 while loading
        sick = await client.get("/health")
    assert healthy.status_code == 200
    assert healthy.json() == {"status": "ok", "models": {"big": "ok", "small": "ok"}}
    assert sick.status_code == 503
    assert sick.json()["status"] == "unavailable"
    assert sick.json()["models"] == {"big": "ok", "small": "upstream /health answered 503"}
    assert sick.json()["detail"] == "small: upstream /health answered 503"


class FailingBackend:
    """A backend whose calls raise (a replica that died)."""

    def chat_completion_parts(self, body: bytes, headers: Any) -> AsyncIterator[Any]:
        raise RuntimeError("gone")

    async def model_entries(self) -> list[dict[str, Any]]:
        raise RuntimeError("gone")

    async def probe(self) -> tuple[bool, str]:
        raise RuntimeError("gone")


async def test_a_backend_that_raises_is_unhealthy_and_still_listed() -> None:
    routes = routed(big=mock_proxy(lambda r: llama_models("big")), dead=FailingBackend())
    healthy, details = await routes.probe()
    assert not healthy
    assert details == {"big": "ok", "dead": "unreachable: RuntimeError"}
    async with asgi_client(routes) as client:
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == [
            "big",
            "dead",
        ]


class TrackedStream(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(100):
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        self.closed = True


def chat_request(body: bytes) -> Request:
    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
    }
    return Request(scope, receive)


async def test_a_client_that_goes_away_closes_the_chosen_models_stream() -> None:
    streams = {"big": TrackedStream(), "small": TrackedStream()}

    def handler_for(name: str) -> Any:
        return lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=streams[name]
        )

    routes = routed(big=mock_proxy(handler_for("big")), small=mock_proxy(handler_for("small")))
    response = await routes.chat_completions(chat_request(b'{"model": "local/SMALL"}'))
    assert isinstance(response, StreamingResponse)
    assert response.headers[MODEL_HEADER] == "small"
    body = cast(AsyncGenerator[bytes, None], response.body_iterator)
    assert await body.__anext__() == b"data: 0\n\n"
    await body.aclose()  # what Starlette/Serve do when the client disconnects
    assert streams["small"].closed
    assert not streams["big"].closed
