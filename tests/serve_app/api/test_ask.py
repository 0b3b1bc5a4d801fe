"""``POST /ask`` end to end: the real Agent in a ``LocalBackend``, the scripted model server,
the twin/sensor simulators and the sample documentation in the embedded PostgreSQL (searched
with the real MiniLM), over httpx-ASGI and over real HTTP (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_helpers import (
    ADMIN,
    CLAIMS,
    NORTHWIND_ADMIN,
    NORTHWIND_STAFF,
    SpyBackend,
    is_envelope,
    parse_sse_text,
    read_sse,
)

from foundation.identity import AuthUser
from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from retrieval.rerankers import NoopReranker
from retrieval.search import HybridRetriever, SearchHit
from retrieval.store import PgDocumentStore
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer
from serve_app.local_backend import LocalBackend
from serve_app.wiring import retrieval_config

pytestmark = pytest.mark.integration

SettingsFactory = Callable[..., Settings]
BackendFactory = Callable[..., LocalBackend]
ClientFactory = Callable[..., httpx.AsyncClient]
Serve = Callable[..., str]

QUERY = "occupancy alert cooldown"
STAFF_USER = AuthUser.from_claims_header(NORTHWIND_STAFF[CLAIMS])


@pytest.fixture(scope="module")
def docs_db(sample_docs_url: str) -> str:
    return sample_docs_url


@pytest.fixture
def settings(make_settings: SettingsFactory, docs_db: str) -> Settings:
    return make_settings(database_url=docs_db)


@pytest.fixture
async def expected_hit(docs_db: str, minilm: Any, settings: Settings) -> SearchHit:
    """What ``search_docs`` will return first for QUERY (same retrieval, run directly)."""
    store = await PgDocumentStore.connect(docs_db, embedding_dim=384, max_size=1)
    try:
        retriever = HybridRetriever(store, minilm, NoopReranker(), retrieval_config(settings))
        hits = await retriever.search(QUERY, acl=STAFF_USER.acl_entries)
    finally:
        await store.close()
    assert hits
    return hits[0]


def load_chain(llm: ScriptedLLM, question: str, hit: SearchHit, **text_step: Any) -> str:
    """search_docs, then get_building, then an answer citing the first hit."""
    text = (
        f"Alert notifications cool down for 15 minutes [^{hit.chunk_id}]. "
        "Harbor Warehouse is at 12 Quay Road."
    )
    llm.script(
        {"tool_calls": [{"name": "search_docs", "arguments": {"query": QUERY}}]},
        {
            "tool_calls": [
                {"name": "get_building", "arguments": {"building_id": "bld-northwind-harbor"}}
            ]
        },
        {"text": text, **text_step},
        key=question,
    )
    return text


def app_for(backend: LocalBackend, settings: Settings, authorizer: CedarAuthorizer) -> Any:
    return create_app(backend, settings, authorizer)


def without_durations(answer: dict[str, Any]) -> dict[str, Any]:
    """What two runs of the same script share: not timings, not the (per-request) trace id,
    not the conversation each started."""
    copy = dict(answer)
    copy["tool_calls"] = [{**c, "duration_ms": 0} for c in answer["tool_calls"]]
    assert isinstance(copy.pop("trace_id"), str)
    assert isinstance(copy.pop("conversation_id"), str)
    return copy


# --- JSON -----------------------------------------------------------------------------------------


async def test_json_ask_runs_a_tool_chain_and_cites_a_real_chunk(
    settings: Settings,
    make_backend: BackendFactory,
    authorizer: CedarAuthorizer,
    asgi_client: ClientFactory,
    llm: ScriptedLLM,
    expected_hit: SearchHit,
) -> None:
    question = "How long is the alert cooldown, and where is Harbor Warehouse?"
    text = load_chain(llm, question, expected_hit)
    client = asgi_client(app_for(make_backend(settings), settings, authorizer))
    response = await client.post("/ask", json={"question": question}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["decision"] == "answered" and body["idk"] is False
    assert body["answer"] == text
    assert [(c["name"], c["ok"]) for c in body["tool_calls"]] == [
        ("search_docs", True),
        ("get_building", True),
    ]
    assert body["citations"] == [
        {
            "chunk_id": expected_hit.chunk_id,
            "source": expected_hit.source,
            "section": expected_hit.section,
            "snippet": body["citations"][0]["snippet"],
        }
    ]
    assert body["citations"][0]["snippet"] and body["retrieval"]["hallucinated_citations"] == []
    assert expected_hit.chunk_id in body["retrieval"]["chunk_ids"]
    assert body["usage"]["input_tokens"] > 0 and len(body["usage"]["hops"]) == 3
    assert body["model"] == "local/scripted" and body["error"] is None
    # the tools ran as the caller: the twin simulator saw the caller's claims
    first = llm.chat_requests(question)[0].body
    assert first["model"] == "local/scripted"


async def test_top_k_is_wired_into_retrieval(
    settings: Settings,
    make_backend: BackendFactory,
    authorizer: CedarAuthorizer,
    asgi_client: ClientFactory,
    llm: ScriptedLLM,
) -> None:
    client = asgi_client(app_for(make_backend(settings), settings, authorizer))
    seen = {}
    for top_k in (2, None):
        question = f"Search with top_k={top_k}"
        llm.script(
            {"tool_calls": [{"name": "search_docs", "arguments": {"query": QUERY}}]},
            {"text": "Done."},
            key=question,
        )
        body: dict[str, Any] = {"question": question}
        if top_k is not None:
            body["top_k"] = top_k
        response = await client.post("/ask", json=body, headers=NORTHWIND_STAFF)
        assert response.status_code == 200, response.text
        seen[top_k] = response.json()["retrieval"]["chunks_seen"]
    assert seen == {2: 2, None: settings.top_k_final}


async def test_an_eval_token_user_can_ask(
    settings: Settings,
    make_backend: BackendFactory,
    authorizer: CedarAuthorizer,
    asgi_client: ClientFactory,
    llm: ScriptedLLM,
) -> None:
    from api_helpers import SECRET

    from foundation.eval_tokens import mint_eval_token

    token = mint_eval_token(SECRET, "eval-runner", ["business_staff"], ["northwind"])
    question = "List my buildings, please"
    llm.script(
        {"tool_calls": [{"name": "list_buildings", "arguments": {}}]},
        {"text": "You have Harbor Warehouse and Northwind HQ."},
        key=question,
    )
    client = asgi_client(app_for(make_backend(settings), settings, authorizer))
    response = await client.post(
        "/ask", json={"question": question}, headers={"authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text
    call = response.json()["tool_calls"][0]
    assert call["name"] == "list_buildings" and call["ok"]


async def test_the_answer_says_who_wrote_it_in_json_in_done_and_in_the_stored_turns(
    settings: Settings,
    make_backend: BackendFactory,
    authorizer: CedarAuthorizer,
    asgi_client: ClientFactory,
    llm: ScriptedLLM,
) -> None:
    """The model's answer is the model's; the IDK answer the service puts in place of a reply
    whose figure no tool result holds (after the repair call) is the service's."""
    client = asgi_client(app_for(make_backend(settings), settings, authorizer))
    question = "What can you tell me about my workplace?"
    llm.script({"text": "I can tell you about your buildings, rooms and sensors."}, key=question)
    response = await client.post("/ask", json={"question": question}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200, response.text
    first = response.json()
    assert (first["decision"], first["answered_by"]) == ("answered", "model")

    invented = "There are 73 people in your lobby right now."
    llm.script({"text": invented}, {"text": invented}, key=question)
    ask = {"question": question, "stream": True, "conversation_id": first["conversation_id"]}
    streamed = await client.post("/ask", json=ask, headers=NORTHWIND_STAFF)
    name, done = parse_sse_text(streamed.text)[-1]
    assert name == "done" and done["decision"] == "idk" and done["answered_by"] == "service"

    thread = await client.get(f"/conversations/{first['conversation_id']}", headers=NORTHWIND_STAFF)
    assert [t["answered_by"] for t in thread.json()["turns"]] == ["model", "service"]


# --- model override -------------------------------------------------------------------------------


async def test_model_override_403_400_and_allowed(
    make_settings: SettingsFactory,
    docs_db: str,
    make_backend: BackendFactory,
    authorizer: CedarAuthorizer,
    asgi_client: ClientFactory,
    llm: ScriptedLLM,
) -> None:
    settings = make_settings(database_url=docs_db, allowed_models=["openai/gpt-4o-mini"])
    client = asgi_client(app_for(make_backend(settings), settings, authorizer))
    question = "Which model answers this?"
    llm.script({"text": "This one."}, key=question)

    below = await client.post(
        "/ask",
        json={"question": question, "model": "openai/gpt-4o-mini"},
        headers=NORTHWIND_STAFF,
    )
    assert below.status_code == 403
    assert is_envelope(below.json(), "model_override_forbidden")
    assert "business_admin" in below.json()["error"]["message"]

    outside = await client.post(
        "/ask",
        json={"question": question, "model": "google/gemini-2.5-flash"},
        headers=NORTHWIND_ADMIN,
    )
    assert outside.status_code == 400 and is_envelope(outside.json(), "model_not_allowed")

    embedding = await client.post(
        "/ask", json={"question": question, "model": settings.embedding_model}, headers=ADMIN
    )
    assert embedding.status_code == 400

    assert llm.chat_requests(question) == []  # no refused request reached the model
    allowed = await client.post(
        "/ask",
        json={"question": question, "model": "openai/gpt-4o-mini"},
        headers=NORTHWIND_ADMIN,
    )
    assert allowed.status_code == 200, allowed.text
    assert llm.chat_requests(question)[0].body["model"] == "openai/gpt-4o-mini"
    assert allowed.json()["model"] == "openai/gpt-4o-mini"

    # asking for the configured answer model is no override: anyone may
    llm.script({"text": "Default."}, key=question)
    same = await client.post(
        "/ask", json={"question": question, "model": "local/scripted"}, headers=NORTHWIND_STAFF
    )
    assert same.status_code == 200


# --- provider errors through the real client ------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "status", "code"),
    [
        ([{"fault": "server_error", "status": 503}], 503, "provider_unavailable"),
        ([{"fault": "rate_limit"}], 503, "provider_unavailable"),
        ([{"fault": "server_error", "status": 400}], 502, "provider_rejected"),
        ([{"fault": "malformed"}, {"fault": "malformed"}], 502, "malformed_reply"),
        ([{"fault": "hang"}], 504, "provider_unavailable"),
    ],
)
async def test_provider_errors_map_to_5xx_with_the_answer(
    steps: list[dict[str, Any]],
    status: int,
    code: str,
    make_settings: SettingsFactory,
    docs_db: str,
    make_backend: BackendFactory,
    authorizer: CedarAuthorizer,
    asgi_client: ClientFactory,
    llm: ScriptedLLM,
) -> None:
    settings = make_settings(database_url=docs_db, llm_timeout_seconds=1.0)
    client = asgi_client(app_for(make_backend(settings), settings, authorizer))
    question = f"Provider fault {code} {status}"
    llm.script(*steps, key=question)
    response = await client.post("/ask", json={"question": question}, headers=NORTHWIND_STAFF)
    assert response.status_code == status, response.text
    body = response.json()
    assert is_envelope(body, code)
    assert body["decision"] == "provider_error" and body["answer"]
    assert body["answered_by"] == "service"  # its fixed message, not the model's
    assert "test-key" not in response.text

    # streamed: the status is 200 by then; one error event carries the same object
    llm.script(*steps, key=question)
    streamed = await client.post(
        "/ask", json={"question": question, "stream": True}, headers=NORTHWIND_STAFF
    )
    assert streamed.status_code == 200
    events = parse_sse_text(streamed.text)
    assert events[-1][0] == "error" and [n for n, _ in events].count("error") == 1
    assert "done" not in [n for n, _ in events]
    assert is_envelope(events[-1][1], code) and events[-1][1]["decision"] == "provider_error"


# --- SSE over real HTTP ---------------------------------------------------------------------------


async def test_stream_events_in_order_and_done_is_the_json_answer(
    settings: Settings,
    make_backend: BackendFactory,
    serve_local: Serve,
    llm: ScriptedLLM,
    expected_hit: SearchHit,
) -> None:
    url = serve_local(settings, make_backend(settings))
    question = "Cooldown and Harbor Warehouse address, streamed"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        load_chain(llm, question, expected_hit)
        json_answer = (
            await client.post("/ask", json={"question": question}, headers=NORTHWIND_STAFF)
        ).json()
        load_chain(llm, question, expected_hit, chunk_chars=5)
        async with client.stream(
            "POST", "/ask", json={"question": question, "stream": True}, headers=NORTHWIND_STAFF
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-store"
            received = await read_sse(response)

    assert received[0].event == "progress" and received[0].data["stage"] == "started"
    events = [e for e in received if e.event != "progress"]  # progress: test_ask_progress.py
    names = [e.event for e in events]
    assert names[:2] == ["tool", "tool"]
    assert [e.data["name"] for e in events[:2]] == ["search_docs", "get_building"]
    assert names[-1] == "done" and names.count("done") == 1
    assert set(names[2:-1]) == {"token", "citation"}
    tokens = [e.data["text"] for e in events if e.event == "token"]
    assert len(tokens) > 5  # per token, not one blob
    done = events[-1].data
    assert "".join(tokens) == done["answer"]
    citation_at = names.index("citation")
    marker = f"[^{expected_hit.chunk_id}]"
    assert marker in "".join(tokens[: citation_at - 2])  # sent once its marker was complete
    assert events[citation_at].data == done["citations"][0]
    assert set(done) == set(json_answer)
    assert without_durations(done) == without_durations(json_answer)


async def test_tokens_arrive_before_the_model_finishes(
    settings: Settings,
    make_backend: BackendFactory,
    serve_local: Serve,
    llm: ScriptedLLM,
) -> None:
    url = serve_local(settings, make_backend(settings))
    question = "Stream slowly, please"
    text = "Occupancy is counted per room and refreshed every minute by the sensors. " * 2
    llm.script({"text": text, "chunk_chars": 8, "stream_delay_ms": 60}, key=question)
    started = time.monotonic()
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as client,
        client.stream(
            "POST", "/ask", json={"question": question, "stream": True}, headers=NORTHWIND_STAFF
        ) as response,
    ):
        events = await read_sse(response)
    tokens = [e for e in events if e.event == "token"]
    done = events[-1]
    assert done.event == "done" and done.data["answer"] == text.strip()
    assert len(tokens) >= 10
    model_time = (len(text) / 8) * 0.06  # the scripted server's own pacing
    assert done.at - started >= model_time * 0.9
    # the first token reached the client while the model was still far from done
    assert done.at - tokens[0].at >= model_time * 0.6
    assert tokens[len(tokens) // 2].at < done.at - 0.2


def _serve_a_long_answer(
    settings: Settings,
    make_backend: BackendFactory,
    serve_local: Serve,
    llm: ScriptedLLM,
    question: str,
) -> tuple[SpyBackend, str]:
    """A served app whose backend is spied on, and ~10 s of streamed answer to ``question``."""
    spy = SpyBackend(make_backend(settings))
    url = serve_local(settings, spy)
    llm.script({"text": "word " * 400, "chunk_chars": 10, "stream_delay_ms": 50}, key=question)
    return spy, url


async def test_a_client_disconnect_cancels_the_run(
    settings: Settings,
    make_backend: BackendFactory,
    serve_local: Serve,
    llm: ScriptedLLM,
) -> None:
    question = "A very long answer I will not wait for"
    spy, url = _serve_a_long_answer(settings, make_backend, serve_local, llm, question)
    started = time.monotonic()
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as client,
        client.stream(
            "POST", "/ask", json={"question": question, "stream": True}, headers=NORTHWIND_STAFF
        ) as response,
    ):
        first = await read_sse(response, stop=lambda e: e.event == "token")
    hung_up = time.monotonic()
    assert first and first[-1].event == "token"
    assert await asyncio.to_thread(spy.closed.wait, 5.0), "the backend stream was never closed"
    assert spy.closed_at is not None and spy.closed_at - hung_up < 3.0
    assert "done" not in spy.events
    assert time.monotonic() - started < 8.0  # well before the model would have finished
    # the server is fine afterwards
    llm.script({"text": "Still here."}, key="Are you still there?")
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        again = await client.post(
            "/ask", json={"question": "Are you still there?"}, headers=NORTHWIND_STAFF
        )
    assert again.status_code == 200 and again.json()["answer"] == "Still here."


async def test_a_stream_past_its_deadline_ends_with_a_timeout_error_and_stops_the_run(
    make_settings: SettingsFactory,
    docs_db: str,
    make_backend: BackendFactory,
    serve_local: Serve,
    llm: ScriptedLLM,
) -> None:
    """ASK_TIMEOUT_SECONDS binds streams too: the client gets one final ``error`` event (code
    ``timeout``) at the deadline, and the backend's run is cancelled there, not left to finish."""
    settings = make_settings(database_url=docs_db, ask_timeout_seconds=2.0)
    question = "A streamed answer that outlasts the deadline"
    spy, url = _serve_a_long_answer(settings, make_backend, serve_local, llm, question)
    started = time.monotonic()
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as client,
        client.stream(
            "POST", "/ask", json={"question": question, "stream": True}, headers=NORTHWIND_STAFF
        ) as response,
    ):
        assert response.status_code == 200
        events = await read_sse(response)
    ended = time.monotonic() - started
    assert [e.event for e in events].count("token") >= 1  # it was streaming when cut
    last = events[-1]
    assert last.event == "error" and is_envelope(last.data, "timeout"), last
    assert "2 s" in last.data["error"]["message"]
    assert not any(e.event == "done" for e in events)
    assert 2.0 <= ended < 6.0
    assert await asyncio.to_thread(spy.closed.wait, 5.0), "the backend stream was never closed"
    assert spy.closed_at is not None and spy.closed_at - started < 4.0
    assert "done" not in spy.events
