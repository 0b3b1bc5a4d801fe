"""The HTTP edge around the routes: the error envelope for every error (404, 405, 413, 422,
429, 500, 502-504), the request id, CORS on and off, the optional prefix, OpenAPI, the SSE
framing of failures, and the probes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from api_helpers import (
    ADMIN,
    NORTHWIND_STAFF,
    FakeBackend,
    answer,
    is_envelope,
    parse_sse_text,
)

from agent.answer import AgentError, DoneEvent, TokenEvent
from local_world.servers import run_in_thread
from serve_app.backend import BackendError, BackendOverloaded, BackendTimeout
from serve_app.readiness import Readiness, ReadinessCheck

AppFactory = Callable[..., tuple[Any, FakeBackend]]
ClientFactory = Callable[..., httpx.AsyncClient]


# --- envelopes for FastAPI's own errors -----------------------------------------------------------


async def test_unknown_route_is_a_404_envelope(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).get("/no/such/thing", headers=ADMIN)
    assert response.status_code == 404
    assert response.json() == {
        "error": {"code": "not_found", "message": "no such endpoint: GET /no/such/thing"}
    }


async def test_wrong_method_is_a_405_envelope(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).get("/ask", headers=ADMIN)
    assert response.status_code == 405
    assert is_envelope(response.json(), "method_not_allowed")
    assert "allowed: POST" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"question": ""}, ["question"]),
        ({"question": "   "}, ["question"]),
        ({"question": "x" * 4001}, ["question"]),
        ({}, ["question"]),
        ({"question": "hi", "top_k": 0}, ["top_k"]),
        ({"question": "hi", "top_k": 51}, ["top_k"]),
        ({"question": "hi", "top_k": "5"}, ["top_k"]),
        ({"question": "hi", "stream": "yes"}, ["stream"]),
        ({"question": "hi", "model": ""}, ["model"]),
        ({"question": "hi", "topk": 3}, ["topk"]),
        ({"question": 5, "top_k": 99}, ["question", "top_k"]),
        (["hi"], ["body"]),
    ],
)
async def test_bad_bodies_are_422_naming_each_field(
    body: Any, fields: list[str], fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    response = await asgi_client(app).post("/ask", json=body, headers=NORTHWIND_STAFF)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert [f["field"] for f in error["fields"]] == fields
    for field in fields:
        assert f"{field}: " in error["message"]
    assert "x" * 100 not in response.text  # the input is never echoed
    assert fake.asks == []


async def test_a_question_of_exactly_4000_chars_is_fine(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    response = await asgi_client(app).post(
        "/ask", json={"question": "y" * 4000, "top_k": 50}, headers=NORTHWIND_STAFF
    )
    assert response.status_code == 200
    assert fake.asks[0][1].top_k == 50 and len(fake.asks[0][1].question) == 4000


async def test_invalid_json_and_missing_body_are_422(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    client = asgi_client(app)
    headers = {**NORTHWIND_STAFF, "content-type": "application/json"}
    response = await client.post("/ask", content=b'{"question": ', headers=headers)
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["error"]["message"]
    response = await client.post("/ask", headers=NORTHWIND_STAFF)
    assert response.status_code == 422
    assert response.json()["error"]["fields"][0] == {
        "field": "body",
        "message": "a JSON body is required",
        "type": "missing",
    }
    plain = {**NORTHWIND_STAFF, "content-type": "text/plain"}
    response = await client.post("/ask", content=b'{"question": "hi"}', headers=plain)
    assert response.status_code == 422
    assert "Content-Type: application/json" in response.json()["error"]["message"]


async def test_oversized_bodies_are_413(fake_app: AppFactory, asgi_client: ClientFactory) -> None:
    app, fake = fake_app()
    client = asgi_client(app)
    big = b'{"question": "' + b"x" * (70 * 1024) + b'"}'
    headers = {**NORTHWIND_STAFF, "content-type": "application/json"}
    response = await client.post("/ask", content=big, headers=headers)
    assert response.status_code == 413
    assert is_envelope(response.json(), "payload_too_large")
    assert "65536" in response.json()["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(70):
            yield b"x" * 1024

    response = await client.post("/ask", content=chunks(), headers=headers)
    assert response.status_code == 413
    assert is_envelope(response.json(), "payload_too_large")
    assert "x-request-id" in response.headers
    assert fake.asks == []


async def test_oversized_body_over_real_http(fake_app: AppFactory) -> None:
    app, _ = fake_app()
    with run_in_thread(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.post(
                "/ask", json={"question": "x" * 100_000}, headers=NORTHWIND_STAFF
            )
    assert response.status_code == 413 and is_envelope(response.json(), "payload_too_large")


# --- 500 and backend errors -----------------------------------------------------------------------


async def test_an_unhandled_error_is_a_generic_500_logged_with_the_request_id(
    fake_app: AppFactory, asgi_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app, fake = fake_app()
    fake.ask_result = RuntimeError("boom: password=hunter2 at /secret/path.py line 3")
    with caplog.at_level(logging.ERROR, logger="serve_app.api.middleware"):
        response = await asgi_client(app).post(
            "/ask", json={"question": "hi"}, headers={**NORTHWIND_STAFF, "x-request-id": "req-1"}
        )
    assert response.status_code == 500
    body = response.json()
    assert is_envelope(body, "internal_error")
    assert "hunter2" not in response.text and "Traceback" not in response.text
    assert "req-1" in body["error"]["message"] and response.headers["x-request-id"] == "req-1"
    logged = [r for r in caplog.records if "req-1" in r.getMessage()]
    assert logged and logged[0].exc_info is not None


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (BackendOverloaded("too many requests in flight", retry_after=2), 429, "overloaded"),
        (BackendTimeout("the agent did not answer within 60 s"), 504, "timeout"),
        (BackendError("the agent deployment is unavailable"), 503, "backend_unavailable"),
    ],
)
async def test_backend_errors_map_to_their_status(
    error: BackendError,
    status: int,
    code: str,
    fake_app: AppFactory,
    asgi_client: ClientFactory,
) -> None:
    app, fake = fake_app()
    fake.ask_result = error
    response = await asgi_client(app).post("/ask", json={"question": "hi"}, headers=ADMIN)
    assert response.status_code == status
    assert response.json() == {"error": {"code": code, "message": error.message}}
    if status == 429:
        assert response.headers["retry-after"] == "2"


@pytest.mark.parametrize(
    ("agent_error", "status"),
    [
        (AgentError(code="provider_rejected", message="rejected (HTTP 401)", status_code=401), 502),
        (AgentError(code="malformed_reply", message="unparseable"), 502),
        (AgentError(code="provider_unavailable", message="HTTP 503", status_code=503), 503),
        (AgentError(code="provider_unavailable", message="the model provider timed out"), 504),
        (AgentError(code="provider_unavailable", message="gateway", status_code=504), 504),
    ],
)
async def test_provider_errors_keep_the_answer_and_carry_the_envelope(
    agent_error: AgentError, status: int, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    fake.ask_result = answer("The assistant is unavailable.", decision="provider_error")
    fake.ask_result.error = agent_error
    response = await asgi_client(app).post("/ask", json={"question": "hi"}, headers=ADMIN)
    assert response.status_code == status
    body = response.json()
    assert is_envelope(body, agent_error.code)
    assert body["decision"] == "provider_error" and "usage" in body and "cost" in body


# --- SSE failures ---------------------------------------------------------------------------------


async def test_an_exception_mid_stream_becomes_one_error_event(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    fake.stream_events = [TokenEvent(text="Hel"), RuntimeError("secret detail")]
    response = await asgi_client(app).post(
        "/ask", json={"question": "hi", "stream": True}, headers=ADMIN
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse_text(response.text)
    assert [name for name, _ in events] == ["token", "error"]
    assert is_envelope(events[1][1], "internal_error")
    assert "secret detail" not in response.text
    assert fake.stream_closed


async def test_a_backend_error_mid_stream_keeps_its_code(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    fake.stream_events = [TokenEvent(text="a"), BackendTimeout("timed out after 60 s")]
    response = await asgi_client(app).post(
        "/ask", json={"question": "hi", "stream": True}, headers=ADMIN
    )
    events = parse_sse_text(response.text)
    assert events[-1] == (
        "error",
        {"error": {"code": "timeout", "message": "timed out after 60 s"}},
    )


async def test_a_stream_that_ends_without_done_ends_with_an_error(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    fake.stream_events = [TokenEvent(text="a")]
    response = await asgi_client(app).post(
        "/ask", json={"question": "hi", "stream": True}, headers=ADMIN
    )
    assert [name for name, _ in parse_sse_text(response.text)] == ["token", "error"]


async def test_a_provider_error_stream_ends_with_an_error_event_carrying_the_answer(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    failed = answer("unavailable", decision="provider_error")
    failed.error = AgentError(code="provider_unavailable", message="HTTP 503", status_code=503)
    fake.stream_events = [DoneEvent(response=failed)]
    response = await asgi_client(app).post(
        "/ask", json={"question": "hi", "stream": True}, headers=ADMIN
    )
    ((name, data),) = parse_sse_text(response.text)
    assert name == "error" and is_envelope(data, "provider_unavailable")
    # not stored in a conversation: no answer to keep (serve_app.threads)
    assert data == {**failed.model_dump(mode="json"), "conversation_id": None, "turn": None}


# --- request id -----------------------------------------------------------------------------------


async def test_request_id_is_propagated_or_generated(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    client = asgi_client(app)
    response = await client.get("/healthz", headers={"x-request-id": "abc-123.x:y"})
    assert response.headers["x-request-id"] == "abc-123.x:y"
    generated = (await client.get("/healthz")).headers["x-request-id"]
    assert len(generated) == 32
    for bad in ("has spaces", "x" * 200, "<script>"):
        replaced = (await client.get("/healthz", headers={"x-request-id": bad})).headers
        assert replaced["x-request-id"] != bad and len(replaced["x-request-id"]) == 32
    error = await client.get("/nope", headers={"x-request-id": "err-1"})
    assert error.status_code == 404 and error.headers["x-request-id"] == "err-1"


# --- CORS -----------------------------------------------------------------------------------------


async def test_cors_is_off_without_origins(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app(cors_origins=[])
    client = asgi_client(app)
    preflight = await client.options(
        "/ask",
        headers={"origin": "https://app.example", "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 405 and is_envelope(preflight.json())
    assert "access-control-allow-origin" not in preflight.headers
    response = await client.get("/healthz", headers={"origin": "https://app.example"})
    assert "access-control-allow-origin" not in response.headers


async def test_cors_allows_the_configured_origins_only(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app(cors_origins=["https://app.example"])
    client = asgi_client(app)
    preflight = await client.options(
        "/ask",
        headers={
            "origin": "https://app.example",
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert preflight.headers["access-control-allow-credentials"] == "true"
    response = await client.post(
        "/ask",
        json={"question": "hi"},
        headers={**NORTHWIND_STAFF, "origin": "https://app.example"},
    )
    assert response.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in response.headers["access-control-expose-headers"].lower()
    # errors carry the CORS headers too, so a browser can read the envelope
    unauthenticated = await client.post(
        "/ask", json={"question": "hi"}, headers={"origin": "https://app.example"}
    )
    assert unauthenticated.status_code == 401
    assert unauthenticated.headers["access-control-allow-origin"] == "https://app.example"
    other = await client.options(
        "/ask",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    assert other.status_code == 400
    assert "access-control-allow-origin" not in other.headers


# --- prefix and docs ------------------------------------------------------------------------------


async def test_the_agent_prefix(fake_app: AppFactory, asgi_client: ClientFactory) -> None:
    app, fake = fake_app(api_prefix="/agent")
    client = asgi_client(app)
    response = await client.post("/agent/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200 and fake.asks
    assert (await client.post("/ask", json={"question": "hi"}, headers=ADMIN)).status_code == 404
    ingest = await client.post("/agent/ingest", headers=ADMIN)
    assert ingest.status_code == 202
    assert ingest.headers["location"] == f"/agent/ingest/{ingest.json()['run_id']}"
    assert (await client.get(ingest.headers["location"], headers=ADMIN)).status_code == 200
    for path in ("/agent/healthz", "/agent/readyz", "/healthz", "/readyz"):
        assert (await client.get(path)).status_code == 200, path
    schema = (await client.get("/agent/openapi.json")).json()
    assert set(schema["paths"]) == {
        "/agent/ask",
        "/agent/ingest",
        "/agent/ingest/{run_id}",
        "/agent/conversations",
        "/agent/conversations/{conversation_id}",
        "/agent/feedback",
        "/agent/healthz",
        "/agent/readyz",
    }
    assert (await client.get("/openapi.json")).json() == schema
    for docs in ("/agent/docs", "/docs"):
        page = await client.get(docs)
        assert page.status_code == 200 and "/agent/openapi.json" in page.text


async def test_openapi_documents_the_envelope_and_the_stream(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    client = asgi_client(app)
    assert (await client.get("/docs")).status_code == 200
    schema = (await client.get("/openapi.json")).json()
    ask = schema["paths"]["/ask"]["post"]
    assert "text/event-stream" in ask["responses"]["200"]["content"]
    for status in ("401", "403", "422", "502", "503", "504"):
        assert status in ask["responses"], status
    assert "ErrorEnvelope" in schema["components"]["schemas"]


async def test_openapi_says_who_wrote_the_answer(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    """``answered_by`` is required on the answer (JSON and the stream's ``done``: the same
    object), described, and nullable on a stored turn (older turns did not record it)."""
    app, _ = fake_app()
    schemas = (await asgi_client(app).get("/openapi.json")).json()["components"]["schemas"]
    for name in ("AgentAnswer", "AskResponse"):
        field = schemas[name]["properties"]["answered_by"]
        assert field["enum"] == ["model", "service"], name
        assert "answered_by" in schemas[name]["required"], name
        assert field["description"].startswith("Who wrote `answer`."), name
    turn = schemas["TurnOut"]["properties"]["answered_by"]
    assert {"type": "null"} in turn["anyOf"] and "answered_by" not in schemas["TurnOut"].get(
        "required", []
    )


# --- probes ---------------------------------------------------------------------------------------


async def test_readyz_reports_the_checks_and_503_when_not_ready(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    client = asgi_client(app)
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    fake.readiness_result = Readiness(
        ready=False, checks=[ReadinessCheck(name="database", ok=False, detail="unreachable")]
    )
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"][0]["name"] == "database"
    fake.readiness_result = RuntimeError("probe exploded")
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "checks": [{"name": "backend", "ok": False, "detail": "RuntimeError"}],
    }


async def test_concurrent_requests_keep_their_own_request_ids(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    client = asgi_client(app)
    responses = await asyncio.gather(
        *(client.get("/healthz", headers={"x-request-id": f"r{i}"}) for i in range(20))
    )
    assert [r.headers["x-request-id"] for r in responses] == [f"r{i}" for i in range(20)]
