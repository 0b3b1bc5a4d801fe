"""Progress events around the loop, kept out of it: the ``started`` event before a run's
first step, and the ``waiting`` heartbeat around a model stream that has not produced
anything yet.

The heartbeat is what makes queueing visible: a local model serving other requests on all its
slots (or reading a long prompt on 2 CPU cores) sends nothing for many seconds, and without
it the caller sees a silent connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import suppress
from typing import Any, TypeVar

from agent.answer import AgentEvent, ProgressEvent
from agent.llm.base import ToolCall
from agent.tools.registry import parse_arguments

__all__ = ["DEFAULT_HEARTBEAT_SECONDS", "prepend", "tool_started", "with_heartbeat"]

DEFAULT_HEARTBEAT_SECONDS = 2.5

T = TypeVar("T")


async def prepend(
    first: AgentEvent, rest: AsyncGenerator[AgentEvent, None]
) -> AsyncGenerator[AgentEvent, None]:
    """``first``, then ``rest``'s events; closing this closes ``rest``."""
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


def tool_started(call: ToolCall) -> ProgressEvent:
    """The ``tool_started`` event of one call (arguments as ``ToolCallTrace`` will show them)."""
    arguments: dict[str, Any] = parse_arguments(call.arguments)[0]
    return ProgressEvent(stage="tool_started", tool=call.name, arguments=arguments)


async def with_heartbeat(
    source: AsyncIterator[T], *, hop: int, every: float
) -> AsyncGenerator[T | ProgressEvent, None]:
    """``source``'s items; until its first one arrives, a ``waiting`` event every ``every``
    seconds. Closing this closes ``source``.

    Only the first item is awaited in a task (``asyncio.wait`` needs one to time out on
    without cancelling it); the rest is read in the caller's task, as without the wrapper.
    """
    started = time.monotonic()
    first: asyncio.Task[T | _End] = asyncio.ensure_future(_first(source))
    try:
        while not first.done():
            await asyncio.wait({first}, timeout=every)
            if not first.done():
                elapsed = round(time.monotonic() - started, 1)
                yield ProgressEvent(stage="waiting", hop=hop, elapsed_s=elapsed)
        item = first.result()
        if isinstance(item, _End):
            return
        yield item
        async for item in source:
            yield item
    finally:
        await _cancel(first)
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            with suppress(Exception):
                await aclose()


class _End:
    """``source`` ended before its first item (a task cannot end in StopAsyncIteration)."""


async def _first(source: AsyncIterator[T]) -> T | _End:
    try:
        return await source.__anext__()
    except StopAsyncIteration:
        return _End()


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Stop ``task`` if still running and wait for it: the wrapper was closed early, so its
    outcome is moot (gathered, so a failure is not logged as never retrieved, and our own
    cancellation still propagates)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
