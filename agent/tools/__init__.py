"""The agent's tools. Adding one is one class (see docs/adding-a-tool.md) plus one line in
``build_default_registry``."""

from __future__ import annotations

from agent.tools.base import ChunkSink, Retriever, Tool, ToolContext, ToolError
from agent.tools.downstream import Downstream, DownstreamError, NotFoundError
from agent.tools.executor import LocalToolExecutor, ToolExecutor, ToolRequest
from agent.tools.registry import DEFAULT_TIMEOUT_SECONDS, ToolOutcome, ToolRegistry
from agent.tools.search_docs import SearchDocs
from agent.tools.sensor import GetLatestSensorData, GetSensorHistory, ListSensors
from agent.tools.twin import (
    GetBuilding,
    GetRoom,
    GetRoomOccupancy,
    ListBuildings,
)


def build_default_registry(timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> ToolRegistry:
    """The eight read-only tools, in the order the model sees them."""
    registry = ToolRegistry(timeout_seconds=timeout_seconds)
    registry.register(SearchDocs())
    registry.register(ListBuildings())
    registry.register(GetBuilding())
    registry.register(GetRoom())
    registry.register(GetRoomOccupancy())
    registry.register(GetLatestSensorData())
    registry.register(GetSensorHistory())
    registry.register(ListSensors())
    return registry


__all__ = [
    "ChunkSink",
    "Downstream",
    "DownstreamError",
    "LocalToolExecutor",
    "NotFoundError",
    "Retriever",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolExecutor",
    "ToolOutcome",
    "ToolRegistry",
    "ToolRequest",
    "build_default_registry",
]
