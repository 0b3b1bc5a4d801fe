"""The tool-calling loop end to end: the real OpenAI-compatible adapter talking to the scripted
model server, real tools against the twin and sensor simulators, all over HTTP on 127.0.0.1.
Every test runs in both tool-calling modes (native tool_calls, json_schema steps)."""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from agent_helpers import (
    MODES,
    NORTHWIND_STAFF,
    Call,
    Calls,
    Decline,
    FakeRetriever,
    Idk,
    Mode,
    Say,
    Service,
    hit,
    script_steps,
)

from agent.answer import (
    AgentAnswer,
    AgentEvent,
    CitationEvent,
    DoneEvent,
    TokenEvent,
    ToolEvent,
)
from agent.llm.base import ToolCall, ToolSpec
from agent.loop import Agent
from agent.prompts import DECLINE_TEXT, IDK_MARKER, REFUSAL_MARKER
from agent.tools import ToolExecutor, ToolOutcome, ToolRequest
from agent.tools.twin import BUILDING_NOT_FOUND
from local_world.claims import HEADER
from local_world.scripted_llm import ScriptedLLM
from local_world.world import World, epoch_minute

pytestmark = pytest.mark.parametrize("mode", MODES)

MakeAgent = Callable[..., Agent]
HARBOR_ROOMS = [
    "room-harbor-dock-a",
    "room-harbor-dock-b",
    "room-harbor-cold-store",
    "room-harbor-dispatch",
]


def load(llm: ScriptedLLM, mode: Mode, question: str, *steps: Any, **options: Any) -> None:
    llm.script(*script_steps(mode, *steps, **options), key=question)


def sent_messages(llm: ScriptedLLM, question: str) -> list[list[dict[str, Any]]]:
    """The messages of every chat request of this conversation, in order."""
    return [r.body["messages"] for r in llm.chat_requests(question)]


async def collect(agent: Agent, question: str, **kwargs: Any) -> list[AgentEvent]:
    return [event async for event in agent.stream(question, NORTHWIND_STAFF, **kwargs)]


def done(events: list[AgentEvent]) -> AgentAnswer:
    assert isinstance(events[-1], DoneEvent)
    assert sum(isinstance(e, DoneEvent) for e in events) == 1
    return events[-1].response


async def test_two_step_chain_resolves_a_building_then_its_rooms(
    mode: Mode,
    make_agent: MakeAgent,
    llm: ScriptedLLM,
    world: World,
    twin: Service,
    clock: Any,
) -> None:
    question = "How busy is Harbor Warehouse right now?"
    load(
        llm,
        mode,
        question,
        Call("list_buildings", {"name": "Harbor Warehouse"}),
        Call("get_building", {"building_id": "bld-northwind-harbor"}),
        Call("get_room_occupancy", {"room_ids": HARBOR_ROOMS}),
        Say("Loading Dock A is the busiest room in Harbor Warehouse."),
    )
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)

    assert answer.decision == "answered" and not answer.idk
    assert answer.answer == "Loading Dock A is the busiest room in Harbor Warehouse."
    assert [c.name for c in answer.tool_calls] == [
        "list_buildings",
        "get_building",
        "get_room_occupancy",
    ]
    assert all(c.ok for c in answer.tool_calls)
    assert answer.tool_calls[1].arguments == {"building_id": "bld-northwind-harbor"}
    assert len(answer.usage.hops) == 4
    assert answer.usage.input_tokens == sum(h.input_tokens for h in answer.usage.hops) > 0
    assert answer.cost.estimated_usd == 0.0  # local/scripted is free in the price table
    assert answer.model == "local/scripted"
    # the last request carried the live occupancy the simulator computed
    final_request = json.dumps(sent_messages(llm, question)[-1])
    room = world.room("room-harbor-dock-a")
    assert room is not None
    expected = world.occupancy_at(room, epoch_minute(clock()))
    assert (
        f'\\"room_id\\":\\"room-harbor-dock-a\\",\\"building_id\\":\\"bld-northwind-harbor\\",\\"occupancy\\":{expected},'
        in final_request
    )
    # every twin call carried the caller's own claims, verbatim
    assert {r.headers[HEADER] for r in twin.control.requests()} == {NORTHWIND_STAFF.claims_header}


async def test_tool_error_goes_back_to_the_model_which_recovers(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "How many rooms does the Harbor building have?"
    load(
        llm,
        mode,
        question,
        Call("get_building", {"building_id": "bld-harbor"}),
        Call("list_buildings", {"name": "Harbor"}),
        Say("Harbor Warehouse has 4 rooms."),
    )
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "answered"
    first, second = answer.tool_calls
    assert (first.ok, first.error) == (False, BUILDING_NOT_FOUND)
    assert second.ok and second.error is None
    assert BUILDING_NOT_FOUND in json.dumps(sent_messages(llm, question)[1])


async def test_invalid_arguments_are_a_tool_error_not_a_crash(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "Tell me about room number seven"
    load(
        llm,
        mode,
        question,
        Call("get_room", {"room": "seven"}),
        Idk(),
    )
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "idk" and answer.idk and answer.answer == IDK_MARKER
    (trace,) = answer.tool_calls
    assert not trace.ok and "room_id: Field required" in (trace.error or "")


async def test_hop_exhaustion_returns_idk(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM, twin: Service
) -> None:
    question = "Keep looking at the buildings forever"
    steps = script_steps(mode, Call("list_buildings", {}))
    llm.load({"key": question, "mode": "loop", "steps": steps})
    answer = await make_agent(mode, max_tool_hops=3).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "tool_loop_exhausted"
    assert answer.idk and answer.answer == IDK_MARKER
    assert len(llm.chat_requests(question)) == 3
    assert len(answer.tool_calls) == 2  # the third hop's request is not run
    assert len(twin.paths()) == 2
    assert any("still asked for: list_buildings" in note for note in answer.notes)


async def test_off_topic_is_declined_without_tools(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM, twin: Service
) -> None:
    question = "What is the capital of France?"
    load(llm, mode, question, Decline())
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "declined_out_of_scope"
    assert answer.answer.startswith(REFUSAL_MARKER)
    if mode == "json_schema":
        assert answer.answer == DECLINE_TEXT
    assert answer.tool_calls == [] and not answer.idk
    assert twin.paths() == []
    assert len(llm.chat_requests(question)) == 1


async def test_decline_after_tool_calls_is_noted(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "List my buildings and then write me a poem"
    load(llm, mode, question, Call("list_buildings", {}), Decline())
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "declined_out_of_scope"
    assert "declined after 1 tool call(s)" in answer.notes


async def test_greeting_is_answered_directly(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "Hello there!"
    load(llm, mode, question, Say("Hello! How can I help with your buildings today?"))
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "answered"
    assert answer.answer == "Hello! How can I help with your buildings today?"
    assert answer.tool_calls == [] and answer.citations == []


async def test_invented_citation_is_stripped_and_reported(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM, retriever: FakeRetriever
) -> None:
    retriever.hits = [hit("aaaaaaaaaaaa", "Alerts repeat at most once per 15-minute cooldown.")]
    question = "How often do occupancy alerts repeat?"
    load(
        llm,
        mode,
        question,
        Call("search_docs", {"query": "alert cooldown"}),
        Say("At most once per 15 minutes [^aaaaaaaaaaaa], and never at night [^ffffffffffff]."),
    )
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF, top_k=3)
    assert answer.answer == "At most once per 15 minutes [^aaaaaaaaaaaa], and never at night."
    (citation,) = answer.citations
    assert citation.chunk_id == "aaaaaaaaaaaa"
    assert citation.source == "user/occupancy-alerts.md"
    assert citation.section == "Occupancy alerts > Cooldown"
    assert citation.snippet.startswith("Alerts repeat")
    assert answer.retrieval.hallucinated_citations == ["ffffffffffff"]
    assert answer.retrieval.chunks_seen == 1
    assert retriever.calls[0]["top_k"] == 3
    assert retriever.calls[0]["acl"] == NORTHWIND_STAFF.acl_entries


async def test_streamed_citations_never_emit_an_invented_marker(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM, retriever: FakeRetriever
) -> None:
    retriever.hits = [hit("aaaaaaaaaaaa", "Alerts repeat at most once per cooldown.")]
    question = "Do alerts repeat, streamed?"
    load(
        llm,
        mode,
        question,
        Call("search_docs", {"query": "alerts repeat"}),
        Say(
            "Once per cooldown [^aaaaaaaaaaaa] unless muted [^ffffffffffff]. Done [^aaaaaaaaaaaa]."
        ),
        chunk_chars=3,
    )
    events = await collect(make_agent(mode), question)
    response = done(events)
    tokens = [e.text for e in events if isinstance(e, TokenEvent)]
    assert len(tokens) > 5  # really streamed in pieces
    assert not any("ffff" in t for t in tokens)
    assert "".join(tokens) == response.answer
    assert (
        response.answer == "Once per cooldown [^aaaaaaaaaaaa] unless muted. Done [^aaaaaaaaaaaa]."
    )
    citations = [e.citation for e in events if isinstance(e, CitationEvent)]
    assert [c.chunk_id for c in citations] == ["aaaaaaaaaaaa"]
    assert citations[0].source == "user/occupancy-alerts.md"
    assert response.retrieval.hallucinated_citations == ["ffffffffffff"]
    tools = [e.call for e in events if isinstance(e, ToolEvent)]
    assert [t.name for t in tools] == ["search_docs"]
    # order: the tool event comes before any token of the answer
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent))
    first_tool = next(i for i, e in enumerate(events) if isinstance(e, ToolEvent))
    assert first_tool < first_token


async def test_streamed_decline_and_idk_have_service_text(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    load(llm, mode, "Translate hello into German", Decline())
    events = await collect(make_agent(mode), "Translate hello into German")
    response = done(events)
    assert response.decision == "declined_out_of_scope"
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == response.answer

    load(llm, mode, "What is the wifi password in the lobby?", Idk())
    events = await collect(make_agent(mode), "What is the wifi password in the lobby?")
    response = done(events)
    assert response.decision == "idk" and response.answer == IDK_MARKER
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == IDK_MARKER


async def test_parallel_tool_calls_run_concurrently(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM, twin: Service
) -> None:
    question = "Compare the two Northwind buildings"
    load(
        llm,
        mode,
        question,
        Calls(
            (
                Call("get_building", {"building_id": "bld-northwind-harbor"}),
                Call("get_building", {"building_id": "bld-northwind-hq"}),
            )
        ),
        Say("Harbor has 4 rooms, HQ has 3."),
    )
    twin.control.set_faults(latency_ms=300)
    events = await collect(make_agent(mode), question)
    response = done(events)
    assert [c.name for c in response.tool_calls] == ["get_building", "get_building"]
    assert sum(isinstance(e, ToolEvent) for e in events) == 2
    if mode == "native":  # one hop, both calls at once: ~2 x 300 ms, not 4 x 300 ms
        assert len(response.usage.hops) == 2
        assert max(c.duration_ms for c in response.tool_calls) < 1100


async def test_provider_down_is_a_clean_provider_error(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "Is the provider up?"
    load(llm, mode, question, {"fault": "server_error", "status": 503})
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "provider_error"
    assert answer.error is not None and answer.error.code == "provider_unavailable"
    assert answer.error.status_code == 503
    assert "temporarily unavailable" in answer.answer
    assert "test-key" not in answer.model_dump_json()


async def test_provider_unreachable_while_streaming(mode: Mode, make_agent: MakeAgent) -> None:
    agent = make_agent(mode, llm_base_url="http://127.0.0.1:9/v1")
    events = await collect(agent, "Anyone there?")
    response = done(events)
    assert response.decision == "provider_error"
    assert response.error is not None and response.error.code == "provider_unavailable"


async def test_provider_rejection_is_a_provider_error(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "Use a model that does not exist"
    load(llm, mode, question, {"fault": "server_error", "status": 404})
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "provider_error"
    assert answer.error is not None and answer.error.code == "provider_rejected"


async def test_model_override_is_sent_to_the_provider(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "Hi, with another model"
    load(llm, mode, question, Say("Hi!"))
    answer = await make_agent(mode).answer(
        question, NORTHWIND_STAFF, model="google/gemini-2.5-flash"
    )
    assert answer.model == "google/gemini-2.5-flash"
    assert llm.chat_requests(question)[0].body["model"] == "google/gemini-2.5-flash"
    assert answer.cost.estimated_usd is not None and answer.cost.estimated_usd > 0


async def test_an_unusable_reply_is_retried_once(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "Hello, after a glitch"
    load(llm, mode, question, {"fault": "malformed"}, Say("Hello!"))
    answer = await make_agent(mode).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "answered" and answer.answer == "Hello!"
    retry = sent_messages(llm, question)[1][-1]
    assert retry["role"] == "user" and "could not be used" in retry["content"]


async def test_two_unusable_replies_end_in_provider_error(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM
) -> None:
    question = "Hello, after two glitches"
    load(llm, mode, question, {"fault": "malformed"}, {"fault": "malformed"})
    events = await collect(make_agent(mode), question)
    response = done(events)
    assert response.decision == "provider_error"
    assert response.error is not None and response.error.code == "malformed_reply"


class PicklingExecutor:
    """Stands in for a tool deployment: everything crosses a pickle boundary both ways."""

    def __init__(self, inner: ToolExecutor) -> None:
        self.inner = inner
        self.calls = 0

    def specs(self) -> list[ToolSpec]:
        specs: list[ToolSpec] = pickle.loads(pickle.dumps(self.inner.specs()))
        return specs

    async def execute(self, call: ToolCall, request: ToolRequest) -> ToolOutcome:
        self.calls += 1
        call, request = pickle.loads(pickle.dumps((call, request)))
        outcome = await self.inner.execute(call, request)
        result: ToolOutcome = pickle.loads(pickle.dumps(outcome))
        return result


async def test_tools_behind_a_process_boundary_keep_citations_working(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM, retriever: FakeRetriever
) -> None:
    retriever.hits = [hit("aaaaaaaaaaaa", "Exports are CSV files.")]
    question = "What format do report exports use?"
    load(
        llm,
        mode,
        question,
        Call("search_docs", {"query": "report export format"}),
        Say("CSV [^aaaaaaaaaaaa][^bbbbbbbbbbbb]."),
    )
    local = make_agent(mode)
    remote = PicklingExecutor(local.tools)
    agent = Agent(llm=local.llm, tools=remote, config=local.config)
    answer = await agent.answer(question, NORTHWIND_STAFF)
    assert remote.calls == 1
    assert answer.answer == "CSV [^aaaaaaaaaaaa]."
    assert [c.chunk_id for c in answer.citations] == ["aaaaaaaaaaaa"]
    assert answer.retrieval.hallucinated_citations == ["bbbbbbbbbbbb"]


async def test_closing_the_stream_cancels_running_tools(
    mode: Mode, make_agent: MakeAgent, llm: ScriptedLLM, twin: Service
) -> None:
    question = "Show both Northwind buildings, then hang up"
    load(
        llm,
        mode,
        question,
        Calls(
            (
                Call("list_buildings", {}),
                Call("get_building", {"building_id": "bld-northwind-harbor"}),
            )
        ),
        Say("unused"),
    )
    twin.control.set_faults(latency_ms=400)
    stream = make_agent(mode).stream(question, NORTHWIND_STAFF)
    first = None
    async for event in stream:
        if isinstance(event, ToolEvent):
            first = event
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert first is not None and first.call.name == "list_buildings"
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t.get_name().startswith("tool:") and not t.done()]
    assert pending == []
