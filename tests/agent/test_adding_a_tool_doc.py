"""docs/adding-a-tool.md stays true: its worked example runs against the simulators (in
process, over ASGI) and, with nothing but the class and the registry line, reaches the prompt
and the step schema."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_helpers import NORTHWIND_STAFF

from agent.llm.base import ToolCall
from agent.llm.json_schema_mode import response_format
from agent.prompts import load_system_prompt
from agent.tools import Tool, ToolContext, ToolRegistry, build_default_registry, twin
from local_world.world import World

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
    registry = build_default_registry()
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
        "json_schema", build_default_registry().specs()
    )
