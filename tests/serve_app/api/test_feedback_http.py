"""``POST /feedback`` over real HTTP (uvicorn on 127.0.0.1) on the real embedded PostgreSQL
(a fresh database at head per test), the real Agent in a ``LocalBackend`` with the scripted
model and the twin simulator; the app counts into an ``InMemoryMetrics``.

What it shows: a turn rated by ``conversation_id`` + ``turn`` and another by ``trace_id``
are stored (a second rating replaces the first), counted by rating, put on the turn's trace
(the ``agent.feedback`` span: no Langfuse is configured here), and ``agent-service eval
export-feedback`` writes them as golden-row candidates that ``evals.dataset.load_dataset``
accepts; another caller's turn (by id or by trace id) is the unknown one's 404, byte for
byte, and nothing is stored; bad bodies are 422 envelopes naming the field.

The documentation turn with citations is written straight into the conversation store (the
store's own ``start``; this database holds no documents to search), the live-data one is
asked over HTTP."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from api_helpers import ADMIN, NORTHWIND_STAFF, is_envelope
from fastapi import FastAPI

from conversations.store import PgConversationStore, TurnRecord
from evals.dataset import load_dataset
from foundation.records import CitationOut, ToolCallTrace
from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from local_world.servers import run_in_thread
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer
from serve_app.cli import main
from serve_app.local_backend import LocalBackend
from serve_app.metrics import InMemoryMetrics

pytestmark = pytest.mark.integration

HARBOR = "bld-northwind-harbor"
Q1 = "How busy is Harbor Warehouse?"
DOC_QUESTION = "How long is the alert cooldown?"
DOC_TRACE = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def served(
    make_settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    authorizer: CedarAuthorizer,
    db_url: str,
) -> Iterator[tuple[str, InMemoryMetrics]]:
    """The API over a ``LocalBackend`` on ``db_url``, served by uvicorn; its base URL and the
    metrics it counts into."""
    settings = make_settings(
        database_url=db_url,
        # never called here (no search_docs): keeps MiniLM out of these tests
        embedding_backend="openai",
        embedding_model="openai/text-embedding-3-small",
        embedding_dim=384,
    )
    backend = make_backend(settings)
    backend._served = True  # type: ignore[attr-defined]  # closed by the lifespan below
    metrics = InMemoryMetrics()
    backend.metrics = metrics  # the app counts into its backend's sink

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    app = create_app(backend, settings, authorizer, lifespan=lifespan)
    with run_in_thread(app) as url:
        yield url, metrics


async def ask_live_turn(http: httpx.AsyncClient, llm: ScriptedLLM) -> dict[str, Any]:
    llm.script(
        {"tool_calls": [{"name": "get_building", "arguments": {"building_id": HARBOR}}]},
        {"text": "Harbor Warehouse is quiet."},
        key=Q1,
    )
    response = await http.post("/ask", json={"question": Q1}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["turn"] == 1 and body["conversation_id"] and body["trace_id"]
    return body


async def feedback_rows(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM turn_feedback"))
    finally:
        await conn.close()


def feedback_spans(spans: Any, trace_id: str, count: int) -> list[Any]:
    """The ``agent.feedback`` spans of this trace, once ``count`` have ended (they are
    recorded after the response is sent)."""
    deadline = time.monotonic() + 5
    while True:
        found = [
            s
            for s in spans.get_finished_spans()
            if s.name == "agent.feedback"
            and s.attributes.get("agent.feedback.trace_id") == trace_id
        ]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


async def test_feedback_round_trips_to_golden_rows_the_eval_loader_accepts(
    served: tuple[str, InMemoryMetrics],
    llm: ScriptedLLM,
    db_url: str,
    spans: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, metrics = served
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        live = await ask_live_turn(http, llm)
        store = PgConversationStore(await asyncpg.create_pool(db_url, min_size=1, max_size=1))
        try:
            documented, _ = await store.start(
                "nina",
                TurnRecord(
                    question=DOC_QUESTION,
                    answer="Fifteen minutes [^c0ffee000001].",
                    decision="answered",
                    idk=False,
                    model="local/scripted",
                    trace_id=DOC_TRACE,
                    citations=(
                        CitationOut(
                            chunk_id="c0ffee000001",
                            source="user/alerts.md",
                            section="Cooldown",
                            snippet="15 minutes",
                        ),
                    ),
                    tool_calls=(
                        ToolCallTrace(
                            name="search_docs",
                            arguments={"query": "q"},
                            ok=True,
                            error=None,
                            duration_ms=3.0,
                        ),
                    ),
                ),
            )
        finally:
            await store.close()

        # By conversation and turn: up first, then down with what it should have said.
        first = await http.post(
            "/feedback",
            json={"conversation_id": live["conversation_id"], "turn": 1, "rating": "up"},
            headers=NORTHWIND_STAFF,
        )
        assert first.status_code == 200, first.text
        assert (first.json()["replaced"], first.json()["trace_id"]) == (False, live["trace_id"])
        again = await http.post(
            "/feedback",
            json={
                "conversation_id": live["conversation_id"],
                "turn": 1,
                "rating": "down",
                "comment": "  It never said how many people.  ",
                "expected_answer": "Gives the current number of people in Harbor Warehouse.",
            },
            headers=NORTHWIND_STAFF,
        )
        assert again.status_code == 200, again.text
        replaced = again.json()
        assert (replaced["rating"], replaced["replaced"]) == ("down", True)
        assert replaced["created_at"] == first.json()["created_at"]
        assert datetime.fromisoformat(replaced["updated_at"]) > datetime.fromisoformat(
            first.json()["updated_at"]
        )

        # By trace id (any case): the one turn of nina's that carries it.
        by_trace = await http.post(
            "/feedback",
            json={
                "trace_id": DOC_TRACE.upper(),
                "rating": "down",
                "expected_answer": "Says the default cooldown is 15 minutes.",
            },
            headers=NORTHWIND_STAFF,
        )
        assert by_trace.status_code == 200, by_trace.text
        assert (by_trace.json()["conversation_id"], by_trace.json()["turn"]) == (
            str(documented.id),
            1,
        )
    assert await feedback_rows(db_url) == 2  # one per turn: the second rating replaced the first
    assert metrics.counters[("agent_feedback", (("rating", "up"),))] == 1
    assert metrics.counters[("agent_feedback", (("rating", "down"),))] == 2

    # On the turn's trace: an agent.feedback span with that trace id, the comment left out
    # (OBSERVE_PAYLOADS is off).
    recorded = feedback_spans(spans, live["trace_id"], 2)
    assert [s.attributes["agent.feedback.rating"] for s in recorded] == ["up", "down"]
    assert {format(s.context.trace_id, "032x") for s in recorded} == {live["trace_id"]}
    assert recorded[1].attributes["agent.feedback.replaced"] is True
    assert "agent.feedback.comment" not in recorded[1].attributes

    # The export (down, the default): both turns, as rows the eval loader accepts.
    out = tmp_path / "candidates.yaml"
    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DATABASE_URL", db_url)
    code = await asyncio.to_thread(main, ["eval", "export-feedback", "--out", str(out)])
    assert code == 0
    dataset = load_dataset(out)
    rows = {case.id: case for case in dataset.cases}
    live_row = rows[f"feedback-{live['conversation_id']}-1"].row
    assert live_row.question == Q1
    assert live_row.as_ is not None
    assert live_row.as_.model_dump() == {
        "sub": "nina",
        "roles": ["business_staff"],
        "domains": ["northwind"],
    }
    assert live_row.tools_called is not None and live_row.tools_called.all == ["get_building"]
    assert live_row.rubric == "Gives the current number of people in Harbor Warehouse."
    assert live_row.tags == ["from-feedback", "feedback-down"]
    doc_row = rows[f"feedback-{documented.id}-1"].row
    assert doc_row.cited_sources == ["user/alerts.md"]
    assert doc_row.tools_called is not None and doc_row.tools_called.all == ["search_docs"]
    assert doc_row.rubric == "Says the default cooldown is 15 minutes."
    assert "# comment: It never said how many people." in out.read_text()
    assert len(rows) == 2

    code = await asyncio.to_thread(
        main, ["eval", "export-feedback", "--out", str(out), "--rating", "up"]
    )
    assert code == 0 and "rows: []" in out.read_text()  # nothing rated up any more
    since = ["eval", "export-feedback", "--out", str(out), "--rating", "all", "--since"]
    assert await asyncio.to_thread(main, [*since, "1h"]) == 0
    assert len(load_dataset(out).cases) == 2
    assert await asyncio.to_thread(main, [*since, "2999-01-01"]) == 0
    assert "rows: []" in out.read_text()


async def test_another_callers_turn_is_the_unknown_ones_404_byte_for_byte(
    served: tuple[str, InMemoryMetrics], llm: ScriptedLLM, db_url: str
) -> None:
    """The admin rates nina's turn (by id, by trace id) while it exists, then after nina
    deleted the conversation (the same id and trace, now unknown): the same bytes (status,
    headers but the request id, body), as GET /conversations/{id} answers; nothing stored,
    nothing counted."""
    url, metrics = served
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        live = await ask_live_turn(http, llm)
        ident, trace = live["conversation_id"], live["trace_id"]
        bodies = [
            {"conversation_id": ident, "turn": 1, "rating": "down"},
            {"trace_id": trace, "rating": "down"},
        ]
        theirs = [await http.post("/feedback", json=b, headers=ADMIN) for b in bodies]
        own_missing_turn = await http.post(
            "/feedback",
            json={"conversation_id": ident, "turn": 2, "rating": "up"},
            headers=NORTHWIND_STAFF,
        )
        read = await http.get(f"/conversations/{ident}", headers=ADMIN)
        assert (await http.delete(f"/conversations/{ident}", headers=NORTHWIND_STAFF)).is_success
        unknown = [await http.post("/feedback", json=b, headers=ADMIN) for b in bodies]
        strangers = [
            await http.post(
                "/feedback",
                json={"conversation_id": str(uuid.uuid4()), "turn": 1, "rating": "up"},
                headers=NORTHWIND_STAFF,
            ),
            await http.post(
                "/feedback", json={"trace_id": "f" * 32, "rating": "up"}, headers=NORTHWIND_STAFF
            ),
        ]
    for mine, gone in zip(theirs, unknown, strict=True):
        assert mine.status_code == gone.status_code == 404
        assert mine.content == gone.content
        assert {k: v for k, v in mine.headers.items() if k not in ("x-request-id", "date")} == {
            k: v for k, v in gone.headers.items() if k not in ("x-request-id", "date")
        }
    assert theirs[0].content == read.content  # GET /conversations/{id}'s own 404
    assert theirs[0].json() == {
        "error": {"code": "not_found", "message": f"no conversation {ident}"}
    }
    assert (
        theirs[1].json()["error"]["message"]
        == f"no turn with trace id {trace} in your conversations"
    )
    assert own_missing_turn.status_code == 404
    assert own_missing_turn.json()["error"]["message"] == f"conversation {ident} has no turn 2"
    assert all(r.status_code == 404 and is_envelope(r.json(), "not_found") for r in strangers)
    assert await feedback_rows(db_url) == 0
    assert not any(name == "agent_feedback" for name, _ in metrics.counters)


async def test_a_trace_id_on_several_of_the_callers_turns_is_a_409(
    served: tuple[str, InMemoryMetrics], db_url: str
) -> None:
    """A caller that sent one ``traceparent`` with two questions has two turns with one trace
    id: rating by it is refused (409 ``ambiguous_trace_id``), by turn it works."""
    url, _ = served
    store = PgConversationStore(await asyncpg.create_pool(db_url, min_size=1, max_size=1))
    try:
        record = TurnRecord("q", "a", "answered", False, "m", trace_id=DOC_TRACE)
        first, _ = await store.start("nina", record)
        await store.start("nina", record)
    finally:
        await store.close()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.post(
            "/feedback", json={"trace_id": DOC_TRACE, "rating": "up"}, headers=NORTHWIND_STAFF
        )
        assert response.status_code == 409, response.text
        assert is_envelope(response.json(), "ambiguous_trace_id")
        assert await feedback_rows(db_url) == 0
        by_turn = await http.post(
            "/feedback",
            json={"conversation_id": str(first.id), "turn": 1, "rating": "up"},
            headers=NORTHWIND_STAFF,
        )
        assert by_turn.status_code == 200 and by_turn.json()["trace_id"] == DOC_TRACE


async def test_bad_feedback_is_a_422_envelope_naming_the_field(
    served: tuple[str, InMemoryMetrics], db_url: str
) -> None:
    url, _ = served
    ident = str(uuid.uuid4())
    cases: list[tuple[Any, str]] = [
        ({"conversation_id": ident, "turn": 1, "rating": "meh"}, "rating"),
        ({"conversation_id": ident, "turn": 1, "rating": 1}, "rating"),
        ({"conversation_id": ident, "turn": 1}, "rating"),
        ({"conversation_id": ident, "turn": 0, "rating": "up"}, "turn"),
        ({"conversation_id": ident, "turn": "1", "rating": "up"}, "turn"),
        ({"conversation_id": "nope", "turn": 1, "rating": "up"}, "conversation_id"),
        ({"conversation_id": ident, "turn": 1, "rating": "up", "comment": "x" * 2001}, "comment"),
        (
            {"conversation_id": ident, "turn": 1, "rating": "up", "expected_answer": "x" * 4001},
            "expected_answer",
        ),
        ({"trace_id": "not-a-trace", "rating": "up"}, "trace_id"),
        ({"rating": "up"}, "body"),  # no turn named
        ({"conversation_id": ident, "rating": "up"}, "body"),  # a turn number is needed
        ({"conversation_id": ident, "turn": 1, "trace_id": "a" * 32, "rating": "up"}, "body"),
        ({"conversation_id": ident, "turn": 1, "rating": "up", "stars": 5}, "stars"),
        ([], "body"),
    ]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for body, field in cases:
            response = await http.post("/feedback", json=body, headers=NORTHWIND_STAFF)
            assert response.status_code == 422, (body, response.text)
            error = response.json()
            assert is_envelope(error, "validation_error"), error
            assert [f["field"] for f in error["error"]["fields"]] == [field], (body, error)
            assert "x" * 100 not in response.text  # the input is never echoed
        unauthenticated = await http.post(
            "/feedback", json={"conversation_id": ident, "turn": 1, "rating": "up"}
        )
        assert unauthenticated.status_code == 401
    assert await feedback_rows(db_url) == 0
