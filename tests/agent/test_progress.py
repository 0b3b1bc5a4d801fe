"""Progress events: ``started`` first, each model call and tool start announced, and the
``waiting`` heartbeat while a model call has sent nothing yet (how queueing on a busy local
model becomes visible to the caller)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncGenerator, Callable

import pytest
from agent_helpers import MODES, NORTHWIND_STAFF, Call, Mode, Say, scripted

from agent.answer import (
    AgentEvent,
    DoneEvent,
    ProgressEvent,
    ToolEvent,
)
from agent.llm.base import ChatRequest, ChatResult, ProviderUnavailable
from agent.loop import Agent
from agent.progress import with_heartbeat
from agent.testing import FunctionModel, text_reply

pytestmark = pytest.mark.usefixtures("no_sockets")

MakeAgent = Callable[..., Agent]


async def collect(agent: Agent, question: str) -> list[AgentEvent]:
    return [event async for event in agent.stream(question, NORTHWIND_STAFF)]


def label(event: AgentEvent) -> str:
    """``progress:<stage>`` for progress events, the event type for the others."""
    if isinstance(event, ProgressEvent):
        return f"progress:{event.stage}"
    return event.type


def slow_model(seconds: float, reply: ChatResult | Exception) -> FunctionModel:
    async def answer(request: ChatRequest) -> ChatResult:
        await asyncio.sleep(seconds)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return FunctionModel(answer, model="local/slow")


@pytest.mark.parametrize("mode", MODES)
async def test_started_first_then_each_model_call_and_tool_start(
    mode: Mode, make_local_agent: MakeAgent
) -> None:
    model = scripted(
        mode,
        Call("get_building", {"building_id": "bld-northwind-harbor"}),
        Say("Harbor Warehouse has 4 rooms."),
    )
    events = await collect(make_local_agent(model), "How many rooms has Harbor Warehouse?")
    labels = [label(e) for e in events if label(e) != "token"]
    assert labels == [
        "progress:started",
        "progress:model",
        "progress:tool_started",
        "tool",
        "progress:model",
        "done",
    ]
    started, first_call, tool_start = (e for e in events[:3] if isinstance(e, ProgressEvent))
    assert started.model == "local/scripted" and started.hop is None
    assert first_call.hop == 1 and first_call.model == "local/scripted"
    assert tool_start.tool == "get_building"
    assert tool_start.arguments == {"building_id": "bld-northwind-harbor"}
    second_call = next(e for e in events[4:] if isinstance(e, ProgressEvent))
    assert second_call.stage == "model" and second_call.hop == 2
    tool = next(e for e in events if isinstance(e, ToolEvent))
    assert tool.call.arguments == tool_start.arguments  # a client can pair start and end


async def test_a_slow_model_gets_waiting_heartbeats_until_its_first_token(
    make_local_agent: MakeAgent,
) -> None:
    model = slow_model(0.55, text_reply("Occupancy is refreshed every minute."))
    agent = make_local_agent(model, stream_heartbeat_seconds=0.1)
    events = await collect(agent, "How often is occupancy refreshed?")
    labels = [label(e) for e in events]
    waiting = [e for e in events if isinstance(e, ProgressEvent) and e.stage == "waiting"]
    assert labels[:2] == ["progress:started", "progress:model"]
    assert 3 <= len(waiting) <= 6
    assert labels.index("token") > max(i for i, name in enumerate(labels) if "waiting" in name)
    assert all(e.hop == 1 for e in waiting)
    elapsed = [e.elapsed_s or 0.0 for e in waiting]
    assert elapsed == sorted(elapsed) and 0.05 <= elapsed[0] <= 0.3
    assert isinstance(events[-1], DoneEvent) and events[-1].response.decision == "answered"


async def test_a_fast_model_gets_no_heartbeat(make_local_agent: MakeAgent) -> None:
    model = FunctionModel(lambda request: text_reply("Hello!"))
    events = await collect(make_local_agent(model, stream_heartbeat_seconds=0.2), "Hi")
    assert "progress:waiting" not in [label(e) for e in events]


async def test_a_provider_error_while_waiting_still_ends_in_one_done(
    make_local_agent: MakeAgent,
) -> None:
    model = slow_model(0.25, ProviderUnavailable("connection refused"))
    events = await collect(make_local_agent(model, stream_heartbeat_seconds=0.1), "Anyone?")
    assert "progress:waiting" in [label(e) for e in events]
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].response.decision == "provider_error"


async def test_the_non_streaming_answer_is_unchanged(make_local_agent: MakeAgent) -> None:
    model = slow_model(0.2, text_reply("Still the same answer."))
    answer = await make_local_agent(model, stream_heartbeat_seconds=0.05).answer(
        "Same?", NORTHWIND_STAFF
    )
    assert answer.answer == "Still the same answer." and answer.decision == "answered"


async def test_closing_while_waiting_stops_the_model_call() -> None:
    """A client that hangs up while queued must not leave the model call running."""
    entered = asyncio.Event()
    closed = asyncio.Event()

    async def never_first() -> AsyncGenerator[str, None]:
        try:
            entered.set()
            await asyncio.sleep(30)
            yield "never"
        finally:
            closed.set()

    stream = with_heartbeat(never_first(), hop=1, every=0.05)
    first = await stream.__anext__()
    assert isinstance(first, ProgressEvent) and first.stage == "waiting"
    assert entered.is_set()
    await stream.aclose()
    assert closed.is_set()


async def test_items_pass_through_unchanged_and_in_order() -> None:
    async def items() -> AsyncGenerator[int, None]:
        for number in range(3):
            yield number

    assert [item async for item in with_heartbeat(items(), hop=1, every=1.0)] == [0, 1, 2]

    async def nothing() -> AsyncGenerator[int, None]:
        return
        yield 0  # pragma: no cover - makes this an async generator

    assert [item async for item in with_heartbeat(nothing(), hop=1, every=1.0)] == []


def test_progress_events_cross_a_process_boundary() -> None:
    """Events reach the Serve ingress pickled through a streaming handle."""
    event = ProgressEvent(stage="tool_started", tool="get_building", arguments={"a": [1]})
    assert pickle.loads(pickle.dumps(event)) == event
    route = ProgressEvent(stage="route", route="live_data")
    assert pickle.loads(pickle.dumps(route)) == route
