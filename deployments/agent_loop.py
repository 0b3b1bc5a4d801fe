"""``AgentLoop`` deployment: the bounded tool-calling loop. Talks to the model provider over
HTTP and runs tools through the ``ToolProxy`` deployment."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from agent.answer import AgentAnswer, AgentEvent, DoneEvent
from agent.llm.base import ToolCall, ToolSpec
from agent.request import AgentRequest
from agent.tools.executor import ToolExecutor, ToolRequest
from agent.tools.registry import ToolOutcome, parse_arguments
from deployments.metrics import RayServeMetrics
from foundation.settings import Settings
from foundation.tracing import use_context
from serve_app.metrics import MetricsSink, answer_measurements
from serve_app.readiness import ReadinessCheck, provider_check
from serve_app.wiring import build_agent, build_llm_client, replica_settings, tool_registry

log = logging.getLogger(__name__)

TOOL_SERVICE_UNAVAILABLE = (
    "the tool service is temporarily unavailable; try again later or say live data is unavailable"
)


class HandleToolExecutor:
    """The loop's ``ToolExecutor`` port over the ToolProxy deployment. Tool specs are static
    (the tool classes), so they are read locally rather than fetched over a hop.

    Like any ``ToolExecutor`` it never raises (except cancellation): a ToolProxy replica that
    dies under the call (``RayActorError``) gets one retry, which Serve routes to another
    replica (every tool is read-only, so a repeat is harmless); a second failure, or any other
    failure of the hop, is a tool error the model reads, and the run goes on."""

    def __init__(self, handle: DeploymentHandle[Any], specs: list[ToolSpec]) -> None:
        self._handle = handle
        self._specs = specs

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    async def execute(self, call: ToolCall, request: ToolRequest) -> ToolOutcome:
        started = time.perf_counter()
        for attempt in (1, 2):
            try:
                outcome: ToolOutcome = await self._handle.execute.remote(call, request)
                return outcome
            except RayActorError as exc:
                log.warning(
                    "tool %s: ToolProxy replica lost (attempt %d): %s", call.name, attempt, exc
                )
            except Exception:
                log.exception("tool %s: the call to ToolProxy failed", call.name)
                break
        return _unavailable(call, started)


def _unavailable(call: ToolCall, started: float) -> ToolOutcome:
    arguments, _ = parse_arguments(call.arguments)
    return ToolOutcome(
        call_id=call.id,
        name=call.name,
        arguments=arguments,
        ok=False,
        error=TOOL_SERVICE_UNAVAILABLE,
        result_json=json.dumps({"error": TOOL_SERVICE_UNAVAILABLE}, separators=(",", ":")),
        duration_ms=round((time.perf_counter() - started) * 1000.0, 2),
    )


WARM_UP_ATTEMPTS = 6  # the local model's app may still be loading when this replica starts
WARM_UP_PAUSE_SECONDS = 10.0


def warm_prompt_cache(settings: Settings, tools: ToolExecutor) -> bool:
    """``Agent.warm_up`` in a thread of its own, with its own client and event loop (an SDK
    client is bound to the loop it first ran on), retried while the model is not up yet.
    ``tools`` only lends its specs: a warm-up runs no tool."""
    agent = build_agent(settings, llm=build_llm_client(settings), tools=tools)
    if not agent.strategy.warms_up:
        return False
    for attempt in range(WARM_UP_ATTEMPTS):
        if attempt:
            time.sleep(WARM_UP_PAUSE_SECONDS)
        started = time.perf_counter()
        if asyncio.run(agent.warm_up()):
            log.info("prompt warm-up: done in %.1f s", time.perf_counter() - started)
            return True
    return False


@serve.deployment(
    name="AgentLoop",
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=200,
    autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 64},
)
class AgentLoopDeployment:
    def __init__(self, tool_proxy: DeploymentHandle[Any]) -> None:
        settings = replica_settings("AgentLoop")
        self.settings = settings
        self.metrics: MetricsSink = RayServeMetrics()
        self._tool_proxy = tool_proxy
        self.agent = build_agent(
            settings,
            llm=build_llm_client(settings),
            tools=HandleToolExecutor(tool_proxy, tool_registry(settings).specs()),
        )
        if self.agent.strategy.warms_up:  # a native provider gets no warm-up: no thread, no client
            threading.Thread(
                target=warm_prompt_cache,
                args=(settings, self.agent.tools),
                name="prompt-warm-up",
                daemon=True,
            ).start()

    async def answer(self, request: AgentRequest) -> AgentAnswer:
        with use_context(request.trace_context):
            answer = await self.agent.run(request)
        self.metrics.record(answer_measurements(answer))
        return answer

    async def stream(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        # Called through a streaming handle; a client disconnect cancels this generator
        # (and, through the loop, the running tools).
        with use_context(request.trace_context):
            stream = self.agent.run_stream(request)
            async for event in stream:
                if isinstance(event, DoneEvent):
                    self.metrics.record(answer_measurements(event.response))
                yield event

    async def readiness(self) -> list[ReadinessCheck]:
        checks: list[ReadinessCheck] = await self._tool_proxy.readiness.remote()
        return [*checks, provider_check(self.settings)]
