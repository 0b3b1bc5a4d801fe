"""The in-process fakes of the model port (``agent.testing``) and the ``no_sockets`` guard."""

from __future__ import annotations

import socket

import pytest
from agent_helpers import MODES, NORTHWIND_STAFF, Mode

from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    LLMClient,
    LLMError,
    MalformedReply,
    Message,
    ProviderRejected,
    ProviderUnavailable,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from agent.loop import Agent, AgentConfig
from agent.prompts import load_system_prompt
from agent.testing import (
    FunctionModel,
    ScriptedModel,
    ScriptExhausted,
    text_reply,
    tool_call,
    tool_calls_reply,
)
from agent.tools.executor import ToolRequest
from agent.tools.registry import ToolOutcome


def ask(text: str, model: str | None = None) -> ChatRequest:
    return ChatRequest(messages=(Message("system", "be brief"), Message("user", text)), model=model)


async def collect(model: LLMClient, request: ChatRequest) -> list[StreamEvent]:
    return [event async for event in model.stream(request)]


def test_the_fakes_are_llm_clients() -> None:
    assert isinstance(ScriptedModel(), LLMClient)
    assert isinstance(FunctionModel(lambda r: text_reply("x")), LLMClient)
    assert ScriptedModel().tool_calling_mode == "native"
    assert ScriptedModel(tool_calling_mode="json_schema").tool_calling_mode == "json_schema"


async def test_replies_come_in_script_order_and_requests_are_recorded() -> None:
    call = tool_call("list_buildings", {"name": "Harbor"}, id="call_a")
    model = ScriptedModel(tool_calls_reply(call), text_reply("Done."))
    first = await model.chat(ask("one"))
    second = await model.chat(ask("two", model="other/model"))
    assert (first.kind, first.tool_calls) == ("tool_calls", (call,))
    assert call.arguments == '{"name": "Harbor"}'
    assert (second.kind, second.text) == ("text", "Done.")
    assert [r.messages[-1].content for r in model.requests] == ["one", "two"]
    # an empty model is the one asked for; zero usage becomes an estimate
    assert (first.model, second.model) == ("test/scripted", "other/model")
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert model.remaining == 0
    model.assert_exhausted()


async def test_scripted_usage_and_model_are_kept() -> None:
    usage = Usage(input_tokens=120, output_tokens=7, provider_cost_usd=0.002)
    model = ScriptedModel(text_reply("Hi", usage=usage, model="provider/answered"))
    result = await model.chat(ask("hi", model="provider/asked"))
    assert (result.usage, result.model) == (usage, "provider/answered")


async def test_a_call_with_no_reply_left_fails_loudly_naming_the_request() -> None:
    model = ScriptedModel(text_reply("only one"))
    await model.chat(ask("first"))
    with pytest.raises(ScriptExhausted, match=r"call 2 .*'second question'"):
        await model.chat(ask("second question"))
    with pytest.raises(ScriptExhausted, match="call 3"):
        await collect(model, ask("third"))
    assert issubclass(ScriptExhausted, AssertionError)


def test_assert_exhausted_reports_unused_replies() -> None:
    model = ScriptedModel(text_reply("a"), text_reply("b"))
    with pytest.raises(AssertionError, match="2 scripted replies"):
        model.assert_exhausted()


async def test_text_streams_as_several_deltas_then_one_completed() -> None:
    model = ScriptedModel(text_reply("Harbor has four rooms [^abc]."))
    events = await collect(model, ask("rooms?"))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert deltas == ["Harbor ", "has ", "four ", "rooms ", "[^abc]."]
    assert isinstance(events[-1], Completed) and events[-1].result.text == "".join(deltas)
    assert sum(isinstance(e, Completed) for e in events) == 1


async def test_chunk_chars_splits_text_evenly() -> None:
    model = ScriptedModel(text_reply("abcdefgh"), chunk_chars=3)
    events = await collect(model, ask("x"))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["abc", "def", "gh"]


async def test_tool_calls_stream_as_tool_call_deltas() -> None:
    calls = (
        tool_call("get_building", {"building_id": "bld-1"}, id="c1"),
        tool_call("get_room", '{"room_id": "r-1"}', id="c2"),
    )
    model = ScriptedModel(tool_calls_reply(*calls, text="Let me check."))
    events = await collect(model, ask("x"))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Let ", "me ", "check."]
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    for index, call in enumerate(calls):
        mine = [d for d in deltas if d.index == index]
        assert (mine[0].id, mine[0].name) == (call.id, call.name)
        assert len(mine) > 2  # the header, then the arguments in fragments
        assert "".join(d.arguments for d in mine) == call.arguments
    assert isinstance(events[-1], Completed) and events[-1].result.tool_calls == calls


@pytest.mark.parametrize("error", [ProviderUnavailable, ProviderRejected, MalformedReply])
async def test_a_scripted_error_is_raised_on_its_call(error: type[LLMError]) -> None:
    model = ScriptedModel(text_reply("fine"), error("boom", status_code=503), text_reply("ok"))
    assert (await model.chat(ask("1"))).text == "fine"
    with pytest.raises(error, match="boom"):
        await collect(model, ask("2"))
    assert (await model.chat(ask("3"))).text == "ok"
    assert len(model.requests) == 3


async def test_function_model_sync_and_async() -> None:
    def echo(request: ChatRequest) -> ChatResult:
        return text_reply(f"you said {request.messages[-1].content}")

    async def shout(request: ChatRequest) -> ChatResult:
        return text_reply((request.messages[-1].content or "").upper())

    assert (await FunctionModel(echo).chat(ask("hi"))).text == "you said hi"
    events = await collect(FunctionModel(shout), ask("hi there"))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["HI ", "THERE"]


async def test_function_model_may_raise_a_provider_error() -> None:
    def down(request: ChatRequest) -> ChatResult:
        raise ProviderUnavailable("provider down", status_code=502)

    model = FunctionModel(down)
    with pytest.raises(ProviderUnavailable):
        await model.chat(ask("x"))
    assert len(model.requests) == 1


class NoTools:
    """A ``ToolExecutor`` with no tools."""

    def specs(self) -> list[ToolSpec]:
        return []

    async def execute(self, call: ToolCall, request: ToolRequest) -> ToolOutcome:
        raise AssertionError("no tool should run")


@pytest.mark.parametrize("mode", MODES)
async def test_the_agent_renders_the_prompt_of_the_fakes_mode(mode: Mode) -> None:
    model = ScriptedModel(text_reply("Hello!"), tool_calling_mode=mode)
    agent = Agent(llm=model, tools=NoTools(), config=AgentConfig())
    answer = await agent.answer("Hello", NORTHWIND_STAFF)
    assert answer.answer == "Hello!" and answer.model == "test/scripted"
    assert model.requests[0].messages[0].content == load_system_prompt().render(mode, [])


def test_no_sockets_refuses_a_connection() -> None:
    with socket.socket() as sock, pytest.raises(AssertionError, match="no_sockets"):
        sock.connect(("127.0.0.1", 9))


@pytest.mark.allow_sockets
def test_allow_sockets_lifts_the_guard() -> None:
    with socket.socket() as sock, pytest.raises(OSError):
        sock.connect(("127.0.0.1", 9))  # refused by the OS, not by the guard
