"""``ToolProxy`` deployment: runs tool calls as the asking user. Holds the shared HTTP client
to twin-service and sensor-service and reaches retrieval through the ``Retriever``
deployment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from agent.llm.base import ToolCall
from agent.tools.executor import ToolRequest
from agent.tools.registry import ToolOutcome
from foundation.tracing import inject_current
from retrieval.search import SearchHit
from serve_app.authz import load_authorizer
from serve_app.readiness import ReadinessCheck
from serve_app.wiring import build_downstream, local_tool_executor, replica_settings


class _HandleRetriever:
    """The tools' ``Retriever`` port over the Retriever deployment's handle."""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self._handle = handle

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[SearchHit]:
        hits: list[SearchHit] = await self._handle.search.remote(
            query, list(acl), top_k, inject_current()
        )
        return hits


@serve.deployment(
    name="ToolProxy",
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=200,
    autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 64},
)
class ToolProxyDeployment:
    def __init__(self, retriever: DeploymentHandle[Any]) -> None:
        settings = replica_settings("ToolProxy")
        self._retriever = retriever
        self.executor = local_tool_executor(
            settings,
            downstream=build_downstream(settings),
            authorizer=load_authorizer(),
            retriever=_HandleRetriever(retriever),
        )

    async def execute(self, call: ToolCall, request: ToolRequest) -> ToolOutcome:
        # The executor attaches request.trace_context itself (the hop's span).
        return await self.executor.execute(call, request)

    async def readiness(self) -> list[ReadinessCheck]:
        checks: list[ReadinessCheck] = await self._retriever.readiness.remote()
        return checks
