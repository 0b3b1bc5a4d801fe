"""One hop's tool calls, run concurrently as the caller: a ``tool_started`` progress event
for each before they start, a ``tool`` event as each finishes, then the results appended to
the run's conversation in call order. Closing the events early (a client disconnect)
cancels the calls still running."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable, Sequence

from opentelemetry import context as otel_context

from agent.answer import AgentEvent, ToolEvent
from agent.llm.base import Message, ToolCall
from agent.progress import tool_started
from agent.run_state import Run, tool_trace
from agent.tools.executor import ToolExecutor
from agent.tools.registry import ToolOutcome
from foundation.tracing import inject

__all__ = ["run_tool_calls"]


async def run_tool_calls(
    tools: ToolExecutor,
    run: Run,
    calls: Sequence[ToolCall],
    hop: otel_context.Context,
    *,
    then: Callable[[Sequence[ToolOutcome]], None],
) -> AsyncGenerator[AgentEvent, None]:
    """Run ``calls`` and record their outcomes on ``run``; ``then`` gets the outcomes in call
    order once all are in. Each call carries the hop's trace context, so its
    ``tool.<name>`` span (opened where it runs) is the hop's child."""
    for call in calls:
        yield tool_started(call)
    request = dataclasses.replace(run.request, trace_context=inject(hop))
    tasks = [
        asyncio.create_task(tools.execute(call, request), name=f"tool:{call.name}")
        for call in calls
    ]
    try:
        for finished in asyncio.as_completed(tasks):
            outcome = await finished
            yield ToolEvent(call=tool_trace(outcome))
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:  # the stream was closed early: wait for the cancellations to land
            await asyncio.gather(*pending, return_exceptions=True)
    outcomes = [task.result() for task in tasks]
    for outcome in outcomes:
        run.seen_chunks.add(outcome.chunks)
        run.traces.append(tool_trace(outcome))
        run.messages.append(
            Message("tool", outcome.result_json, tool_call_id=outcome.call_id, name=outcome.name)
        )
    then(outcomes)
