"""``serve_app.threads``: ``/ask`` inside a conversation, with the in-memory store (unit).

The thread is checked before the run (unknown and another caller's id: the same 404; a full
conversation: 409); the finished run is stored as one turn before its answer goes out (the
answer then carries ``conversation_id`` and ``turn``); a stream closed before ``done``
stores nothing; a write under way finishes even when the caller is cancelled; a
conversation deleted during the run is a 409 and nothing is stored; an unreachable database
leaves the answer unstored and says so."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.answer import (
    AgentAnswer,
    AgentError,
    AgentEvent,
    CitationOut,
    DoneEvent,
    TokenEvent,
    ToolCallTrace,
)
from conversations.memory import InMemoryConversationStore
from conversations.store import Conversation, Turn, TurnRecord
from foundation.identity import AuthUser
from foundation.settings import Settings
from serve_app.backend import (
    ConversationDeleted,
    ConversationFullError,
    ConversationNotFound,
    ConversationsUnavailable,
)
from serve_app.threads import (
    NOT_STORED_NOTE,
    AskResponse,
    LazyConversationStore,
    open_thread,
    turn_record,
)
from serve_app.wiring import conversations_config

NINA = AuthUser("nina", ("business_staff",), ("northwind",))
EVE = AuthUser("eve", ("business_staff",), ("northwind",))


def answer(text: str = "Harbor Warehouse is at 40%.", **fields: object) -> AgentAnswer:
    values: dict[str, object] = {
        "answer": text,
        "decision": "answered",
        "answered_by": "model",
        "model": "local/scripted",
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "citations": [
            CitationOut(chunk_id="c0ffee000001", source="user/a.md", section="A", snippet="s")
        ],
        "tool_calls": [
            ToolCallTrace(
                name="get_building", arguments={"building_id": "b"}, ok=True, duration_ms=3
            )
        ],
    }
    values.update(fields)
    return AgentAnswer.model_validate(values)


async def test_a_new_thread_is_stored_with_the_answer_and_says_where() -> None:
    store = InMemoryConversationStore()
    thread = await open_thread(store, NINA, "How busy is Harbor?", None, max_turns=3)
    response = await thread.record(answer())
    assert isinstance(response, AskResponse) and response.turn == 1
    assert response.conversation_id is not None
    assert response.answer == "Harbor Warehouse is at 40%." and response.notes == []
    found = await store.read("nina", response.conversation_id)
    assert found is not None
    assert found[1][0].record == turn_record("How busy is Harbor?", answer())
    # and a follow-up continues it
    follow = await open_thread(store, NINA, "and its rooms?", response.conversation_id, max_turns=3)
    assert (await follow.record(answer("4 rooms."))).turn == 2


async def test_the_turn_keeps_who_wrote_the_answer() -> None:
    store = InMemoryConversationStore()
    thread = await open_thread(store, NINA, "Which buildings?", None, max_turns=3)
    response = await thread.record(answer("You can see Harbor.", answered_by="service"))
    assert response.answered_by == "service" and response.conversation_id is not None
    found = await store.read("nina", response.conversation_id)
    assert found is not None and found[1][0].record.answered_by == "service"


async def test_an_unknown_and_another_callers_thread_are_the_same_404() -> None:
    store = InMemoryConversationStore()
    conversation, _ = await store.start("nina", turn_record("q", answer()))
    errors = []
    for user, ident in ((EVE, conversation.id), (NINA, uuid.uuid4())):
        with pytest.raises(ConversationNotFound) as info:
            await open_thread(store, user, "q", ident, max_turns=3)
        errors.append(info.value)
    assert [e.status for e in errors] == [404, 404]
    assert errors[0].message == f"no conversation {conversation.id}"
    assert errors[1].message.startswith("no conversation ")


async def test_a_full_thread_is_refused_before_the_run() -> None:
    store = InMemoryConversationStore()
    conversation, _ = await store.start("nina", turn_record("q", answer()))
    with pytest.raises(ConversationFullError) as info:
        await open_thread(store, NINA, "q2", conversation.id, max_turns=1)
    assert info.value.status == 409 and info.value.code == "conversation_full"
    assert "CONVERSATION_MAX_TURNS" in info.value.message


async def test_a_provider_error_is_not_stored() -> None:
    store = InMemoryConversationStore()
    thread = await open_thread(store, NINA, "q", None, max_turns=3)
    failed = answer(
        "",
        decision="provider_error",
        error=AgentError(code="provider_unavailable", message="down"),
    )
    response = await thread.record(failed)
    assert (response.conversation_id, response.turn) == (None, None)
    assert (await store.recent("nina", limit=5)).conversations == []


async def test_a_thread_deleted_during_the_run_is_a_409_and_nothing_is_stored() -> None:
    store = InMemoryConversationStore()
    conversation, _ = await store.start("nina", turn_record("q", answer()))
    thread = await open_thread(store, NINA, "q2", conversation.id, max_turns=3)
    assert await store.delete("nina", conversation.id)
    with pytest.raises(ConversationDeleted) as info:
        await thread.record(answer())
    assert info.value.status == 409 and info.value.code == "conversation_deleted"
    assert await store.read("nina", conversation.id) is None


async def test_a_thread_filled_during_the_run_is_a_409() -> None:
    store = InMemoryConversationStore()
    conversation, _ = await store.start("nina", turn_record("q", answer()))
    first = await open_thread(store, NINA, "a", conversation.id, max_turns=2)
    second = await open_thread(store, NINA, "b", conversation.id, max_turns=2)
    assert (await first.record(answer())).turn == 2
    with pytest.raises(ConversationFullError):
        await second.record(answer())


class DownStore(InMemoryConversationStore):
    async def start(self, owner: str, record: TurnRecord) -> tuple[Conversation, Turn]:
        raise ConversationsUnavailable("the conversation store is unavailable")


async def test_an_unreachable_store_leaves_the_answer_unstored_and_says_so() -> None:
    thread = await open_thread(DownStore(), NINA, "q", None, max_turns=3)
    response = await thread.record(answer(notes=["declined after 0 tool calls"]))
    assert (response.conversation_id, response.turn) == (None, None)
    assert response.notes == ["declined after 0 tool calls", NOT_STORED_NOTE]


class SlowStore(InMemoryConversationStore):
    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()

    async def start(self, owner: str, record: TurnRecord) -> tuple[Conversation, Turn]:
        self.writing.set()
        await asyncio.sleep(0.2)
        return await super().start(owner, record)


async def test_a_write_under_way_finishes_when_the_caller_is_cancelled() -> None:
    """A client that disconnects while the finished run is being written: its request task
    is cancelled, the write is not (it is stored whole)."""
    store = SlowStore()
    thread = await open_thread(store, NINA, "q", None, max_turns=3)
    caller = asyncio.ensure_future(thread.record(answer()))
    await store.writing.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    async with asyncio.timeout(5):
        while True:
            if (await store.recent("nina", limit=5)).conversations:
                break
            await asyncio.sleep(0.05)
    [conversation] = (await store.recent("nina", limit=5)).conversations
    assert conversation.turn_count == 1


async def _events(
    items: list[AgentEvent], closed: list[bool], gate: asyncio.Event | None = None
) -> AsyncIterator[AgentEvent]:
    try:
        for item in items:
            if isinstance(item, DoneEvent) and gate is not None:
                await gate.wait()
            yield item
    finally:
        closed.append(True)


async def test_the_stream_stores_the_turn_before_done_and_done_says_where() -> None:
    store = InMemoryConversationStore()
    thread = await open_thread(store, NINA, "q", None, max_turns=3)
    closed: list[bool] = []
    events = [TokenEvent(text="Harbor "), DoneEvent(response=answer())]
    out = [e async for e in thread.recording(_events(events, closed))]
    assert out[0] == TokenEvent(text="Harbor ")
    assert isinstance(out[1], DoneEvent) and isinstance(out[1].response, AskResponse)
    done = out[1].response
    assert done.turn == 1 and done.conversation_id is not None
    assert await store.get("nina", done.conversation_id) is not None
    assert done.model_dump(mode="json")["conversation_id"] == str(done.conversation_id)
    assert closed == [True]


async def test_a_stream_closed_before_done_stores_nothing() -> None:
    store = InMemoryConversationStore()
    thread = await open_thread(store, NINA, "q", None, max_turns=3)
    closed: list[bool] = []
    gate = asyncio.Event()  # never set: the run is still going when the client leaves
    stream = thread.recording(
        _events([TokenEvent(text="Har"), DoneEvent(response=answer())], closed, gate)
    )
    assert await anext(stream) == TokenEvent(text="Har")
    await stream.aclose()  # what a disconnect does
    assert closed == [True]
    assert (await store.recent("nina", limit=5)).conversations == []


async def test_the_lazy_store_turns_an_unreachable_database_into_a_503(tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path,
        database_url="postgresql://nobody@127.0.0.1:1/none",
    )
    store = LazyConversationStore(settings, conversations_config(settings))
    with pytest.raises(ConversationsUnavailable) as info:
        await store.recent("nina", limit=5)
    assert info.value.status == 503 and info.value.code == "conversations_unavailable"
    assert "127.0.0.1" not in info.value.message  # nothing of the database is shown
    await store.close()
