"""History that fits the model, through the app's HTTP layer on the real embedded PostgreSQL
with the scripted model server: a follow-up's model call carries the thread's earlier turns
between the system prompt and the question, the newest whole turns within
``HISTORY_MAX_TOKENS``, none at 0, and the current question whole however long it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_helpers import NORTHWIND_STAFF

from agent.turns import MESSAGE_OVERHEAD_TOKENS, estimate_tokens
from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer
from serve_app.local_backend import LocalBackend

pytestmark = pytest.mark.integration

TURNS = [
    ("How busy is Harbor Warehouse?", "Harbor Warehouse is quiet right now."),
    ("Which of its rooms is the busiest?", "The Loading Bay is the busiest room."),
    ("Does it have a CO2 sensor?", "Yes, the Loading Bay has a CO2 sensor."),
]


def turn_cost(question: str, answer: str) -> int:
    return estimate_tokens(question) + estimate_tokens(answer) + 2 * MESSAGE_OVERHEAD_TOKENS


@pytest.fixture
def ask_in_thread(
    make_settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    authorizer: CedarAuthorizer,
    asgi_client: Callable[..., httpx.AsyncClient],
    llm: ScriptedLLM,
    db_url: str,
) -> Callable[..., Any]:
    """Asks TURNS[:n] in one thread (each answered with its scripted answer), then a last
    question; returns the last question's first model call (its wire messages)."""

    async def run(last: str, n: int = len(TURNS), **overrides: Any) -> list[dict[str, Any]]:
        settings = make_settings(database_url=db_url, **overrides)
        http = asgi_client(create_app(make_backend(settings), settings, authorizer))
        ident = None
        for question, answer in TURNS[:n]:
            llm.clear_scripts()
            llm.script({"text": answer}, mode="loop")
            body: dict[str, Any] = {"question": question}
            if ident:
                body["conversation_id"] = ident
            response = await http.post("/ask", json=body, headers=NORTHWIND_STAFF)
            assert response.status_code == 200, response.text
            ident = response.json()["conversation_id"]
        llm.clear_scripts()
        llm.script({"text": "Noted."}, mode="loop")
        before = len(llm.chat_requests())
        final = await http.post(
            "/ask", json={"question": last, "conversation_id": ident}, headers=NORTHWIND_STAFF
        )
        assert final.status_code == 200 and final.json()["turn"] == n + 1, final.text
        messages: list[dict[str, Any]] = llm.chat_requests()[before].body["messages"]
        return messages

    return run


def dialogue(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The messages after the system prompt, as (role, content)."""
    assert messages[0]["role"] == "system"
    return [(m["role"], m["content"]) for m in messages[1:]]


async def test_a_follow_up_carries_the_earlier_turns_oldest_first(
    ask_in_thread: Callable[..., Any],
) -> None:
    messages = await ask_in_thread("and how many people are in it?", history_max_tokens=4000)
    assert dialogue(messages) == [
        *((role, text) for q, a in TURNS for role, text in (("user", q), ("assistant", a))),
        ("user", "and how many people are in it?"),
    ]


async def test_over_the_budget_only_the_newest_whole_turns_go(
    ask_in_thread: Callable[..., Any],
) -> None:
    newest_two = turn_cost(*TURNS[2]) + turn_cost(*TURNS[1])
    messages = await ask_in_thread("and now?", history_max_tokens=newest_two)
    assert dialogue(messages) == [
        ("user", TURNS[1][0]),
        ("assistant", TURNS[1][1]),
        ("user", TURNS[2][0]),
        ("assistant", TURNS[2][1]),
        ("user", "and now?"),
    ]
    messages = await ask_in_thread("and now?", history_max_tokens=newest_two - 1)
    assert dialogue(messages)[:-1] == [("user", TURNS[2][0]), ("assistant", TURNS[2][1])]


async def test_no_history_at_a_budget_of_zero(ask_in_thread: Callable[..., Any]) -> None:
    messages = await ask_in_thread("and now?", history_max_tokens=0)
    assert dialogue(messages) == [("user", "and now?")]


async def test_the_current_question_goes_whole_whatever_the_budget(
    ask_in_thread: Callable[..., Any],
) -> None:
    long_question = "Tell me about its rooms: " + "the occupancy of every room, " * 120
    assert estimate_tokens(long_question) > 1000
    messages = await ask_in_thread(long_question.strip(), n=1, history_max_tokens=200)
    assert dialogue(messages) == [
        ("user", TURNS[0][0]),
        ("assistant", TURNS[0][1]),
        ("user", long_question.strip()),
    ]
