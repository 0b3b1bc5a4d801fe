"""docs/adding-a-tool.md stays true: its worked example runs against the simulators."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_helpers import NORTHWIND_STAFF

from agent.llm.base import ToolCall
from agent.tools import Tool, ToolContext, ToolRegistry, twin
from local_world.world import World

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-tool.md"


def example_tool() -> type[Tool[Any]]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    namespace: dict[str, Any] = dict(vars(twin))
    exec(blocks[0], namespace)
    tool: type[Tool[Any]] = namespace["GetBuildingOccupancy"]
    return tool


async def test_worked_example_runs(make_ctx: Callable[..., ToolContext], world: World) -> None:
    tool = example_tool()
    registry = ToolRegistry([tool()])
    assert registry.specs()[0].parameters["required"] == ["building_id"]
    ctx = make_ctx(NORTHWIND_STAFF)

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
