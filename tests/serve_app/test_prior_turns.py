"""``serve_app.history.prior_turns``: what the agent is handed of a thread's stored turns
(issue 17, item 3; issue 41, item 3): every turn, oldest first, answers without citation
markers, and the entity ids of the successful tool calls only. And ``open_thread`` hands
them to the run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from agent.answer import AgentAnswer
from agent.turns import MAX_EARLIER, PriorTurn, history_messages
from conversations.memory import InMemoryConversationStore
from conversations.store import Turn, TurnRecord
from foundation.identity import AuthUser
from foundation.records import EntityRefOut
from foundation.records import ToolCallTrace as ToolCallRecord
from serve_app.backend import ConversationNotFound
from serve_app.history import prior_turns
from serve_app.threads import open_thread, turn_record

NINA = AuthUser("nina", ("business_staff",), ("northwind",))

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def turn(number: int, question: str, answer: str, *calls: ToolCallRecord) -> Turn:
    record = TurnRecord(
        question=question,
        answer=answer,
        decision="answered",
        idk=False,
        model="m",
        tool_calls=calls,
    )
    return Turn(number=number, created_at=NOW, record=record)


def call(name: str, ok: bool, kind: str, **arguments: object) -> ToolCallRecord:
    """A stored call whose arguments name entities of ``kind`` (as the registry records)."""
    ids = [i for v in arguments.values() for i in (v if isinstance(v, list) else [v])]
    refs = tuple(EntityRefOut(kind=kind, id=str(i)) for i in ids)
    return ToolCallRecord(
        name=name, arguments=dict(arguments), ok=ok, error=None, duration_ms=1.0, entities=refs
    )


def test_every_turn_oldest_first_whatever_order_they_come_in() -> None:
    """All of them: the agent takes the newest ``MAX_EARLIER`` for its strategy and fits the
    model's history to its budget itself (tests/agent/test_turns_history.py)."""
    turns = [turn(n, f"q{n}", f"a{n}") for n in range(1, MAX_EARLIER + 3)]
    got = prior_turns(list(reversed(turns)))
    assert [t.question for t in got] == [f"q{n}" for n in range(1, MAX_EARLIER + 3)]


def test_answers_lose_their_markers_and_only_successful_calls_give_ids() -> None:
    stored = turn(
        1,
        "How busy is Harbor Warehouse?",
        "It is at 35% [^c-1].",
        call("get_building", True, "building", building_id="bld-northwind-harbor"),
        call("get_building", False, "building", building_id="bld-acme-tower"),  # not found
        call("get_room_occupancy", True, "room", room_ids=["room-harbor-dock-a"]),
    )
    assert prior_turns([stored]) == (
        PriorTurn(
            "How busy is Harbor Warehouse?",
            "It is at 35%.",
            (("building", "bld-northwind-harbor"), ("room", "room-harbor-dock-a")),
        ),
    )


async def test_open_thread_gives_the_run_the_threads_turns() -> None:
    store = InMemoryConversationStore()
    first = AgentAnswer(
        answer="Harbor is at 40%.", decision="answered", answered_by="model", model="m"
    )
    conversation, _ = await store.start("nina", turn_record("How busy is Harbor?", first))
    thread = await open_thread(
        store, NINA, "and its rooms?", conversation.id, max_turns=5, history_max_tokens=256
    )
    assert [(m.role, m.content) for m in history_messages(thread.earlier, max_tokens=256)] == [
        ("user", "How busy is Harbor?"),
        ("assistant", "Harbor is at 40%."),
    ]
    none = await open_thread(store, NINA, "q", conversation.id, max_turns=5)
    assert none.earlier == ()  # a budget of 0 (the default): no history
    new = await open_thread(store, NINA, "q", None, max_turns=5, history_max_tokens=256)
    assert new.earlier == ()
    with pytest.raises(ConversationNotFound):
        await open_thread(store, NINA, "q", uuid.uuid4(), max_turns=5, history_max_tokens=256)
