"""``/conversations`` routes over a ``FakeBackend`` holding the in-memory conversation store
(route behaviour: no model, no database): the caller's own list, newest first, in pages with
an opaque cursor and bounded ``limit``; one conversation with its turns; delete, one or all
of the caller's; another
caller's conversation is the unknown id's 404, byte for byte; a bad id or cursor is a 422
envelope naming the field; no credentials is a 401; an unreachable store a 503."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_helpers import (
    ADMIN,
    CUSTOMER,
    NORTHWIND_STAFF,
    FakeBackend,
    answer,
    is_envelope,
)

from agent.answer import CitationOut, ToolCallTrace
from conversations.memory import InMemoryConversationStore
from conversations.store import ConversationPage, PageCursor
from serve_app.api.routes.conversations import decode_cursor, encode_cursor
from serve_app.backend import ConversationsUnavailable
from serve_app.threads import turn_record

AppFactory = Callable[..., tuple[Any, FakeBackend]]
# A cursor's shape with a time of no zone: not one the service issues.
NAIVE_CURSOR = (
    base64.urlsafe_b64encode(f"2026-12-04T10:30:00|{uuid.uuid4()}".encode()).decode().rstrip("=")
)
ClientFactory = Callable[..., httpx.AsyncClient]


async def seed(fake: FakeBackend, sub: str, *questions: str) -> list[uuid.UUID]:
    ids = []
    for question in questions:
        conversation, _ = await fake.conversations.start(sub, turn_record(question, answer()))
        ids.append(conversation.id)
    return ids


async def test_the_list_is_the_callers_own_newest_first(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    mine = await seed(fake, "nina", "first question", "second question")
    await seed(fake, "root", "the admin's")
    response = await asgi_client(app).get("/conversations", headers=NORTHWIND_STAFF)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [c["id"] for c in body["conversations"]] == [str(i) for i in reversed(mine)]
    assert body["next_cursor"] is None
    first = body["conversations"][0]
    assert set(first) == {"id", "title", "turn_count", "created_at", "updated_at"}
    assert (first["title"], first["turn_count"]) == ("second question", 1)


async def test_pages_walk_every_conversation_once(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    made = await seed(fake, "nina", *(f"question {i}" for i in range(7)))
    client = asgi_client(app)
    seen: list[str] = []
    cursor: str | None = None
    sizes = []
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = (await client.get("/conversations", params=params, headers=NORTHWIND_STAFF)).json()
        seen += [c["id"] for c in body["conversations"]]
        sizes.append(len(body["conversations"]))
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert sizes == [3, 3, 1]
    assert seen == [str(i) for i in reversed(made)]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "query.limit"),
        ({"limit": 101}, "query.limit"),
        ({"limit": "many"}, "query.limit"),
        ({"cursor": "not-a-cursor"}, "query.cursor"),
        ({"cursor": NAIVE_CURSOR}, "query.cursor"),
        ({"cursor": "x" * 201}, "query.cursor"),
    ],
    ids=["limit 0", "limit 101", "limit text", "garbage cursor", "naive time", "long"],
)
async def test_bad_page_parameters_are_422_envelopes_naming_the_field(
    params: dict[str, Any], field: str, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).get("/conversations", params=params, headers=ADMIN)
    assert response.status_code == 422, response.text
    body = response.json()
    assert is_envelope(body, "validation_error")
    assert [f["field"] for f in body["error"]["fields"]] == [field]


def test_a_cursor_round_trips_and_nothing_else_decodes() -> None:
    from datetime import UTC, datetime

    cursor = PageCursor(updated_at=datetime(2026, 12, 4, 10, 30, 0, 123456, UTC), id=uuid.uuid4())
    assert decode_cursor(encode_cursor(cursor)) == cursor
    for text in ("", "=", "////", "bm90IGEgY3Vyc29y"):
        with pytest.raises(ValueError):
            decode_cursor(text)


async def test_one_conversation_with_its_turns(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    cited = answer(
        "Alerts cool down for 15 minutes [^c0ffee000001].",
        citations=[CitationOut(chunk_id="c0ffee000001", source="a.md", section="A", snippet="s")],
        tool_calls=[
            ToolCallTrace(name="search_docs", arguments={"query": "q"}, ok=True, duration_ms=2)
        ],
    )
    conversation, _ = await fake.conversations.start("nina", turn_record("What is it?", cited))
    await fake.conversations.append(
        "nina", conversation.id, turn_record("and then?", answer("Then.")), max_turns=5
    )
    response = await asgi_client(app).get(
        f"/conversations/{conversation.id}", headers=NORTHWIND_STAFF
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["id"], body["turn_count"], body["title"]) == (
        str(conversation.id),
        2,
        "What is it?",
    )
    first, second = body["turns"]
    assert (first["turn"], first["question"], second["turn"], second["question"]) == (
        1,
        "What is it?",
        2,
        "and then?",
    )
    assert first["citations"] == [
        {"chunk_id": "c0ffee000001", "source": "a.md", "section": "A", "snippet": "s"}
    ]
    assert first["tool_calls"][0]["name"] == "search_docs"
    assert first["decision"] == "answered" and first["model"] == "m"
    assert set(first) >= {"usage", "cost", "trace_id", "created_at", "idk", "answer"}


async def test_another_callers_conversation_is_the_unknown_ids_404_byte_for_byte(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    """The admin asks for nina's conversation while it exists, then after nina deleted it
    (the same id, now unknown): the two answers are the same bytes (status, headers but the
    request id, body)."""
    app, fake = fake_app()
    client = asgi_client(app)
    for method in ("GET", "DELETE"):
        [ninas] = await seed(fake, "nina", "mine")
        theirs = await client.request(method, f"/conversations/{ninas}", headers=ADMIN)
        assert await fake.conversations.get("nina", ninas) is not None  # untouched
        assert await fake.conversations.delete("nina", ninas)
        unknown = await client.request(method, f"/conversations/{ninas}", headers=ADMIN)
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.content == unknown.content
        assert theirs.json() == {
            "error": {"code": "not_found", "message": f"no conversation {ninas}"}
        }
        assert {k: v for k, v in unknown.headers.items() if k != "x-request-id"} == {
            k: v for k, v in theirs.headers.items() if k != "x-request-id"
        }


async def test_delete_removes_it_and_a_second_delete_is_404(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    [ident] = await seed(fake, "nina", "to delete")
    client = asgi_client(app)
    response = await client.delete(f"/conversations/{ident}", headers=NORTHWIND_STAFF)
    assert response.status_code == 204 and response.content == b""
    assert (await client.get(f"/conversations/{ident}", headers=NORTHWIND_STAFF)).status_code == 404
    again = await client.delete(f"/conversations/{ident}", headers=NORTHWIND_STAFF)
    assert again.status_code == 404 and is_envelope(again.json(), "not_found")


async def test_delete_all_removes_only_the_callers_own_and_counts_them(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    await seed(fake, "nina", "one", "two")
    [roots] = await seed(fake, "root", "the admin's")
    client = asgi_client(app)
    response = await client.delete("/conversations", headers=NORTHWIND_STAFF)
    assert response.status_code == 200 and response.json() == {"deleted": 2}
    listing = (await client.get("/conversations", headers=NORTHWIND_STAFF)).json()
    assert listing["conversations"] == []
    assert (await client.get(f"/conversations/{roots}", headers=ADMIN)).status_code == 200
    again = await client.delete("/conversations", headers=NORTHWIND_STAFF)
    assert again.json() == {"deleted": 0}


@pytest.mark.parametrize("bad", ["123", "not-a-uuid", "e3e70682-c209-1cac-a29f-6fbed82c07c"])
@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_an_id_that_is_no_uuid_is_a_422_naming_the_path_parameter(
    bad: str, method: str, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).request(method, f"/conversations/{bad}", headers=CUSTOMER)
    assert response.status_code == 422
    body = response.json()
    assert is_envelope(body, "validation_error")
    assert [f["field"] for f in body["error"]["fields"]] == ["path.conversation_id"]
    assert bad not in response.text  # the input is never echoed


async def test_conversations_need_credentials(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    client = asgi_client(app)
    ident = uuid.uuid4()
    for method, path in (
        ("GET", "/conversations"),
        ("DELETE", "/conversations"),
        ("GET", f"/conversations/{ident}"),
        ("DELETE", f"/conversations/{ident}"),
    ):
        response = await client.request(method, path)
        assert response.status_code == 401 and is_envelope(response.json(), "unauthenticated")


async def test_a_405_lists_every_method_of_the_path(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).put(f"/conversations/{uuid.uuid4()}", headers=ADMIN)
    assert response.status_code == 405 and response.headers["allow"] == "DELETE, GET"
    listing = await asgi_client(app).post("/conversations", headers=ADMIN)
    assert listing.status_code == 405 and listing.headers["allow"] == "DELETE, GET"


class DownStore(InMemoryConversationStore):
    async def recent(
        self, owner: str, *, limit: int, after: PageCursor | None = None
    ) -> ConversationPage:
        raise ConversationsUnavailable(
            "the conversation store is unavailable; try again shortly", retry_after=5
        )


async def test_an_unreachable_store_is_a_503_envelope(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app(FakeBackend(conversations=DownStore()))
    response = await asgi_client(app).get("/conversations", headers=ADMIN)
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    assert is_envelope(response.json(), "conversations_unavailable")
