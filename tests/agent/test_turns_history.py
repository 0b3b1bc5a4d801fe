"""``agent.turns.history_messages``: the newest whole turns within the budget, oldest first;
nothing cut in half; no gap; citation markers out; the estimate on the high side for the
text the service sees."""

from __future__ import annotations

import pytest

from agent.llm.base import Message
from agent.turns import (
    MESSAGE_OVERHEAD_TOKENS,
    PriorTurn,
    estimate_tokens,
    history_messages,
    without_markers,
)
from foundation.identity import AuthUser

NINA = AuthUser("nina", ("business_staff",), ("northwind",))


TURNS = [
    PriorTurn("q1", "aaaa"),  # cost with len(): 2 + 4 + 2 * overhead
    PriorTurn("q2", "bbbbbbbbbbbbbbbbbbbb"),  # 2 + 20 + 2 * overhead
    PriorTurn("q3", "cc"),  # 2 + 2 + 2 * overhead
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
    big = [PriorTurn("q", "x" * 500)]
    assert history_messages(big, max_tokens=100, count=len) == ()
    assert history_messages(TURNS, max_tokens=0) == ()


def test_citation_markers_of_earlier_answers_are_taken_out() -> None:
    assert without_markers("Alerts cool down [^c0ffee000001]. See [^abc_1-2].") == (
        "Alerts cool down. See."
    )
    got = history_messages([PriorTurn("q", "Fifteen minutes [^c0ffee000001].")], max_tokens=100)
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


def test_no_budget_sends_every_turn() -> None:
    assert history_messages(TURNS, max_tokens=None, count=len) == history_messages(
        TURNS, max_tokens=1000, count=len
    )
