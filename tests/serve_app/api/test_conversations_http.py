"""Conversations through the app's HTTP layer on the real embedded PostgreSQL (a fresh
database at head per test): the real Agent in a ``LocalBackend`` with the scripted model
server and the twin simulator (over httpx-ASGI), or a model the test paces (served by
uvicorn on 127.0.0.1, so a stream really streams and a disconnect is a real one).

What it shows: ``/ask`` without ``conversation_id`` starts a thread and says so (JSON and the
stream's ``done``), with one continues it, and ``GET /conversations/{id}`` gives the turns
back; another caller's thread is the unknown id's 404, byte for byte, on every route, and
spends no model call; ``CONVERSATION_MAX_TURNS`` is a 409 before the model; bad ids are 422
envelopes; a turn whose write fails half way is not stored at all (and the answer says so);
a thread deleted mid-stream ends the stream with a ``conversation_deleted`` error and
nothing stored; a client that disconnects mid-stream leaves no turn."""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest
from api_helpers import (
    ADMIN,
    NORTHWIND_ADMIN,
    NORTHWIND_STAFF,
    SpyBackend,
    is_envelope,
    parse_sse_text,
    read_sse,
)
from scipy.stats import mannwhitneyu

from agent.llm.base import ChatRequest, ChatResult
from agent.testing import FunctionModel, text_reply
from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer
from serve_app.local_backend import LocalBackend
from serve_app.threads import NOT_STORED_NOTE

pytestmark = pytest.mark.integration

HARBOR = "bld-northwind-harbor"
Q1 = "How busy is Harbor Warehouse?"
Q2 = "and where is it?"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], db_url: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return make_settings(
            database_url=db_url,
            # never called here (no search_docs): keeps MiniLM out of these tests
            embedding_backend="openai",
            embedding_model="openai/text-embedding-3-small",
            embedding_dim=384,
            **overrides,
        )

    return make


@pytest.fixture
def client(
    settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    authorizer: CedarAuthorizer,
    asgi_client: Callable[..., httpx.AsyncClient],
) -> Callable[..., httpx.AsyncClient]:
    def make(**overrides: Any) -> httpx.AsyncClient:
        s = settings(**overrides)
        return asgi_client(create_app(make_backend(s), s, authorizer))

    return make


def script_building_turn(llm: ScriptedLLM, question: str, text: str) -> None:
    llm.script(
        {"tool_calls": [{"name": "get_building", "arguments": {"building_id": HARBOR}}]},
        {"text": text},
        key=question,
    )


async def counts(db_url: str) -> tuple[int, int]:
    conn = await asyncpg.connect(db_url)
    try:
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM conversations) AS c, "
            "(SELECT count(*) FROM conversation_turns) AS t"
        )
    finally:
        await conn.close()
    assert row is not None
    return int(row["c"]), int(row["t"])


# --- a thread, JSON and SSE -----------------------------------------------------------------------


async def test_a_two_turn_thread_over_json_and_sse_reads_back_whole(
    client: Callable[..., httpx.AsyncClient], llm: ScriptedLLM, db_url: str
) -> None:
    http = client()
    script_building_turn(llm, Q1, "Harbor Warehouse is in Northwind.")
    first = await http.post("/ask", json={"question": Q1}, headers=NORTHWIND_STAFF)
    assert first.status_code == 200, first.text
    body = first.json()
    ident, trace_id = body["conversation_id"], body["trace_id"]
    assert ident and body["turn"] == 1 and body["decision"] == "answered"

    # The scripted server picks a script by the request's first user message: in a
    # follow-up that is the thread's first question (the history comes first).
    script_building_turn(llm, Q1, "It is at 12 Quay Road.")
    streamed = await http.post(
        "/ask",
        json={"question": Q2, "stream": True, "conversation_id": ident},
        headers=NORTHWIND_STAFF,
    )
    events = parse_sse_text(streamed.text)
    name, done = events[-1]
    assert name == "done", events
    assert (done["conversation_id"], done["turn"]) == (ident, 2)
    assert done["answer"] == "It is at 12 Quay Road."
    follow_up = llm.chat_requests(Q1)[-2].body["messages"]  # turn 2's first model call
    assert [(m["role"], m.get("content")) for m in follow_up[1:4]] == [
        ("user", Q1),
        ("assistant", "Harbor Warehouse is in Northwind."),
        ("user", Q2),
    ]

    thread = (await http.get(f"/conversations/{ident}", headers=NORTHWIND_STAFF)).json()
    assert (thread["id"], thread["turn_count"], thread["title"]) == (ident, 2, Q1)
    one, two = thread["turns"]
    assert (one["turn"], one["question"], one["answer"]) == (
        1,
        Q1,
        "Harbor Warehouse is in Northwind.",
    )
    assert one["trace_id"] == trace_id and one["model"] == "local/scripted"
    assert [(c["name"], c["ok"], c["arguments"]) for c in one["tool_calls"]] == [
        ("get_building", True, {"building_id": HARBOR})
    ]
    assert one["usage"]["input_tokens"] > 0 and one["decision"] == "answered"
    assert (two["turn"], two["question"], two["answer"]) == (2, Q2, done["answer"])
    assert two["usage"] == done["usage"] and two["cost"] == done["cost"]

    listing = (await http.get("/conversations", headers=NORTHWIND_STAFF)).json()
    assert [c["id"] for c in listing["conversations"]] == [ident]
    assert await counts(db_url) == (1, 2)


async def test_pages_and_delete_on_the_real_database(
    client: Callable[..., httpx.AsyncClient], llm: ScriptedLLM, db_url: str
) -> None:
    http = client()
    llm.script({"text": "Hello."}, mode="loop")
    made = []
    for i in range(5):
        response = await http.post("/ask", json={"question": f"hello {i}"}, headers=NORTHWIND_STAFF)
        made.append(response.json()["conversation_id"])
    await http.post("/ask", json={"question": "the admin's"}, headers=ADMIN)
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await http.get("/conversations", params=params, headers=NORTHWIND_STAFF)).json()
        seen += [c["id"] for c in page["conversations"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(made))
    deleted = await http.delete(f"/conversations/{made[2]}", headers=NORTHWIND_STAFF)
    assert deleted.status_code == 204
    listing = (await http.get("/conversations", headers=NORTHWIND_STAFF)).json()
    assert made[2] not in [c["id"] for c in listing["conversations"]]
    assert await counts(db_url) == (5, 5)  # its turn went with it; the admin's stays


# --- ownership, limits, bad ids -----------------------------------------------------------------


async def test_another_callers_thread_is_the_unknown_ids_404_on_every_route(
    client: Callable[..., httpx.AsyncClient], llm: ScriptedLLM
) -> None:
    """nina's thread, asked for by nora (same domain, higher role) while it exists and again
    after nina deleted it: the same bytes each time; and nora's ask in it runs no model."""
    http = client()
    llm.script({"text": "Hello."}, mode="loop")
    answers = []
    requests: list[tuple[str, str, dict[str, Any] | None]] = []
    for _ in range(2):
        made = await http.post("/ask", json={"question": "hello"}, headers=NORTHWIND_STAFF)
        ident = made.json()["conversation_id"]
        requests = [
            ("GET", f"/conversations/{ident}", None),
            ("DELETE", f"/conversations/{ident}", None),
            ("POST", "/ask", {"question": "hello", "conversation_id": ident}),
            ("POST", "/ask", {"question": "hello", "conversation_id": ident, "stream": True}),
        ]
        calls = len(llm.chat_requests())
        theirs = [await http.request(m, p, json=b, headers=NORTHWIND_ADMIN) for m, p, b in requests]
        assert len(llm.chat_requests()) == calls  # no model call for a refused thread
        deleted = await http.delete(f"/conversations/{ident}", headers=NORTHWIND_STAFF)
        assert deleted.status_code == 204  # it was there, untouched, all along
        unknown = [
            await http.request(m, p, json=b, headers=NORTHWIND_ADMIN) for m, p, b in requests
        ]
        answers.append((ident, theirs, unknown))
    for ident, theirs, unknown in answers:
        for a, b in zip(theirs, unknown, strict=True):
            assert a.status_code == b.status_code == 404
            assert a.content == b.content
            assert a.json() == {
                "error": {"code": "not_found", "message": f"no conversation {ident}"}
            }
            assert a.headers["content-type"] == b.headers["content-type"] == "application/json"


async def test_a_full_thread_is_a_409_before_any_model_call(
    client: Callable[..., httpx.AsyncClient], llm: ScriptedLLM, db_url: str
) -> None:
    http = client(conversation_max_turns=2)
    llm.script({"text": "Hello."}, mode="loop")
    ident = (await http.post("/ask", json={"question": "one"}, headers=NORTHWIND_STAFF)).json()[
        "conversation_id"
    ]
    two = await http.post(
        "/ask", json={"question": "two", "conversation_id": ident}, headers=NORTHWIND_STAFF
    )
    assert two.json()["turn"] == 2
    calls = len(llm.chat_requests())
    for stream in (False, True):
        three = await http.post(
            "/ask",
            json={"question": "three", "conversation_id": ident, "stream": stream},
            headers=NORTHWIND_STAFF,
        )
        assert three.status_code == 409 and is_envelope(three.json(), "conversation_full")
        assert "2 turns" in three.json()["error"]["message"]
    assert len(llm.chat_requests()) == calls
    assert await counts(db_url) == (1, 2)


@pytest.mark.parametrize("bad", ["nope", "123", 42, "e3e70682-c209-1cac-a29f-6fbed82c07c"])
async def test_an_ask_with_a_bad_conversation_id_is_a_422(
    bad: object, client: Callable[..., httpx.AsyncClient], llm: ScriptedLLM
) -> None:
    response = await client().post(
        "/ask", json={"question": "hello", "conversation_id": bad}, headers=NORTHWIND_STAFF
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert is_envelope(body, "validation_error")
    assert [f["field"] for f in body["error"]["fields"]] == ["conversation_id"]
    assert llm.chat_requests() == []


# --- whole turns or none ------------------------------------------------------------------------

FAIL_ON_BOOM = """
CREATE FUNCTION fail_on_boom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.question = 'boom' THEN RAISE EXCEPTION 'simulated failure mid-write'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_on_boom BEFORE INSERT ON conversation_turns
    FOR EACH ROW EXECUTE FUNCTION fail_on_boom();
"""


async def test_a_turn_whose_write_fails_half_way_is_not_stored_at_all(
    client: Callable[..., httpx.AsyncClient], llm: ScriptedLLM, db_url: str
) -> None:
    """The turn's INSERT fails after its conversation row was written (a new thread) or its
    count raised (a continued one): nothing of it stays, and the answer says it was not
    stored (``turn`` null) instead of claiming a place it does not have."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(FAIL_ON_BOOM)
    finally:
        await conn.close()
    http = client()
    llm.script({"text": "Hello."}, mode="loop")
    lost = await http.post("/ask", json={"question": "boom"}, headers=NORTHWIND_STAFF)
    assert lost.status_code == 200, lost.text
    assert (lost.json()["conversation_id"], lost.json()["turn"]) == (None, None)
    assert lost.json()["notes"][-1] == NOT_STORED_NOTE
    assert await counts(db_url) == (0, 0)

    kept = await http.post("/ask", json={"question": "hello"}, headers=NORTHWIND_STAFF)
    ident = kept.json()["conversation_id"]
    lost = await http.post(
        "/ask",
        json={"question": "boom", "conversation_id": ident, "stream": True},
        headers=NORTHWIND_STAFF,
    )
    name, done = parse_sse_text(lost.text)[-1]
    assert name == "done" and (done["conversation_id"], done["turn"]) == (ident, None)
    thread = (await http.get(f"/conversations/{ident}", headers=NORTHWIND_STAFF)).json()
    assert thread["turn_count"] == 1 and [t["question"] for t in thread["turns"]] == ["hello"]
    assert await counts(db_url) == (1, 1)


class PacedModel:
    """A model whose reply waits until the test releases it (a ``threading.Event``: the
    server runs on its own loop in another thread)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.called = threading.Event()

    async def reply(self, request: ChatRequest) -> ChatResult:
        self.called.set()
        # polled, not awaited in a thread: cancelling the run (a disconnect) must stop it
        while True:
            if self.release.is_set():
                return text_reply("Harbor Warehouse is quiet.")
            await asyncio.sleep(0.02)


async def test_a_thread_deleted_mid_stream_ends_with_a_409_error_and_nothing_stored(
    settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    serve_local: Callable[..., str],
    db_url: str,
) -> None:
    s = settings()
    model = PacedModel()
    url = serve_local(s, make_backend(s, llm=FunctionModel(model.reply, model="local/paced")))
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        model.release.set()
        first = await http.post("/ask", json={"question": Q1}, headers=NORTHWIND_STAFF)
        ident = first.json()["conversation_id"]
        model.release.clear()
        model.called.clear()
        async with http.stream(
            "POST",
            "/ask",
            json={"question": Q2, "conversation_id": ident, "stream": True},
            headers=NORTHWIND_STAFF,
        ) as response:
            assert response.status_code == 200
            await asyncio.to_thread(model.called.wait, 10)
            deleted = await http.delete(f"/conversations/{ident}", headers=NORTHWIND_STAFF)
            assert deleted.status_code == 204
            model.release.set()
            events = await read_sse(response)
    assert events[-1].event == "error", [e.event for e in events]
    assert is_envelope(events[-1].data, "conversation_deleted")
    assert "not stored" in events[-1].data["error"]["message"]
    assert not [e for e in events if e.event == "done"]
    assert await counts(db_url) == (0, 0)


@pytest.mark.parametrize("continued", [False, True], ids=["new thread", "continued thread"])
async def test_a_client_that_disconnects_mid_stream_leaves_no_turn(
    continued: bool,
    settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    serve_local: Callable[..., str],
    db_url: str,
) -> None:
    s = settings()
    model = PacedModel()
    spy = SpyBackend(make_backend(s, llm=FunctionModel(model.reply, model="local/paced")))
    url = serve_local(s, spy)
    body: dict[str, Any] = {"question": Q2, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        if continued:
            model.release.set()
            first = await http.post("/ask", json={"question": Q1}, headers=NORTHWIND_STAFF)
            body["conversation_id"] = first.json()["conversation_id"]
            model.release.clear()
            model.called.clear()
        before = await counts(db_url)
        async with http.stream("POST", "/ask", json=body, headers=NORTHWIND_STAFF) as response:
            assert response.status_code == 200
            await read_sse(response, stop=lambda e: e.event == "progress")
            await asyncio.to_thread(model.called.wait, 10)
        # the client is gone: the server closes the run (the model call is cancelled)
        assert await asyncio.to_thread(spy.closed.wait, 10)
        model.release.set()  # had the run survived, it would answer now
        await asyncio.sleep(0.5)
        assert await counts(db_url) == before
        if continued:
            thread = await http.get(
                f"/conversations/{body['conversation_id']}", headers=NORTHWIND_STAFF
            )
            assert thread.json()["turn_count"] == 1


# --- timing --------------------------------------------------------------------------------------

TRIES = 200
WARMUP = 10
ALPHA = 1e-3  # as tests/agent/test_existence_oracle.py
MIN_EFFECT_MS = 0.1
REL_EFFECT = 0.1


async def test_another_callers_thread_and_an_unknown_one_take_the_same_time(
    client: Callable[..., httpx.AsyncClient], llm: ScriptedLLM
) -> None:
    """``GET /conversations/{id}`` as nora, for nina's thread and for an id nobody has: 200
    calls a side, interleaved in a seeded random order, two-sided Mann-Whitney U; a side
    channel is one both significant (p < ALPHA) and large (medians apart by more than
    max(MIN_EFFECT_MS, REL_EFFECT of the pooled median)). Both run the same statement, which
    finds no row of nora's either way."""
    http = client()
    llm.script({"text": "Hello."}, mode="loop")
    made = await http.post("/ask", json={"question": "hello"}, headers=NORTHWIND_STAFF)
    paths = {
        "forbidden": f"/conversations/{made.json()['conversation_id']}",
        "unknown": f"/conversations/{uuid.UUID(int=random.Random(7).getrandbits(128))}",
    }
    rng = random.Random("conversation-oracle")
    times: dict[str, list[float]] = {"forbidden": [], "unknown": []}
    for _ in range(WARMUP):
        for path in paths.values():
            await http.get(path, headers=NORTHWIND_ADMIN)
    gc.collect()
    gc.disable()
    try:
        for _ in range(TRIES):
            order = list(paths)
            rng.shuffle(order)
            for side in order:
                started = time.perf_counter()
                response = await http.get(paths[side], headers=NORTHWIND_ADMIN)
                times[side].append((time.perf_counter() - started) * 1000.0)
                assert response.status_code == 404
    finally:
        gc.enable()
    forbidden, unknown = statistics.median(times["forbidden"]), statistics.median(times["unknown"])
    p_value = float(mannwhitneyu(times["forbidden"], times["unknown"]).pvalue)
    tolerance = max(
        MIN_EFFECT_MS, REL_EFFECT * statistics.median(times["forbidden"] + times["unknown"])
    )
    described = (
        f"median forbidden {forbidden:.3f} ms, unknown {unknown:.3f} ms, "
        f"tolerance {tolerance:.3f} ms, p={p_value:.3g}"
    )
    print(f"\n[conversation-oracle] GET /conversations/{{id}}: {described}")
    assert not (p_value < ALPHA and abs(forbidden - unknown) > tolerance), described
