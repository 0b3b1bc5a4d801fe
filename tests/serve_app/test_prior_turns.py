"""``serve_app.history.prior_turns``: what the follow-up rewriter reads of a thread's stored
turns (issue 17, item 3): the newest few, oldest first, whatever the model's history budget,
answers without citation markers, and the entity ids of the successful tool calls only."""

from __future__ import annotations

from datetime import UTC, datetime

from agent.turns import MAX_EARLIER, PriorTurn
from conversations.store import Turn, TurnRecord
from foundation.records import ToolCallTrace as ToolCallRecord
from serve_app.history import prior_turns

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


def call(name: str, ok: bool, **arguments: object) -> ToolCallRecord:
    return ToolCallRecord(name=name, arguments=dict(arguments), ok=ok, error=None, duration_ms=1.0)


def test_the_newest_turns_oldest_first_whatever_order_they_come_in() -> None:
    turns = [turn(n, f"q{n}", f"a{n}") for n in range(1, MAX_EARLIER + 3)]
    got = prior_turns(list(reversed(turns)))
    assert [t.question for t in got] == [f"q{n}" for n in range(3, MAX_EARLIER + 3)]


def test_answers_lose_their_markers_and_only_successful_calls_give_ids() -> None:
    stored = turn(
        1,
        "How busy is Harbor Warehouse?",
        "It is at 35% [^c-1].",
        call("get_building", True, building_id="bld-northwind-harbor"),
        call("get_building", False, building_id="bld-acme-tower"),  # not found as the caller
        call("get_room_occupancy", True, room_ids=["room-harbor-dock-a"]),
    )
    assert prior_turns([stored]) == (
        PriorTurn(
            "How busy is Harbor Warehouse?",
            "It is at 35%.",
            ("bld-northwind-harbor", "room-harbor-dock-a"),
        ),
    )


def test_none_when_limited_to_none() -> None:
    assert prior_turns([turn(1, "q", "a")], limit=0) == ()
