"""The eight tools the service ships, as an explicit set: the tests that pin behaviour on
them (prompt hashes, the planner's steps, composed answers) build their registry from this
list, not from ``build_default_registry``, so adding a tool to the default registry (one
class, one line: docs/adding-a-tool.md) changes none of what they pin."""

from __future__ import annotations

from typing import Any

from agent.tools import (
    DEFAULT_TIMEOUT_SECONDS,
    GetBuilding,
    GetLatestSensorData,
    GetRoom,
    GetRoomOccupancy,
    GetSensorHistory,
    ListBuildings,
    ListSensors,
    SearchDocs,
    Tool,
    ToolRegistry,
)

SHIPPED_TOOLS: tuple[type[Tool[Any, Any]], ...] = (
    SearchDocs,
    ListBuildings,
    GetBuilding,
    GetRoom,
    GetRoomOccupancy,
    GetLatestSensorData,
    GetSensorHistory,
    ListSensors,
)


def shipped_registry(timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> ToolRegistry:
    """The shipped tools, in the default registry's order."""
    return ToolRegistry([tool() for tool in SHIPPED_TOOLS], timeout_seconds=timeout_seconds)
