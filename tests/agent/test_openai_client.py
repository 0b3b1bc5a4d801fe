"""``OpenAICompatibleClient`` against the scripted OpenAI-compatible server over real HTTP."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from agent.llm.base import (
    QUEUE_PRIORITY_HEADER,
    ChatRequest,
    ChatResult,
    Completed,
    LLMClient,
    MalformedReply,
    Message,
    ProviderRejected,
    ProviderUnavailable,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)
from agent.llm.json_schema_mode import JsonSchemaMode
from agent.llm.native_mode import NativeMode
from agent.llm.openai_client import (
    OpenAICompatibleClient,
    ToolCallingMode,
    _redact,
    mode_adapter,
)
from agent.markers import IDK_MARKER
from foundation.settings import Settings, SettingsError
from local_world.scripted_llm import ScriptedLLM
from local_world.servers import run_in_thread
from serve_app.wiring import build_llm_client

# the OpenAI-compatible adapter against the HTTP scripted model server: the wire is the subject
pytestmark = pytest.mark.allow_sockets

TOOLS = (
    ToolSpec(
        name="get_room_occupancy",
        description="Live occupancy of a room.",
        parameters={
            "type": "object",
            "properties": {"room_id": {"type": "string"}},
            "required": ["room_id"],
        },
    ),
    ToolSpec(
        name="list_sensors",
        description="The sensors installed in a building or room.",
        parameters={
            "type": "object",
            "properties": {"building_id": {"type": "string"}, "room_id": {"type": "string"}},
            "required": ["building_id"],
        },
    ),
)
SECRET_KEY = "sk-or-v1-0123456789abcdef0123456789abcdef"

MakeClient = Callable[..., OpenAICompatibleClient]


@pytest.fixture
async def make_client(llm_url: str) -> AsyncIterator[MakeClient]:
    clients: list[OpenAICompatibleClient] = []

    def make(
        mode: ToolCallingMode = "native", *, base_url: str | None = None, **kwargs: Any
    ) -> OpenAICompatibleClient:
        options: dict[str, Any] = {
            "base_url": base_url or llm_url,
            "api_key": "test-key",
            "default_model": "openai/gpt-4o-mini",
            "tool_calling_mode": mode,
            "timeout_seconds": 5.0,
            "max_retries": 0,
            "temperature": 0.0,
            "max_output_tokens": 256,
        }
        options.update(kwargs)
        client = OpenAICompatibleClient(**options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def ask(question: str, *, tools: tuple[ToolSpec, ...] = TOOLS, **kwargs: Any) -> ChatRequest:
    return ChatRequest(
        messages=[
            Message(role="system", content="You are CrowdVision's assistant."),
            Message(role="user", content=question),
        ],
        tools=tools,
        **kwargs,
    )


async def collect(client: LLMClient, request: ChatRequest) -> tuple[list[StreamEvent], ChatResult]:
    events = [event async for event in client.stream(request)]
    assert isinstance(events[-1], Completed)
    assert not any(isinstance(e, Completed) for e in events[:-1])
    return events, events[-1].result


def body(llm: ScriptedLLM, index: int = -1) -> dict[str, Any]:
    recorded: dict[str, Any] = llm.chat_requests()[index].body
    return recorded


# --- native mode -------------------------------------------------------------------------------


async def test_client_satisfies_the_port(make_client: MakeClient) -> None:
    client = make_client()
    assert isinstance(client, LLMClient)
    assert client.default_model == "openai/gpt-4o-mini"


async def test_native_text(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script({"text": "Hello! Ask me about rooms.", "usage": {"prompt_tokens": 11}})
    result = await make_client().chat(ask("hi"))
    assert result.kind == "text"
    assert result.text == "Hello! Ask me about rooms."
    assert result.tool_calls == ()
    assert result.model == "openai/gpt-4o-mini"
    assert result.finish_reason == "stop"
    assert result.usage.input_tokens == 11
    assert result.usage.output_tokens > 0
    assert result.usage.provider_cost_usd is None
    sent = body(llm)
    assert sent["model"] == "openai/gpt-4o-mini"
    assert sent["messages"] == [
        {"role": "system", "content": "You are CrowdVision's assistant."},
        {"role": "user", "content": "hi"},
    ]
    assert sent["temperature"] == 0.0 and sent["max_tokens"] == 256
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_room_occupancy", "list_sensors"]
    assert sent["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_room_occupancy",
            "description": "Live occupancy of a room.",
            "parameters": TOOLS[0].parameters,
        },
    }
    assert "response_format" not in sent
    assert "usage" not in sent  # OpenRouter's usage accounting only goes to OpenRouter


async def test_request_overrides_model_tokens_and_temperature(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"text": "ok"})
    request = ask(
        "hi",
        tools=(),
        model="google/gemini-2.5-flash",
        max_output_tokens=64,
        temperature=0.3,
        extra={"seed": 7},
    )
    result = await make_client().chat(request)
    assert result.model == "google/gemini-2.5-flash"
    sent = body(llm)
    assert (sent["model"], sent["max_tokens"], sent["temperature"]) == (
        "google/gemini-2.5-flash",
        64,
        0.3,
    )
    assert sent["seed"] == 7
    assert "tools" not in sent


async def test_the_queue_priority_goes_as_a_header_only_when_set(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"text": "ok"}, {"text": "ok"})
    client = make_client()
    await client.chat(ask("hi", tools=(), queue_priority=1764700000.5))
    await client.chat(ask("hi", tools=()))
    first, second = llm.chat_requests()
    assert first.headers[QUEUE_PRIORITY_HEADER] == "1764700000.500000"
    assert QUEUE_PRIORITY_HEADER not in second.headers
    assert QUEUE_PRIORITY_HEADER not in first.body  # a header, never a body field


async def test_native_tool_calls_then_answer(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(
        {
            "tool_calls": [
                {"name": "get_room_occupancy", "arguments": {"room_id": "r-1"}, "id": "call_a"},
                {"name": "list_sensors", "arguments": {"building_id": "b-1"}, "id": "call_b"},
            ]
        },
        {"text": "Room r-1 holds 12 people [^0123456789ab]."},
    )
    client = make_client()
    first = await client.chat(ask("How busy is r-1, and what sensors does b-1 have?"))
    assert first.kind == "tool_calls"
    assert first.finish_reason == "tool_calls"
    assert first.tool_calls == (
        ToolCall("call_a", "get_room_occupancy", '{"room_id": "r-1"}'),
        ToolCall("call_b", "list_sensors", '{"building_id": "b-1"}'),
    )
    history = [
        *ask("How busy is r-1, and what sensors does b-1 have?").messages,
        Message(role="assistant", content=first.text, tool_calls=first.tool_calls),
        Message(role="tool", content='{"occupancy": 12}', tool_call_id="call_a"),
        Message(role="tool", content='{"sensors": []}', tool_call_id="call_b"),
    ]
    second = await client.chat(ChatRequest(messages=history, tools=TOOLS))
    assert second.kind == "text"
    assert second.text == "Room r-1 holds 12 people [^0123456789ab]."
    sent = body(llm)["messages"]
    assert sent[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_room_occupancy", "arguments": '{"room_id": "r-1"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "list_sensors", "arguments": '{"building_id": "b-1"}'},
            },
        ],
    }
    assert sent[3:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": '{"occupancy": 12}'},
        {"role": "tool", "tool_call_id": "call_b", "content": '{"sensors": []}'},
    ]


async def test_native_streaming_text_deltas(llm: ScriptedLLM, make_client: MakeClient) -> None:
    text = "Room 12A currently has 9 people, about 64% of its capacity."
    llm.script(
        {"text": text, "chunk_chars": 5, "usage": {"prompt_tokens": 40, "completion_tokens": 15}}
    )
    events, result = await collect(make_client(), ask("12A?"))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == -(-len(text) // 5)
    assert "".join(deltas) == text
    assert result.kind == "text" and result.text == text
    assert result.finish_reason == "stop"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (40, 15)
    sent = body(llm)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_native_streaming_tool_call_deltas_are_reassembled(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    arguments = {"building_id": "bld-acme-labs", "room_id": "room-acme-labs-wet-lab"}
    llm.script(
        {
            "tool_calls": [
                {"name": "list_sensors", "arguments": arguments, "id": "call_inv"},
                {"name": "get_room_occupancy", "arguments": {"room_id": "room-acme-labs-wet-lab"}},
            ],
            "chunk_chars": 7,
        }
    )
    events, result = await collect(make_client(), ask("what sensors does the wet lab have?"))
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert not any(isinstance(e, TextDelta) for e in events)
    assert len([d for d in deltas if d.index == 0 and d.arguments]) > 3  # really split
    assert deltas[0] == ToolCallDelta(index=0, id="call_inv", name="list_sensors", arguments="")
    assert "".join(d.arguments for d in deltas if d.index == 0) == json.dumps(arguments)
    assert result.kind == "tool_calls"
    assert result.finish_reason == "tool_calls"
    first, second = result.tool_calls
    assert (first.id, first.name, json.loads(first.arguments)) == (
        "call_inv",
        "list_sensors",
        arguments,
    )
    assert second.name == "get_room_occupancy"
    assert json.loads(second.arguments) == {"room_id": "room-acme-labs-wet-lab"}
    assert second.id  # the server's id, passed through


async def test_provider_cost_is_read_from_usage(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(
        {"text": "a", "usage": {"prompt_tokens": 100, "completion_tokens": 10, "cost": 0.00042}},
        {"text": "b", "usage": {"cost": 0.0002}},
    )
    client = make_client()
    result = await client.chat(ask("hi"))
    assert result.usage.provider_cost_usd == pytest.approx(0.00042)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (100, 10)
    _, streamed = await collect(client, ask("hi again"))
    assert streamed.usage.provider_cost_usd == pytest.approx(0.0002)


async def test_openrouter_usage_accounting_is_requested_when_asked(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"text": "a"})
    await make_client(request_provider_cost=True).chat(ask("hi"))
    assert body(llm)["usage"] == {"include": True}


# --- streams the scripted server does not produce ----------------------------------------------


class RawStream:
    """A bare OpenAI-style SSE endpoint replaying ``events`` (dicts, or ``"BREAK"`` to drop
    the connection mid-stream), for provider quirks the scripted server does not model."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any] | str] = []
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def chat() -> StreamingResponse:
            return StreamingResponse(self._replay(), media_type="text/event-stream")

    async def _replay(self) -> AsyncIterator[bytes]:
        for event in self.events:
            if event == "BREAK":
                raise RuntimeError("connection dropped (on purpose)")
            yield f"data: {json.dumps(event)}\n\n".encode()
        yield b"data: [DONE]\n\n"


@pytest.fixture(scope="module")
def raw_stream() -> Iterator[tuple[str, RawStream]]:
    raw = RawStream()
    with run_in_thread(raw.app) as url:
        yield url + "/v1", raw


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "google/gemini-2.5-flash",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def call_delta(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name:
        function["name"] = name
    entry: dict[str, Any] = {"index": 0, "type": "function", "function": function}
    if call_id:
        entry["id"] = call_id
    return {"tool_calls": [entry]}


async def test_parallel_calls_sent_under_one_index_stay_apart(
    raw_stream: tuple[str, RawStream], make_client: MakeClient
) -> None:
    url, raw = raw_stream
    raw.events = [
        chunk({"role": "assistant"}),
        chunk(call_delta("call_x", "get_room_occupancy", '{"room_id":')),
        chunk(call_delta(None, None, ' "r-1"}')),
        chunk(call_delta("call_y", "get_room_occupancy", '{"room_id": "r-2"}')),
        chunk({}, "tool_calls"),
    ]
    events, result = await collect(make_client(base_url=url), ask("r-1 and r-2?"))
    assert result.model == "google/gemini-2.5-flash"
    assert result.tool_calls == (
        ToolCall("call_x", "get_room_occupancy", '{"room_id": "r-1"}'),
        ToolCall("call_y", "get_room_occupancy", '{"room_id": "r-2"}'),
    )
    assert [d.index for d in events if isinstance(d, ToolCallDelta)] == [0, 0, 1]


async def test_a_streamed_refusal_is_a_refusal_reply(
    raw_stream: tuple[str, RawStream], make_client: MakeClient
) -> None:
    url, raw = raw_stream
    raw.events = [
        chunk({"role": "assistant", "content": None, "refusal": "I can't help with that."}),
        chunk({}, "stop"),
    ]
    events, result = await collect(make_client(base_url=url), ask("something unsafe"))
    assert (result.kind, result.text, result.reason) == ("refusal", None, "I can't help with that.")
    assert not [e for e in events if isinstance(e, TextDelta)]


def test_the_client_owns_one_mode_adapter() -> None:
    for mode, adapter in (("native", NativeMode), ("json_schema", JsonSchemaMode)):
        client = OpenAICompatibleClient(
            base_url="http://127.0.0.1:9/v1", api_key="k", default_model="m", tool_calling_mode=mode
        )
        assert client.tool_calling_mode == mode
        assert isinstance(mode_adapter(mode), adapter)
    with pytest.raises(ValueError, match="unknown tool_calling_mode"):
        OpenAICompatibleClient(
            base_url="http://x/v1",
            api_key="k",
            default_model="m",
            tool_calling_mode="xml",  # type: ignore[arg-type]
        )


async def test_an_error_event_mid_stream_is_unavailable(
    raw_stream: tuple[str, RawStream], make_client: MakeClient
) -> None:
    url, raw = raw_stream
    raw.events = [
        chunk({"role": "assistant", "content": "Partial"}),
        {"error": {"message": f"Upstream provider disconnected {SECRET_KEY}", "code": 502}},
    ]
    with pytest.raises(ProviderUnavailable, match="mid-reply: Upstream provider") as caught:
        await collect(make_client(base_url=url, api_key=SECRET_KEY), ask("hi"))
    assert SECRET_KEY not in str(caught.value)


async def test_a_dropped_connection_mid_stream_is_unavailable(
    raw_stream: tuple[str, RawStream], make_client: MakeClient
) -> None:
    url, raw = raw_stream
    raw.events = [chunk({"role": "assistant", "content": "Partial"}), "BREAK"]
    with pytest.raises(ProviderUnavailable, match="connection to the model provider failed"):
        await collect(make_client(base_url=url), ask("hi"))


# --- json_schema mode --------------------------------------------------------------------------


def assert_step_schema(sent: dict[str, Any], tool_names: list[str]) -> None:
    assert "tools" not in sent and "tool_choice" not in sent
    response_format = sent["response_format"]
    assert response_format["type"] == "json_schema"
    spec = response_format["json_schema"]
    assert spec["name"] == "agent_step"
    assert spec["strict"] is False
    branches = spec["schema"]["oneOf"]
    for branch in branches:
        assert next(iter(branch["properties"])) == "reason"  # reason FIRST
        assert branch["required"] == list(branch["properties"])
        assert branch["additionalProperties"] is False
    tool_branches = [b for b in branches if "tool" in b["properties"]]
    assert [b["properties"]["tool"]["const"] for b in tool_branches] == tool_names
    by_name = {t.name: t for t in TOOLS}
    for branch in tool_branches:
        name = branch["properties"]["tool"]["const"]
        assert branch["properties"]["arguments"] == by_name[name].parameters
    others = [list(b["properties"]) for b in branches if "tool" not in b["properties"]]
    assert others == [
        ["reason", "final_answer", "sources"],
        ["reason", "decline"],
        ["reason", "idk"],
    ]
    assert branches[-2]["properties"]["decline"] == {"type": "boolean", "const": True}
    assert branches[-1]["properties"]["idk"] == {"type": "boolean", "const": True}


async def test_json_schema_tool_branch(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(
        {
            "json": {
                "reason": "needs live data",
                "tool": "get_room_occupancy",
                "arguments": {"room_id": "r-1"},
            }
        }
    )
    result = await make_client("json_schema").chat(ask("How full is r-1?"))
    assert result.kind == "tool_calls"
    assert result.text is None
    assert result.reason == "needs live data"
    assert result.tool_calls == (ToolCall("call_1", "get_room_occupancy", '{"room_id": "r-1"}'),)
    assert_step_schema(body(llm), ["get_room_occupancy", "list_sensors"])


@pytest.mark.parametrize(
    ("step", "kind", "text"),
    [
        (
            {"reason": "a greeting", "final_answer": "Hello! How can I help?"},
            "text",
            "Hello! How can I help?",
        ),
        # decline: a refusal (the service writes its text); idk: the IDK sentence, streamed
        ({"reason": "not about CrowdVision", "decline": True}, "refusal", None),
        ({"reason": "the tools found nothing", "idk": True}, "text", IDK_MARKER),
    ],
)
async def test_json_schema_answer_branches(
    llm: ScriptedLLM,
    make_client: MakeClient,
    step: dict[str, Any],
    kind: str,
    text: str | None,
) -> None:
    llm.script({"json": step}, {"json": step})
    client = make_client("json_schema")
    result = await client.chat(ask("a question"))
    assert (result.kind, result.text, result.tool_calls) == (kind, text, ())
    assert result.reason == step["reason"]
    assert_step_schema(body(llm), ["get_room_occupancy", "list_sensors"])
    events, streamed = await collect(client, ask("a question"))
    assert (streamed.kind, streamed.text) == (kind, text)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == (text or "")


async def test_json_schema_without_tools_has_only_the_answer_branches(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"json": {"reason": "greeting", "final_answer": "Hi"}})
    await make_client("json_schema").chat(ask("hi", tools=()))
    assert_step_schema(body(llm), [])


async def test_json_schema_streams_the_final_answer_as_it_arrives(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    answer = 'The "Atrium" holds 40 people [^0123456789ab].\nSee café notes 😀 \\ done.'
    llm.script(
        {"json": {"reason": "docs say so", "final_answer": answer}, "chunk_chars": 3},
    )
    events, result = await collect(make_client("json_schema"), ask("atrium capacity?"))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 10  # incremental, not one blob at the end
    assert "".join(deltas) == answer
    assert all("reason" not in d and "docs say so" not in d for d in deltas)
    assert result.kind == "text" and result.text == answer


async def test_json_schema_streamed_tool_step(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script(
        {
            "json": {
                "reason": "inventory",
                "tool": "list_sensors",
                "arguments": {"building_id": "b"},
            },
            "chunk_chars": 4,
        }
    )
    events, result = await collect(make_client("json_schema"), ask("sensors in b?"))
    assert [e for e in events if isinstance(e, TextDelta)] == []
    (delta,) = [e for e in events if isinstance(e, ToolCallDelta)]
    assert delta == ToolCallDelta(0, "call_1", "list_sensors", '{"building_id": "b"}')
    assert result.tool_calls == (ToolCall("call_1", "list_sensors", '{"building_id": "b"}'),)


async def test_json_schema_tool_results_go_back_as_user_messages(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(
        {"json": {"reason": "need more", "tool": "list_sensors", "arguments": {"building_id": "b"}}}
    )
    history = [
        *ask("How busy is r-1?").messages,
        Message(
            role="assistant",
            tool_calls=(ToolCall("call_1", "get_room_occupancy", '{"room_id": "r-1"}'),),
        ),
        Message(role="tool", content='{"occupancy": 12}', tool_call_id="call_1"),
    ]
    result = await make_client("json_schema", tool_result_note="Now decide.").chat(
        ChatRequest(messages=history, tools=TOOLS)
    )
    assert result.tool_calls[0].id == "call_2"  # numbered after the conversation's calls
    sent = body(llm)["messages"]
    assert sent[2] == {
        "role": "assistant",
        "content": '{"tool": "get_room_occupancy", "arguments": {"room_id": "r-1"}}',
    }
    assert sent[3] == {
        "role": "user",
        "content": 'Result of get_room_occupancy (call_1):\n{"occupancy": 12}\n\nNow decide.',
    }
    assert all(m["role"] in {"system", "user", "assistant"} for m in sent)


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"text": "Sure! The room is busy."}, "not valid JSON"),
        ({"json": {"reason": "x", "tool": "delete_everything", "arguments": {}}}, "unknown tool"),
        ({"json": {"reason": "x"}}, "exactly one of"),
        ({"json": {"reason": "x", "final_answer": "a", "idk": True}}, "exactly one of"),
        ({"json": {"reason": "x", "final_answer": 3}}, "must be a string"),
        ({"json": {"reason": "x", "tool": "list_sensors", "arguments": "b"}}, "JSON object"),
        ({"json": ["not", "an", "object"]}, "JSON object"),
    ],
)
async def test_json_schema_malformed_steps(
    llm: ScriptedLLM, make_client: MakeClient, step: dict[str, Any], message: str
) -> None:
    llm.script(step, step)
    client = make_client("json_schema")
    with pytest.raises(MalformedReply, match=message):
        await client.chat(ask("q"))
    with pytest.raises(MalformedReply, match=message):
        await collect(client, ask("q"))


# --- errors and retries ------------------------------------------------------------------------


async def test_rate_limit_then_success_is_retried(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"fault": "rate_limit", "retry_after_ms": 20}, {"text": "ok"})
    result = await make_client(max_retries=2).chat(ask("hi"))
    assert result.text == "ok"
    assert [r.status for r in llm.chat_requests()] == [429, 200]


async def test_persistent_server_error_is_unavailable(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script(
        {"fault": "server_error", "status": 503, "retry_after_ms": 10},
        {"fault": "server_error", "status": 503, "retry_after_ms": 10},
        {"fault": "server_error", "status": 503, "retry_after_ms": 10},
        {"fault": "server_error", "status": 503, "retry_after_ms": 10},
    )
    client = make_client(max_retries=1)
    with pytest.raises(ProviderUnavailable, match="HTTP 503") as caught:
        await client.chat(ask("hi"))
    assert caught.value.status_code == 503
    assert len(llm.chat_requests()) == 2  # one try + one retry
    with pytest.raises(ProviderUnavailable):
        await collect(client, ask("hi"))
    assert len(llm.chat_requests()) == 4


async def test_rate_limit_exhausted_is_unavailable(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"fault": "rate_limit", "retry_after_ms": 10}, {"fault": "rate_limit"})
    with pytest.raises(ProviderUnavailable, match="HTTP 429"):
        await make_client(max_retries=1).chat(ask("hi"))


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: connecting is refused


async def test_connection_refused_is_unavailable(make_client: MakeClient) -> None:
    client = make_client(base_url=f"http://127.0.0.1:{_refused_port()}/v1", max_retries=1)
    with pytest.raises(
        ProviderUnavailable, match="connection to the model provider failed"
    ) as caught:
        await client.chat(ask("hi"))
    assert caught.value.status_code is None
    with pytest.raises(ProviderUnavailable):
        await collect(client, ask("hi"))


async def test_timeout_is_unavailable(llm: ScriptedLLM, make_client: MakeClient) -> None:
    llm.script({"fault": "hang"}, {"fault": "hang"})
    client = make_client(timeout_seconds=0.3)
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable, match="timed out"):
        await client.chat(ask("hi"))
    with pytest.raises(ProviderUnavailable, match="timed out"):
        await collect(client, ask("hi"))
    assert time.monotonic() - started < 5


@pytest.fixture
def keyed_llm(llm: ScriptedLLM) -> Iterator[ScriptedLLM]:
    """The scripted server, demanding a key other than the client's (restored afterwards)."""
    llm.api_key = "the-right-key"
    try:
        yield llm
    finally:
        llm.api_key = None


async def test_bad_key_is_rejected_without_leaking_it(
    keyed_llm: ScriptedLLM, make_client: MakeClient
) -> None:
    keyed_llm.script({"text": "unused"})
    client = make_client(api_key=SECRET_KEY, max_retries=3)
    with pytest.raises(ProviderRejected, match="HTTP 401") as caught:
        await client.chat(ask("hi"))
    error = caught.value
    assert error.status_code == 401
    assert "Incorrect API key" in str(error)
    assert SECRET_KEY not in str(error) and SECRET_KEY not in repr(error)
    assert error.__cause__ is None and error.__suppress_context__
    assert len(keyed_llm.chat_requests()) == 1  # a 401 is not retried
    with pytest.raises(ProviderRejected):
        await collect(client, ask("hi"))


async def test_client_errors_are_rejected_with_the_provider_message(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"fault": "server_error", "status": 404, "message": "No endpoints for model x"})
    with pytest.raises(ProviderRejected, match=r"HTTP 404.*No endpoints for model x"):
        await make_client(max_retries=2).chat(ask("hi"))
    assert len(llm.chat_requests()) == 1


async def test_a_key_echoed_by_the_provider_is_scrubbed(
    llm: ScriptedLLM, make_client: MakeClient
) -> None:
    llm.script({"fault": "server_error", "status": 400, "message": f"bad key {SECRET_KEY}"})
    with pytest.raises(ProviderRejected) as caught:
        await make_client(api_key=SECRET_KEY).chat(ask("hi"))
    assert SECRET_KEY not in str(caught.value)
    assert "bad key ***" in str(caught.value)


def test_redact_masks_key_shapes() -> None:
    text = "Incorrect API key provided: sk-proj-abcdef123456. Bearer abc.def.ghi and secret-value"
    cleaned = _redact(text, ["secret-value"])
    assert "abcdef123456" not in cleaned and "abc.def.ghi" not in cleaned
    assert "secret-value" not in cleaned
    assert cleaned.startswith("Incorrect API key provided: ***")
    assert len(_redact("x" * 1000, [])) <= 300


@pytest.mark.parametrize("mode", ["native", "json_schema"])
async def test_malformed_body_is_a_malformed_reply(
    llm: ScriptedLLM, make_client: MakeClient, mode: ToolCallingMode
) -> None:
    llm.script({"fault": "malformed"}, {"fault": "malformed"})
    client = make_client(mode)
    with pytest.raises(MalformedReply):
        await client.chat(ask("hi"))
    with pytest.raises(MalformedReply):
        await collect(client, ask("hi"))


# --- the factory and the no-real-provider guard ------------------------------------------------


def _settings(monkeypatch: pytest.MonkeyPatch, **values: Any) -> Settings:
    for name in ("OPENROUTER_API_KEY", "LLM_API_KEY", "DEEPSEEK_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    values.setdefault("llm_api_key", None)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_missing_key_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch)
    with pytest.raises(SettingsError) as caught:
        build_llm_client(settings)
    message = str(caught.value)
    for name in ("OPENROUTER_API_KEY", "LLM_API_KEY", "DEEPSEEK_API_KEY", "GOOGLE_API_KEY"):
        assert name in message


async def test_local_model_needs_no_key(
    monkeypatch: pytest.MonkeyPatch, llm: ScriptedLLM, llm_url: str
) -> None:
    settings = _settings(
        monkeypatch,
        llm_base_url=llm_url,
        answer_model="local/scripted",
        tool_calling_mode="json_schema",
        llm_max_retries=0,
        max_output_tokens=128,
    )
    client = build_llm_client(settings, model="local/qwen2.5-coder-1.5b-instruct")
    try:
        assert client.default_model == "local/qwen2.5-coder-1.5b-instruct"
        assert client.tool_calling_mode == "json_schema"
        llm.script({"json": {"reason": "hi", "final_answer": "Hello"}})
        result = await client.chat(ask("hi"))
        assert result.text == "Hello"
        sent = body(llm)
        assert sent["max_tokens"] == 128 and sent["model"] == "local/qwen2.5-coder-1.5b-instruct"
    finally:
        await client.aclose()


def test_no_test_can_reach_a_real_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """The autouse guard in conftest.py: a client for a real provider cannot even be built."""
    settings = _settings(monkeypatch, llm_api_key="sk-or-v1-test")
    assert settings.llm_base_url.startswith("https://openrouter.ai")
    with pytest.raises(pytest.fail.Exception, match="real model provider"):
        build_llm_client(settings)
    with pytest.raises(pytest.fail.Exception, match="real model provider"):
        openai.AsyncOpenAI(api_key="k")
    with pytest.raises(pytest.fail.Exception, match="real model provider"):
        openai.OpenAI(api_key="k", base_url="https://api.deepseek.com")
