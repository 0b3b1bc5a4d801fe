"""The tool-calling loop end to end, in process: the ``agent.testing.ScriptedModel`` fake of
the model port, real tools against the twin and sensor simulators over ASGI, no sockets
(``no_sockets``). Every test runs in both tool-calling modes: the mode changes the system
prompt the Agent renders, and the script plays what that mode's adapter would return (one
tool call per step in json_schema mode, a decline as a refusal).

Two tests stay on the real OpenAI-compatible adapter and the HTTP scripted model server
(``allow_sockets``): an HTTP 503 (the adapter's status mapping and API-key redaction, end to
end) and a provider that refuses the connection (a transport fault)."""

from __future__ import annotations

import asyncio
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
    script_replies,
    script_steps,
    scripted,
)

from agent.answer import (
    AgentAnswer,
    AgentEvent,
    CitationEvent,
    DoneEvent,
    TokenEvent,
    ToolEvent,
)
from agent.llm.base import (
    ChatRequest,
    ChatResult,
    MalformedReply,
    ProviderRejected,
    ToolCall,
    ToolSpec,
)
from agent.loop import Agent
from agent.prompts import DECLINE_TEXT, IDK_MARKER, REFUSAL_MARKER, load_system_prompt
from agent.testing import FunctionModel, ScriptedModel, tool_call, tool_calls_reply
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


def contents(model: ScriptedModel | FunctionModel, index: int) -> str:
    """Every message content of the ``index``-th model request, joined."""
    return "\n".join(m.content or "" for m in model.requests[index].messages)


async def collect(agent: Agent, question: str, **kwargs: Any) -> list[AgentEvent]:
    return [event async for event in agent.stream(question, NORTHWIND_STAFF, **kwargs)]


def done(events: list[AgentEvent]) -> AgentAnswer:
    assert isinstance(events[-1], DoneEvent)
    assert sum(isinstance(e, DoneEvent) for e in events) == 1
    return events[-1].response


async def test_two_step_chain_resolves_a_building_then_its_rooms(
    mode: Mode,
    make_local_agent: MakeAgent,
    world: World,
    local_twin: Service,
    clock: Any,
) -> None:
    question = "How busy is Harbor Warehouse right now?"
    model = scripted(
        mode,
        Call("list_buildings", {"name": "Harbor Warehouse"}),
        Call("get_building", {"building_id": "bld-northwind-harbor"}),
        Call("get_room_occupancy", {"room_ids": HARBOR_ROOMS}),
        Say("Loading Dock A is the busiest room in Harbor Warehouse."),
    )
    agent = make_local_agent(model)
    answer = await agent.answer(question, NORTHWIND_STAFF)

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
    # the mode decides the system prompt the agent sent, once, first
    (system,) = [m for m in model.requests[0].messages if m.role == "system"]
    assert system == model.requests[0].messages[0]
    assert system.content == load_system_prompt().render(mode, agent.tools.specs())
    # every model call of one question carries the same queue priority: when it was asked
    priorities = {r.queue_priority for r in model.requests}
    assert len(priorities) == 1 and None not in priorities
    # the last request carried the live occupancy the simulator computed
    room = world.room("room-harbor-dock-a")
    assert room is not None
    expected = world.occupancy_at(room, epoch_minute(clock()))
    assert (
        f'"room_id":"room-harbor-dock-a","building_id":"bld-northwind-harbor","occupancy":{expected},'
        in contents(model, -1)
    )
    # every twin call carried the caller's own claims, verbatim
    assert {r.headers[HEADER] for r in local_twin.control.requests()} == {
        NORTHWIND_STAFF.claims_header
    }


async def test_tool_error_goes_back_to_the_model_which_recovers(
    mode: Mode, make_local_agent: MakeAgent
) -> None:
    question = "How many rooms does the Harbor building have?"
    model = scripted(
        mode,
        Call("get_building", {"building_id": "bld-harbor"}),
        Call("list_buildings", {"name": "Harbor"}),
        Say("Harbor Warehouse has 4 rooms."),
    )
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "answered"
    first, second = answer.tool_calls
    assert (first.ok, first.error) == (False, BUILDING_NOT_FOUND)
    assert second.ok and second.error is None
    assert BUILDING_NOT_FOUND in contents(model, 1)


async def test_invalid_arguments_are_a_tool_error_not_a_crash(
    mode: Mode, make_local_agent: MakeAgent
) -> None:
    question = "Tell me about room number seven"
    model = scripted(
        mode,
        Call("get_room", {"room": "seven"}),
        Idk(),
        Idk(),  # again, after the search the service makes before IDK (agent.search_first)
    )
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "idk" and answer.idk and answer.answer == IDK_MARKER
    trace, _search = answer.tool_calls
    assert not trace.ok and "room_id: Field required" in (trace.error or "")


async def test_hop_exhaustion_returns_idk(
    mode: Mode, make_local_agent: MakeAgent, local_twin: Service
) -> None:
    question = "Keep looking at the buildings forever"

    def forever(request: ChatRequest) -> ChatResult:
        return tool_calls_reply(tool_call("list_buildings", {}))

    model = FunctionModel(forever, model="local/scripted", tool_calling_mode=mode)
    answer = await make_local_agent(model, max_tool_hops=3).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "tool_loop_exhausted"
    assert answer.idk and answer.answer == IDK_MARKER
    assert len(model.requests) == 3
    assert len(answer.tool_calls) == 2  # the third hop's request is not run
    assert len(local_twin.paths()) == 2
    assert any("still asked for: list_buildings" in note for note in answer.notes)


async def test_the_tool_call_cap_ends_the_run_before_the_calls_that_pass_it(
    mode: Mode, make_local_agent: MakeAgent, local_twin: Service
) -> None:
    """MAX_TOOL_CALLS_PER_ASK counts tool calls across hops: a hop whose calls would pass it
    runs none of them, and the run ends like an exhausted loop (IDK), never a 500."""
    question = "Look at every building three at a time"

    def greedy(request: ChatRequest) -> ChatResult:
        return tool_calls_reply(*[tool_call("list_buildings", {}) for _ in range(3)])

    model = FunctionModel(greedy, model="local/scripted", tool_calling_mode=mode)
    agent = make_local_agent(model, plan_first="off", max_tool_calls_per_ask=7)
    answer = await agent.answer(question, NORTHWIND_STAFF)
    assert answer.decision == "tool_loop_exhausted" and answer.answer == IDK_MARKER
    assert len(answer.tool_calls) == 6 and len(local_twin.paths()) == 6  # 3 + 3; 9 > 7
    assert len(model.requests) == 3
    assert any("tool-call limit reached (6 of 7 made)" in note for note in answer.notes)


async def test_the_token_cap_stops_further_model_calls(
    mode: Mode, make_local_agent: MakeAgent, local_twin: Service
) -> None:
    question = "Keep looking at the buildings, whatever it costs"

    def forever(request: ChatRequest) -> ChatResult:
        return tool_calls_reply(tool_call("list_buildings", {}))

    model = FunctionModel(forever, model="local/scripted", tool_calling_mode=mode)
    uncapped = await make_local_agent(
        FunctionModel(forever, model="local/scripted", tool_calling_mode=mode),
        plan_first="off",
        max_tool_hops=2,
    ).answer(question, NORTHWIND_STAFF)
    per_call = uncapped.usage.input_tokens // 2  # about one request's prompt
    agent = make_local_agent(model, plan_first="off", max_tokens_per_ask=per_call * 2)
    answer = await agent.answer(question, NORTHWIND_STAFF)
    assert answer.decision == "tool_loop_exhausted" and answer.idk
    used = answer.usage.input_tokens + answer.usage.output_tokens
    assert used >= per_call * 2 and len(model.requests) == 2  # the cap, not the 6 hops
    assert any("token limit reached" in note for note in answer.notes)


async def test_off_topic_is_declined_without_tools(
    mode: Mode, make_local_agent: MakeAgent, local_twin: Service
) -> None:
    question = "What is the capital of France?"
    model = scripted(mode, Decline())
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "declined_out_of_scope"
    assert answer.answer.startswith(REFUSAL_MARKER)
    if mode == "json_schema":
        assert answer.answer == DECLINE_TEXT
    assert answer.tool_calls == [] and not answer.idk
    assert local_twin.paths() == []
    assert len(model.requests) == 1


async def test_decline_after_tool_calls_is_noted(mode: Mode, make_local_agent: MakeAgent) -> None:
    question = "List my buildings and then write me a poem"
    model = scripted(mode, Call("list_buildings", {}), Decline())
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "declined_out_of_scope"
    assert "declined after 1 tool call(s)" in answer.notes


async def test_greeting_is_answered_directly(mode: Mode, make_local_agent: MakeAgent) -> None:
    question = "Hello there!"
    model = scripted(mode, Say("Hello! How can I help with your buildings today?"))
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "answered"
    assert answer.answer == "Hello! How can I help with your buildings today?"
    assert answer.tool_calls == [] and answer.citations == []


async def test_invented_citation_is_stripped_and_reported(
    mode: Mode, make_local_agent: MakeAgent, retriever: FakeRetriever
) -> None:
    retriever.hits = [hit("aaaaaaaaaaaa", "Alerts repeat at most once per 15-minute cooldown.")]
    question = "How often do occupancy alerts repeat?"
    model = scripted(
        mode,
        Call("search_docs", {"query": "alert cooldown"}),
        Say("At most once per 15 minutes [^aaaaaaaaaaaa], and never at night [^ffffffffffff]."),
    )
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF, top_k=3)
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
    mode: Mode, make_local_agent: MakeAgent, retriever: FakeRetriever
) -> None:
    retriever.hits = [hit("aaaaaaaaaaaa", "Alerts repeat at most once per cooldown.")]
    question = "Do alerts repeat, streamed?"
    model = scripted(
        mode,
        Call("search_docs", {"query": "alerts repeat"}),
        Say(
            "Once per cooldown [^aaaaaaaaaaaa] unless muted [^ffffffffffff]. Done [^aaaaaaaaaaaa]."
        ),
        chunk_chars=3,
    )
    events = await collect(make_local_agent(model), question)
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
    mode: Mode, make_local_agent: MakeAgent
) -> None:
    model = scripted(mode, Decline())
    events = await collect(make_local_agent(model), "Translate hello into German")
    response = done(events)
    assert response.decision == "declined_out_of_scope"
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == response.answer

    model.script(*script_replies(mode, Idk(), Idk()))  # before and after the service's search
    events = await collect(make_local_agent(model), "What is the wifi password in the lobby?")
    response = done(events)
    assert response.decision == "idk" and response.answer == IDK_MARKER
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == IDK_MARKER


async def test_parallel_tool_calls_run_concurrently(
    mode: Mode, make_local_agent: MakeAgent, local_twin: Service
) -> None:
    question = "Compare the two Northwind buildings"
    model = scripted(
        mode,
        Calls(
            (
                Call("get_building", {"building_id": "bld-northwind-harbor"}),
                Call("get_building", {"building_id": "bld-northwind-hq"}),
            )
        ),
        Say("Harbor has 4 rooms, HQ has 3."),
    )
    local_twin.control.set_faults(latency_ms=300)
    events = await collect(make_local_agent(model), question)
    response = done(events)
    assert [c.name for c in response.tool_calls] == ["get_building", "get_building"]
    assert sum(isinstance(e, ToolEvent) for e in events) == 2
    if mode == "native":  # one hop, both calls at once: ~2 x 300 ms, not 4 x 300 ms
        assert len(response.usage.hops) == 2
        assert max(c.duration_ms for c in response.tool_calls) < 1100


@pytest.mark.allow_sockets  # the real adapter over HTTP: status mapping, key redaction
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


@pytest.mark.allow_sockets  # a transport fault: the connection is refused
async def test_provider_unreachable_while_streaming(mode: Mode, make_agent: MakeAgent) -> None:
    agent = make_agent(mode, llm_base_url="http://127.0.0.1:9/v1")
    events = await collect(agent, "Anyone there?")
    response = done(events)
    assert response.decision == "provider_error"
    assert response.error is not None and response.error.code == "provider_unavailable"


async def test_provider_rejection_is_a_provider_error(
    mode: Mode, make_local_agent: MakeAgent
) -> None:
    question = "Use a model that does not exist"
    model = scripted(mode, ProviderRejected("unknown model", status_code=404))
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "provider_error"
    assert answer.error is not None and answer.error.code == "provider_rejected"


async def test_model_override_is_sent_to_the_provider(
    mode: Mode, make_local_agent: MakeAgent
) -> None:
    question = "Hi, with another model"
    model = scripted(mode, Say("Hi!"))
    answer = await make_local_agent(model).answer(
        question, NORTHWIND_STAFF, model="google/gemini-2.5-flash"
    )
    assert answer.model == "google/gemini-2.5-flash"
    assert model.requests[0].model == "google/gemini-2.5-flash"
    assert answer.cost.estimated_usd is not None and answer.cost.estimated_usd > 0


async def test_an_unusable_reply_is_retried_once(mode: Mode, make_local_agent: MakeAgent) -> None:
    question = "Hello, after a glitch"
    model = scripted(mode, MalformedReply("the model's step is not valid JSON"), Say("Hello!"))
    answer = await make_local_agent(model).answer(question, NORTHWIND_STAFF)
    assert answer.decision == "answered" and answer.answer == "Hello!"
    retry = model.requests[1].messages[-1]
    assert retry.role == "user" and "could not be used" in (retry.content or "")


async def test_two_unusable_replies_end_in_provider_error(
    mode: Mode, make_local_agent: MakeAgent
) -> None:
    question = "Hello, after two glitches"
    model = scripted(mode, MalformedReply("no JSON step"), MalformedReply("no JSON step"))
    events = await collect(make_local_agent(model), question)
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
    mode: Mode, make_local_agent: MakeAgent, retriever: FakeRetriever
) -> None:
    retriever.hits = [hit("aaaaaaaaaaaa", "Exports are CSV files.")]
    question = "What format do report exports use?"
    model = scripted(
        mode,
        Call("search_docs", {"query": "report export format"}),
        Say("CSV [^aaaaaaaaaaaa][^bbbbbbbbbbbb]."),
    )
    local = make_local_agent(model)
    remote = PicklingExecutor(local.tools)
    agent = Agent(llm=local.llm, tools=remote, config=local.config, strategy=local.strategy)
    answer = await agent.answer(question, NORTHWIND_STAFF)
    assert remote.calls == 1
    assert answer.answer == "CSV [^aaaaaaaaaaaa]."
    assert [c.chunk_id for c in answer.citations] == ["aaaaaaaaaaaa"]
    assert answer.retrieval.hallucinated_citations == ["bbbbbbbbbbbb"]


async def test_closing_the_stream_cancels_running_tools(
    mode: Mode, make_local_agent: MakeAgent, local_twin: Service
) -> None:
    question = "Show both Northwind buildings, then hang up"
    model = scripted(
        mode,
        Calls(
            (
                Call("list_buildings", {}),
                Call("get_building", {"building_id": "bld-northwind-harbor"}),
            )
        ),
        Say("unused"),
    )
    local_twin.control.set_faults(latency_ms=400)
    stream = make_local_agent(model).stream(question, NORTHWIND_STAFF)
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
