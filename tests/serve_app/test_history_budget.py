"""``serve_app.history``: the newest whole turns within the budget, oldest first; nothing cut
in half; no gap; citation markers out; the estimate on the high side for the text the
service sees. And ``open_thread`` hands the fitted history to the run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from agent.answer import AgentAnswer
from agent.llm.base import Message
from conversations.memory import InMemoryConversationStore
from conversations.store import Turn, TurnRecord
from foundation.identity import AuthUser
from serve_app.backend import ConversationNotFound
from serve_app.history import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_tokens,
    history_messages,
    without_markers,
)
from serve_app.threads import open_thread, turn_record

NINA = AuthUser("nina", ("business_staff",), ("northwind",))
NOW = datetime(2026, 12, 4, tzinfo=UTC)


def turn(number: int, question: str, answer: str) -> Turn:
    record = TurnRecord(question=question, answer=answer, decision="answered", idk=False, model="m")
    return Turn(number=number, created_at=NOW, record=record)


TURNS = [
    turn(1, "q1", "aaaa"),  # cost with len(): 2 + 4 + 2 * overhead
    turn(2, "q2", "bbbbbbbbbbbbbbbbbbbb"),  # 2 + 20 + 2 * overhead
    turn(3, "q3", "cc"),  # 2 + 2 + 2 * overhead
]
PAIR = 2 * MESSAGE_OVERHEAD_TOKENS  # the two messages of a turn


def contents(messages: tuple[Message, ...]) -> list[tuple[str, str | None]]:
    return [(m.role, m.content) for m in messages]


def test_everything_that_fits_goes_oldest_first() -> None:
    got = history_messages(TURNS, max_tokens=1000, count=len)
    assert contents(got) == [
        ("user", "q1"),
        ("assistant", "aaaa"),
        ("user", "q2"),
        ("assistant", "bbbbbbbbbbbbbbbbbbbb"),
        ("user", "q3"),
        ("assistant", "cc"),
    ]


def test_the_newest_turns_win_and_the_first_misfit_ends_the_history() -> None:
    # room for turn 3 and turn 1, not turn 2: turn 1 is not sent either (no gap)
    budget = (4 + PAIR) + (6 + PAIR) + 5
    assert contents(history_messages(TURNS, max_tokens=budget, count=len)) == [
        ("user", "q3"),
        ("assistant", "cc"),
    ]
    exact = (4 + PAIR) + (22 + PAIR)
    got = history_messages(TURNS, max_tokens=exact, count=len)
    assert [m.content for m in got] == ["q2", "bbbbbbbbbbbbbbbbbbbb", "q3", "cc"]
    assert history_messages(TURNS, max_tokens=exact - 1, count=len) == got[2:]


def test_a_turn_over_the_budget_is_left_out_whole_never_cut() -> None:
    big = [turn(1, "q", "x" * 500)]
    assert history_messages(big, max_tokens=100, count=len) == ()
    assert history_messages(TURNS, max_tokens=0) == ()


def test_turns_are_ordered_by_number_whatever_order_they_come_in() -> None:
    shuffled = [TURNS[2], TURNS[0], TURNS[1]]
    assert history_messages(shuffled, max_tokens=1000, count=len) == history_messages(
        TURNS, max_tokens=1000, count=len
    )


def test_citation_markers_of_earlier_answers_are_taken_out() -> None:
    assert without_markers("Alerts cool down [^c0ffee000001]. See [^abc_1-2].") == (
        "Alerts cool down. See."
    )
    got = history_messages([turn(1, "q", "Fifteen minutes [^c0ffee000001].")], max_tokens=100)
    assert got[1].content == "Fifteen minutes."


@pytest.mark.parametrize(
    ("text", "at_least"),
    [
        ("", 0),
        ("How busy is Harbor Warehouse right now?", 39 / 4),  # English: ~4 characters a token
        ("Room 2.14 reads 412 ppm at 10:30", 11),  # every digit a token (Qwen)
        ("会議室はどこですか", 9),  # CJK: a token a character at least
        ("bld-northwind-harbor", 20 / 4),
    ],
)
def test_the_estimate_is_on_the_high_side(text: str, at_least: float) -> None:
    assert estimate_tokens(text) >= at_least


async def test_open_thread_gives_the_run_the_fitted_history() -> None:
    store = InMemoryConversationStore()
    first = AgentAnswer(answer="Harbor is at 40%.", decision="answered", model="m")
    conversation, _ = await store.start("nina", turn_record("How busy is Harbor?", first))
    thread = await open_thread(
        store, NINA, "and its rooms?", conversation.id, max_turns=5, history_max_tokens=256
    )
    assert contents(thread.history) == [
        ("user", "How busy is Harbor?"),
        ("assistant", "Harbor is at 40%."),
    ]
    none = await open_thread(store, NINA, "q", conversation.id, max_turns=5)
    assert none.history == ()  # a budget of 0 (the default): no history
    new = await open_thread(store, NINA, "q", None, max_turns=5, history_max_tokens=256)
    assert new.history == ()
    with pytest.raises(ConversationNotFound):
        await open_thread(store, NINA, "q", uuid.uuid4(), max_turns=5, history_max_tokens=256)
