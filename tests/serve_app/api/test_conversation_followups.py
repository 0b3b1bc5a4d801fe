"""Follow-ups in a thread, through the app's HTTP layer on the real embedded PostgreSQL (issue
17, item 3): the second turn of a documentation thread and of a live-data thread is searched
and grounded as its standalone form, read back from the thread's history; what was searched
is in the answer's tool trace and notes. The planner's path (json_schema mode, plan first):
both threads are answered by the service (composed), so no model reply is scripted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_helpers import NORTHWIND_STAFF

from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer
from serve_app.local_backend import LocalBackend

pytestmark = pytest.mark.integration


@pytest.fixture
def thread(
    make_settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    authorizer: CedarAuthorizer,
    asgi_client: Callable[..., httpx.AsyncClient],
    db_url: str,
) -> Callable[..., Any]:
    """Asks ``questions`` in one thread; returns the JSON answers."""

    async def run(*questions: str, **overrides: Any) -> list[dict[str, Any]]:
        settings = make_settings(
            database_url=db_url, tool_calling_mode="json_schema", plan_first="on", **overrides
        )
        http = asgi_client(create_app(make_backend(settings), settings, authorizer))
        answers: list[dict[str, Any]] = []
        for question in questions:
            body: dict[str, Any] = {"question": question}
            if answers:
                body["conversation_id"] = answers[0]["conversation_id"]
            response = await http.post("/ask", json=body, headers=NORTHWIND_STAFF)
            assert response.status_code == 200, response.text
            answers.append(response.json())
        return answers

    return run


def searched(answer: dict[str, Any]) -> list[str]:
    return [c["arguments"]["query"] for c in answer["tool_calls"] if c["name"] == "search_docs"]


async def test_a_documentation_follow_up_searches_the_rewritten_query(
    thread: Callable[..., Any], llm: ScriptedLLM
) -> None:
    first, second = await thread("What does CV-E1033 mean?", "How do I fix it?")
    assert second["turn"] == 2
    assert searched(first) == ["CV-E1033"]
    assert searched(second) == ["CV-E1033"]  # not "How do I fix it?"
    assert any("follow-up searched as: 'How do I fix CV-E1033?'" in n for n in second["notes"])
    assert llm.chat_requests() == []  # the service answered both (nothing documented: IDK)


async def test_a_live_data_follow_up_is_grounded_on_the_earlier_building(
    thread: Callable[..., Any], llm: ScriptedLLM
) -> None:
    first, second = await thread(
        "How busy is Harbor Warehouse right now?", "and which of its rooms has a CO2 sensor?"
    )
    assert any(c["name"] == "get_room_occupancy" for c in first["tool_calls"])
    calls = {c["name"]: c["arguments"] for c in second["tool_calls"]}
    assert calls["get_building"] == {"building_id": "bld-northwind-harbor"}
    assert calls["list_sensors"] == {"building_id": "bld-northwind-harbor"}
    # Grounded on the building; any search is of the rewritten question, never "its rooms".
    assert all("Harbor Warehouse" in query for query in searched(second))
    assert "Loading Dock A" in second["answer"]
    assert llm.chat_requests() == []


async def test_the_follow_up_is_rewritten_even_where_the_model_gets_no_earlier_turn(
    thread: Callable[..., Any], llm: ScriptedLLM
) -> None:
    """A history budget too small for any turn: the model is sent none, but the rewriter
    reads the thread's stored turns (``Thread.earlier``), so the search is the same."""
    _, second = await thread("What does CV-E1033 mean?", "How do I fix it?", history_max_tokens=1)
    assert searched(second) == ["CV-E1033"]
