"""API fuzzing with schemathesis (issue 8, item 4): the app's own OpenAPI schema drives
generated requests - valid and invalid bodies, parameters, methods - against the real app.

The app is the single-process one (``create_single_process_app``) over a real
``LocalBackend``, served by uvicorn on 127.0.0.1: the scripted model server (an unkeyed loop
script: ``search_docs`` and ``get_building``, then an answer citing an invented chunk, which
is stripped), the twin/sensor simulators, embeddings from the scripted server, a database
that is down (``/readyz`` says 503; ``search_docs`` gets a tool error) and the
conversations in the in-memory store (so ``/conversations`` answers 2xx/404/422, not the
503 of a database that is down): no Postgres, no network beyond loopback. Each case is
sent as one of four callers (admin, business admin, staff, nobody; picked from the case, so
a failure replays as the same caller): the 2xx, 400, 401, 403, 404 and 422 paths are all
reached.

Every response must pass schemathesis's checks: no 5xx, a documented status, content type,
headers and body matching the schema, schema-valid data accepted and invalid data rejected.
Examples are bounded (``MAX_EXAMPLES`` per operation and phase, derandomized) so the run
stays well under a minute; ``pytest -s`` prints what was sent and how it was answered.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from api_helpers import ADMIN, NORTHWIND_ADMIN, NORTHWIND_STAFF, FakeBackend, answer
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import Failure, FailureGroup

from agent.answer import DoneEvent, ProgressEvent, TokenEvent, ToolCallTrace, ToolEvent
from conversations.memory import InMemoryConversationStore
from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer, load_authorizer
from serve_app.backend import BackendError, BackendTimeout
from serve_app.wiring import build_local_backend

MAX_EXAMPLES = 30
CALLERS: list[tuple[str, dict[str, str]]] = [
    ("admin", ADMIN),
    ("business admin", NORTHWIND_ADMIN),
    ("staff", NORTHWIND_STAFF),
    ("nobody", {}),
]
CONFIG = SchemathesisConfig.from_dict(
    {
        "generation": {
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,  # the same cases every run: a CI failure reproduces
            "database": "none",
        },
        "phases": {"stateful": {"enabled": False}},
        "request-timeout": 30.0,
        "operations": [
            {
                # A schema-valid ``model`` outside ALLOWED_MODELS is refused by server
                # configuration the schema cannot know: the documented 400 model_not_allowed.
                # A schema-valid ``conversation_id`` names no conversation of the caller's:
                # the documented 404.
                "include-name": "POST /ask",
                "generation": {"max-examples": 2 * MAX_EXAMPLES},  # the operation that matters
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "400", "401", "403", "404"]
                    }
                },
            },
            {
                # ``cursor`` is opaque: a page's ``next_cursor``, which no schema can tell from
                # any other string; one the service did not issue is the documented 422.
                "include-name": "GET /conversations",
                "checks": {
                    "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "422"]}
                },
            },
            {
                # The one 5xx allowed: /readyz says "not ready" (503, the Readiness body)
                # because this test runs without a database; the test checks that is why.
                "include-name": "GET /readyz",
                "checks": {
                    "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "503"]}
                },
            },
        ],
    }
)
ANSWER_SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "search_docs", "arguments": {"query": "alert cooldown"}},
            {"name": "get_building", "arguments": {"building_id": "bld-northwind-harbor"}},
        ]
    },
    {"text": "Harbor Warehouse is at 12 Quay Road [^deadbeef0001].", "chunk_chars": 7},
]


def _openapi_document() -> dict[str, Any]:
    """The schema, from the app itself (routes and models only: no backend is called). Loaded
    at import, because schemathesis's fixture-based loader does not support pytest 9 yet;
    ``served`` checks the served app publishes the very same document."""
    settings = Settings(_env_file=None, llm_api_key="unused", answer_model="local/scripted")  # type: ignore[call-arg]
    document: dict[str, Any] = create_app(FakeBackend(), settings, load_authorizer()).openapi()
    return document


OPENAPI = _openapi_document()
schema = schemathesis.openapi.from_dict(OPENAPI, config=CONFIG)


@pytest.fixture
def served(
    make_settings: Callable[..., Settings],
    authorizer: CedarAuthorizer,
    llm: ScriptedLLM,
    serve_local: Callable[..., str],
) -> str:
    """The real app over a ``LocalBackend`` (see the module docstring); its base URL."""
    settings = make_settings(
        allowed_models="local/scripted,openai/gpt-4o-mini",
        embedding_backend="openai",
        embedding_model="openai/text-embedding-3-small",
        embedding_dim=384,
    )
    llm.script(*ANSWER_SCRIPT, mode="loop")  # unkeyed: answers any question
    backend = build_local_backend(
        settings, authorizer=authorizer, conversations=InMemoryConversationStore()
    )
    url = serve_local(settings, backend)
    assert httpx.get(f"{url}/openapi.json").json() == OPENAPI
    return url


@pytest.fixture(scope="module")
def tally() -> Iterator[Counter[tuple[str, str, int]]]:
    counts: Counter[tuple[str, str, int]] = Counter()
    yield counts
    total = sum(counts.values())
    print(
        f"\n[schemathesis] {total} generated requests, all schema-conformant, no 5xx but "
        "/readyz's 503 (no database, by design):"
    )
    for (operation, caller, status), n in sorted(counts.items()):
        print(f"  {operation:<30} {caller:<15} {status}: {n}")


def caller_for(case: Any) -> tuple[str, dict[str, str]]:
    """A caller picked by the case itself, so a failing case replays (and shrinks) as the
    same caller."""
    body = case.body if isinstance(case.body, dict | list | str | bytes | int | float) else None
    key = f"{case.method} {case.path} {case.path_parameters} {case.query} {body!r}"
    return CALLERS[zlib.crc32(key.encode("utf-8", "surrogatepass")) % len(CALLERS)]


@schema.parametrize()
@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_api_conforms_to_its_schema(
    case: Any, served: str, tally: Counter[tuple[str, str, int]], llm: ScriptedLLM
) -> None:
    caller, headers = caller_for(case)
    response = case.call_and_validate(base_url=served, headers=headers)
    operation = f"{case.method} {case.path}"
    if operation == "GET /readyz" and response.status_code == 503:
        failing = {c["name"] for c in response.json()["checks"] if not c["ok"]}
        assert failing == {"database", "schema"}, response.text  # down by design, nothing else
    else:
        assert response.status_code < 500, response.text
    content_type = {k.lower(): v for k, v in response.headers.items()}.get("content-type")
    streamed = "text/event-stream" in str(content_type)  # schemathesis keeps value lists
    tally[(operation + (" (SSE)" if streamed else ""), caller, response.status_code)] += 1
    assert llm.unscripted() == []


# --- regressions found by this fuzzing ----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x0e2\xd7\xa7\xff\xfe7\x16", id="not UTF-8"),
        pytest.param(b'{"question": ' + b"[" * 5000 + b"]" * 5000 + b"}", id="nested 5000 deep"),
    ],
)
@pytest.mark.parametrize("path", ["/ask", "/ingest"])
async def test_a_body_that_is_not_json_text_is_a_documented_422(
    body: bytes, path: str, fake_app: Any, asgi_client: Any
) -> None:
    """Found by schemathesis: FastAPI answers a body ``json.loads`` cannot even decode (not
    UTF-8, or nested past the parser's depth) with a bare 400, undocumented on ``/ingest``
    and unlike every other invalid body; it is now the 422 ``json_invalid`` envelope."""
    app, fake = fake_app()
    headers = {**ADMIN, "content-type": "application/json"}
    response = await asgi_client(app).post(path, content=body, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"
    assert response.json()["error"]["fields"][0]["type"] == "json_invalid"
    schema[path]["POST"].validate_response(response)
    assert fake.asks == [] and fake.runs == {}


@pytest.mark.parametrize(
    "error",
    [BackendTimeout("no answer within 60 s"), BackendError("the agent is unavailable")],
    ids=["timeout 504", "unavailable 503"],
)
async def test_backend_errors_on_ask_match_the_schema(
    error: BackendError, fake_app: Any, asgi_client: Any
) -> None:
    """Found reading the schema against the Serve backend: a backend failure on ``/ask``
    (Serve's deadline -> 504, an unavailable deployment -> 503) is the error envelope, but
    the schema documented only an AgentAnswer for 503/504."""
    app, _ = fake_app(FakeBackend(ask_result=error))
    response = await asgi_client(app).post("/ask", json={"question": "hi"}, headers=ADMIN)
    assert response.status_code == error.status
    schema["/ask"]["POST"].validate_response(response)


async def test_the_event_stream_is_documented_event_by_event(
    fake_app: Any, asgi_client: Any
) -> None:
    """Found by schemathesis: the SSE response was documented as ``{"type": "string"}``, so
    every event failed validation. Each event (``progress``, ``tool``, ``token``,
    ``citation``, ``done``, ``error``) and its JSON payload is now in the schema, and a stream
    is checked against it: the real stream passes, a stream with an undocumented event or
    payload does not."""
    call = ToolCallTrace(name="list_buildings", arguments={}, ok=True, duration_ms=3.0)
    events = [
        ProgressEvent(stage="started", model="local/scripted"),
        ProgressEvent(stage="model", hop=1, model="local/scripted"),
        ProgressEvent(stage="waiting", hop=1, elapsed_s=2.5),
        ProgressEvent(stage="tool_started", tool="list_buildings", arguments={}),
        ToolEvent(call=call),
        TokenEvent(text="ok"),
        DoneEvent(response=answer()),
    ]
    app, _ = fake_app(FakeBackend(stream_events=list(events)))
    response = await asgi_client(app).post(
        "/ask", json={"question": "hi", "stream": True}, headers=ADMIN
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    operation = schema["/ask"]["POST"]
    operation.validate_response(response)
    done = b"event: done\r\ndata: " + answer().model_dump_json().encode() + b"\r\n\r\n"
    for bad in (
        b'event: teleport\r\ndata: {"text": "hi"}\r\n\r\n',
        b'event: token\r\ndata: {"txt": "hi"}\r\n\r\n',
        b'event: progress\r\ndata: {"stage": "teleport"}\r\n\r\n' + done,  # unknown stage
        b'event: token\r\ndata: {"text": "hi"}\r\n\r\n',  # no final done/error event
    ):
        forged = httpx.Response(
            200,
            headers={"content-type": "text/event-stream; charset=utf-8"},
            content=bad,
            request=response.request,
        )
        forged.elapsed = response.elapsed
        with pytest.raises((Failure, FailureGroup)):
            operation.validate_response(forged)


def test_every_422_is_documented_as_the_envelope() -> None:
    """Found by reading the schema: ``GET /ingest/{run_id}`` documented FastAPI's default
    ``HTTPValidationError`` for 422, which this API never sends."""
    for path, operations in OPENAPI["paths"].items():
        for method, operation in operations.items():
            response = operation["responses"].get("422")
            if response is not None:
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ValidationErrorEnvelope"), (method, path)
    assert "HTTPValidationError" not in OPENAPI["components"]["schemas"]
