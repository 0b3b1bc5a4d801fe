"""``progress`` events on the wire: the first event of a streamed ``/ask`` reaches the client
within a second even when the model takes seconds to start, ``waiting`` heartbeats fill the
silence, and each payload carries only its stage's fields (no ``type``, no nulls)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_helpers import NORTHWIND_STAFF, FakeBackend, answer, parse_sse_text, read_sse

from agent.answer import DoneEvent, ProgressEvent, TokenEvent, ToolCallTrace, ToolEvent
from agent.llm.base import ChatRequest, ChatResult
from agent.testing import FunctionModel, text_reply
from foundation.settings import Settings
from serve_app.authz import CedarAuthorizer
from serve_app.wiring import build_local_backend

MODEL_SECONDS = 1.6  # how long the slow model takes before its first byte


@pytest.fixture
def slow_settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        embedding_backend="openai",  # never called here; keeps MiniLM out of this test
        embedding_model="openai/text-embedding-3-small",
        embedding_dim=384,
        stream_heartbeat_seconds=0.5,
    )


def slow_model() -> FunctionModel:
    async def reply(request: ChatRequest) -> ChatResult:
        await asyncio.sleep(MODEL_SECONDS)
        return text_reply("Occupancy is refreshed every minute.")

    return FunctionModel(reply, model="local/slow")


async def test_the_first_event_arrives_within_a_second_of_a_slow_model(
    slow_settings: Settings,
    serve_local: Callable[[Settings, Any], str],
    authorizer: CedarAuthorizer,
) -> None:
    backend = build_local_backend(slow_settings, authorizer=authorizer, llm=slow_model())
    url = serve_local(slow_settings, backend)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        started = time.monotonic()
        async with client.stream(
            "POST",
            "/ask",
            json={"question": "How fresh is occupancy?", "stream": True},
            headers=NORTHWIND_STAFF,
        ) as response:
            assert response.status_code == 200
            events = await read_sse(response)
    first = events[0]
    assert first.event == "progress" and first.data == {"stage": "started", "model": "local/slow"}
    assert first.at - started < 1.0  # a person sees the run begin at once
    assert events[1].event == "progress" and events[1].data == {
        "stage": "model",
        "hop": 1,
        "model": "local/slow",
    }
    waiting = [e for e in events if e.event == "progress" and e.data["stage"] == "waiting"]
    assert len(waiting) >= 2 and all(set(e.data) == {"stage", "hop", "elapsed_s"} for e in waiting)
    tokens = [e for e in events if e.event == "token"]
    assert tokens and tokens[0].at - started >= MODEL_SECONDS * 0.9
    assert waiting[-1].at < tokens[0].at
    assert events[-1].event == "done" and events[-1].data["decision"] == "answered"


async def test_tool_start_and_end_events_by_name_on_the_wire(
    fake_app: Any, asgi_client: Any
) -> None:
    call = ToolCallTrace(
        name="get_building", arguments={"building_id": "b1"}, ok=True, duration_ms=120.0
    )
    fake = FakeBackend(
        stream_events=[
            ProgressEvent(stage="started", model="m"),
            ProgressEvent(stage="route", route="live_data"),
            ProgressEvent(
                stage="tool_started", tool="get_building", arguments={"building_id": "b1"}
            ),
            ToolEvent(call=call),
            TokenEvent(text="ok"),
            DoneEvent(response=answer()),
        ]
    )
    app, _ = fake_app(fake)
    response = await asgi_client(app).post(
        "/ask", json={"question": "hi", "stream": True}, headers=NORTHWIND_STAFF
    )
    events = parse_sse_text(response.text)
    assert [name for name, _ in events] == [
        "progress",
        "progress",
        "progress",
        "tool",
        "token",
        "done",
    ]
    assert events[1][1] == {"stage": "route", "route": "live_data"}
    assert events[2][1] == {
        "stage": "tool_started",
        "tool": "get_building",
        "arguments": {"building_id": "b1"},
    }
    assert events[3][1] == call.model_dump(mode="json")  # the tool event, unchanged


async def test_the_json_answer_has_no_progress(fake_app: Any, asgi_client: Any) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    # the agent's answer and where it was stored (serve_app.threads)
    expected = set(answer().model_dump(mode="json")) | {"conversation_id", "turn"}
    assert set(response.json()) == expected
