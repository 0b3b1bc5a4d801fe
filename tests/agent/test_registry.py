"""ToolRegistry mechanics with small in-test tools: registration, schemas, timeouts, crashes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from agent_helpers import ACME_STAFF
from pydantic import BaseModel, Field

from agent.llm.base import ToolCall
from agent.llm.openai_client import OpenAICompatibleClient
from agent.tools import (
    Downstream,
    LocalToolExecutor,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    build_default_registry,
)
from agent.tools.registry import result_of
from foundation.settings import Settings
from serve_app.authz import CedarAuthorizer
from serve_app.wiring import build_agent, local_tool_executor
from tests.shipped_tools import SHIPPED_TOOLS

MakeCtx = Callable[..., ToolContext]


class EchoArgs(BaseModel):
    text: str = Field(description="What to echo.")
    times: int = Field(default=1, ge=1, le=3)


class EchoResult(BaseModel):
    echo: list[str]
    user: str


class Echo(Tool[EchoArgs, EchoResult]):
    name = "echo"
    description = "Echo the text."

    async def run(self, args: EchoArgs, ctx: ToolContext) -> EchoResult:
        if args.text == "fail":
            raise ToolError("echo cannot say that; try another word")
        if args.text == "crash":
            raise RuntimeError("secret internals")
        if args.text == "slow":
            await asyncio.sleep(5)
        return EchoResult(echo=[args.text] * args.times, user=ctx.user.sub)


class Slow(Echo):
    name = "slow_echo"
    timeout_seconds = 0.1


class NotedResult(BaseModel):
    text: str
    maybe: str | None  # no default: always in the JSON, null or not
    note: str | None = None  # a default: in the JSON only when the tool set it


class Noted(Tool[EchoArgs, NotedResult]):
    name = "noted"
    description = "Echo, with a note for a long text."

    async def run(self, args: EchoArgs, ctx: ToolContext) -> NotedResult:
        if args.text == "wrong":
            return EchoResult(echo=[], user="")  # type: ignore[return-value]
        result = NotedResult(text=args.text, maybe=None)
        if len(args.text) > 3:
            result.note = "long"
        return result


def test_args_model_comes_from_the_type_argument() -> None:
    assert Echo().args_model is EchoArgs
    assert Slow().args_model is EchoArgs
    assert Echo().result_model is EchoResult and Slow().result_model is EchoResult
    assert Noted().result_model is NotedResult
    spec = Echo().spec()
    assert spec.name == "echo" and spec.description == "Echo the text."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "What to echo."},
            "times": {"type": "integer", "default": 1, "minimum": 1, "maximum": 3},
        },
        "required": ["text"],
    }


def test_register_rejects_duplicates() -> None:
    registry = ToolRegistry([Echo()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Echo())
    assert "echo" in registry and len(registry) == 1


def test_default_registry_has_the_eight_tools() -> None:
    registry = build_default_registry()
    shipped = [name for name in registry.names if name in {t.name for t in SHIPPED_TOOLS}]
    assert shipped == [
        "search_docs",
        "list_buildings",
        "get_building",
        "get_room",
        "get_room_occupancy",
        "get_latest_sensor_data",
        "get_sensor_history",
        "list_sensors",
    ]
    for spec in registry.specs():
        assert spec.parameters["type"] == "object"
        assert spec.parameters.get("additionalProperties") is False
        assert '"title": "' not in json.dumps(spec.parameters)  # pydantic's titles are dropped


async def dispatch(registry: ToolRegistry, ctx: ToolContext, name: str, args: object) -> object:
    outcome = await registry.dispatch(ToolCall("c1", name, json.dumps(args)), ctx)
    assert outcome.call_id == "c1" and outcome.name == name
    assert outcome.duration_ms >= 0
    return outcome


async def test_dispatch_outcomes(make_local_ctx: MakeCtx) -> None:
    registry = ToolRegistry([Echo(), Slow()], timeout_seconds=2.0)
    ctx = make_local_ctx(ACME_STAFF)
    ok = await registry.dispatch(ToolCall("c1", "echo", '{"text": "hi", "times": 2}'), ctx)
    assert ok.ok and json.loads(ok.result_json) == {"echo": ["hi", "hi"], "user": "alice"}
    assert ok.arguments == {"text": "hi", "times": 2}

    empty = await registry.dispatch(ToolCall("c2", "echo", ""), ctx)
    assert not empty.ok and "text: Field required" in (empty.error or "")

    failed = await registry.dispatch(ToolCall("c3", "echo", '{"text": "fail"}'), ctx)
    assert failed.error == "echo cannot say that; try another word"

    crashed = await registry.dispatch(ToolCall("c4", "echo", '{"text": "crash"}'), ctx)
    assert crashed.error == "echo failed with an internal error"
    assert "secret" not in crashed.result_json

    slow = await registry.dispatch(ToolCall("c5", "slow_echo", '{"text": "slow"}'), ctx)
    assert slow.error == "slow_echo timed out after 0.1 s; try again later"
    assert slow.duration_ms < 2000

    bad = await registry.dispatch(ToolCall("c6", "echo", '{"text": 1'), ctx)
    assert bad.arguments == {"_raw": '{"text": 1'}
    assert "not valid JSON" in (bad.error or "")


async def test_results_are_models_dumped_compactly_and_read_back(make_local_ctx: MakeCtx) -> None:
    registry = ToolRegistry([Echo(), Noted()])
    ctx = make_local_ctx(ACME_STAFF)
    short = await registry.dispatch(ToolCall("c1", "noted", '{"text": "hé"}'), ctx)
    assert short.result_json == '{"text":"hé","maybe":null}'  # unset default: no key
    long = await registry.dispatch(ToolCall("c2", "noted", '{"text": "hello"}'), ctx)
    assert long.result_json == '{"text":"hello","maybe":null,"note":"long"}'
    assert result_of(long, Noted) == NotedResult(text="hello", maybe=None, note="long")
    assert result_of(long, Echo) is None  # another tool's outcome

    failed = await registry.dispatch(ToolCall("c3", "echo", '{"text": "fail"}'), ctx)
    assert result_of(failed, Echo) is None
    wrong = await registry.dispatch(ToolCall("c4", "noted", '{"text": "wrong"}'), ctx)
    assert wrong.error == "noted failed with an internal error"


def test_a_tool_needs_both_models() -> None:
    class Bare(Tool):  # type: ignore[type-arg]
        name = "bare"
        description = "No type arguments."

        async def run(self, args: BaseModel, ctx: ToolContext) -> BaseModel:
            return args

    with pytest.raises(TypeError, match="has no args model"):
        ToolRegistry([Bare()])


async def test_dispatch_propagates_cancellation(make_local_ctx: MakeCtx) -> None:
    registry = ToolRegistry([Echo()])
    task = asyncio.create_task(
        registry.dispatch(ToolCall("c1", "echo", '{"text": "slow"}'), make_local_ctx(ACME_STAFF))
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_agent_from_settings_wires_the_default_tools(
    local_settings: Settings, authorizer: CedarAuthorizer, local_downstream: Downstream
) -> None:
    settings, downstream = local_settings, local_downstream  # the client is never called
    client = OpenAICompatibleClient(
        base_url="http://127.0.0.1:9/v1", api_key="k", default_model="local/scripted"
    )
    wired = settings.model_copy(update={"twin_timeout_seconds": 20.0})
    tools = local_tool_executor(wired, downstream=downstream, authorizer=authorizer, retriever=None)
    agent = build_agent(wired, llm=client, tools=tools)
    assert isinstance(agent.tools, LocalToolExecutor)
    default = len(build_default_registry())  # the eight shipped tools, and any added since
    assert len(agent.tools.registry) == default and len(agent.tools.specs()) == default
    assert agent.tools.registry.timeout_seconds == 80.0
    assert agent.mode == "native" and agent.max_hops == settings.max_tool_hops
    await client.aclose()
