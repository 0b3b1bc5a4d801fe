"""docs/adding-a-tool.md stays true: its worked example runs against the simulators (in
process, over ASGI) and, with nothing but the class and the registry line, reaches the prompt
and the step schema, and answers the question that motivates it in both modes: called by the
model in the plain agentic loop, and run by the small-model planner before the model."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import NORTHWIND_STAFF, FakeRetriever, Mode

from agent.llm.base import ChatRequest, ChatResult, ToolCall
from agent.llm.json_schema_mode import response_format
from agent.loop import Agent
from agent.prompts import load_system_prompt
from agent.testing import FunctionModel, text_reply, tool_call, tool_calls_reply
from agent.tools import LocalToolExecutor, Tool, ToolContext, ToolRegistry, twin
from local_world.world import World
from serve_app.wiring import build_agent
from tests.shipped_tools import shipped_registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-tool.md"


def example_tool() -> type[Tool[Any, Any]]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    namespace: dict[str, Any] = dict(vars(twin))
    exec(blocks[0], namespace)
    tool: type[Tool[Any, Any]] = namespace["GetBuildingOccupancy"]
    return tool


async def test_worked_example_runs(
    make_local_ctx: Callable[..., ToolContext], world: World
) -> None:
    tool = example_tool()
    registry = ToolRegistry([tool()])
    assert registry.specs()[0].parameters["required"] == ["building_id"]
    ctx = make_local_ctx(NORTHWIND_STAFF)

    async def run(building_id: str) -> Any:
        arguments = json.dumps({"building_id": building_id})
        return await registry.dispatch(ToolCall("c1", tool.name, arguments), ctx)

    harbor = await run("bld-northwind-harbor")
    assert harbor.ok, harbor.error
    data = json.loads(harbor.result_json)
    assert data["capacity"] == sum(r.capacity for r in world.rooms_in("bld-northwind-harbor"))
    assert 0 <= data["people"] <= data["capacity"]
    forbidden, unknown = await run("bld-acme-tower"), await run("bld-nowhere")
    assert forbidden.result_json == unknown.result_json


def test_worked_example_reaches_the_prompt_and_the_schema() -> None:
    tool = example_tool()
    registry = shipped_registry()
    registry.register(tool())  # the registry line
    for example in tool.examples:
        tool.args_model.model_validate(dict(example.arguments))
    specs = registry.specs()
    prompt = load_system_prompt()
    text = prompt.render("json_schema", specs)
    assert "- get_building_occupancy(building_id: string): Live occupancy of a whole" in text
    assert f"- {tool.guidance}" in text and f"- {tool.guidance}" in prompt.render("native", specs)
    step = {
        "reason": "building-level occupancy",
        "tool": "get_building_occupancy",
        "arguments": {"building_id": "bld-123"},
    }
    assert f"How full is building bld-123? -> {json.dumps(step)}" in text
    lines = text.splitlines()
    at = lines.index("How full is building bld-123? -> " + json.dumps(step))
    assert '"tool": "get_room_occupancy"' in lines[at - 1]  # prompt_order 45: after it
    branches = response_format(specs)["json_schema"]["schema"]["oneOf"]
    tools = [b["properties"]["tool"]["const"] for b in branches if "tool" in b["properties"]]
    assert tools[-1] == "get_building_occupancy"
    assert "get_building_occupancy" not in load_system_prompt().render(
        "json_schema", shipped_registry().specs()
    )


QUESTION = "How full is Harbor Warehouse right now?"


def building_figures(request: ChatRequest) -> ChatResult:
    """A model that calls the example tool (when it has no result yet) and then answers
    with the figures of its result, as a faithful model would."""
    results = [m for m in request.messages if m.role == "tool" and m.name == EXAMPLE_NAME]
    if not results:
        arguments = {"building_id": "bld-northwind-harbor"}
        return tool_calls_reply(tool_call(EXAMPLE_NAME, arguments))
    data = json.loads(results[-1].content or "{}")
    return text_reply(f"{data['name']} has {data['people']} people of {data['capacity']}.")


EXAMPLE_NAME = "get_building_occupancy"


@pytest.mark.parametrize("mode", ["native", "json_schema"])
async def test_worked_example_answers_its_question_in_both_modes(
    mode: Mode,
    local_settings: Any,
    local_downstream: Any,
    authorizer: Any,
    retriever: FakeRetriever,
    clock: Any,
) -> None:
    registry = shipped_registry(timeout_seconds=10.0)
    registry.register(example_tool()())  # the registry line
    tools = LocalToolExecutor(
        registry,
        downstream=local_downstream,
        authorizer=authorizer,
        retriever=retriever,
        clock=clock,
    )
    # As the service wires it: native runs the plain loop, json_schema the small-model planner.
    settings = local_settings.model_copy(update={"tool_calling_mode": mode, "plan_first": "auto"})
    model = FunctionModel(building_figures, tool_calling_mode=mode)
    agent: Agent = build_agent(settings, llm=model, tools=tools)

    answer = await agent.answer(QUESTION, NORTHWIND_STAFF)

    assert answer.decision == "answered" and answer.retrieval.ungrounded == []
    assert answer.answer.startswith("Harbor Warehouse has ")
    called = [call.name for call in answer.tool_calls]
    assert EXAMPLE_NAME in called and "get_room_occupancy" not in called
    first_call = model.requests[0].messages
    planned = any(m.role == "tool" and m.name == EXAMPLE_NAME for m in first_call)
    assert planned == (mode == "json_schema")  # the planner ran it before the model's call
