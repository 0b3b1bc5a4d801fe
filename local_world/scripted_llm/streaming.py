"""A scripted reply as OpenAI's SSE stream of ``chat.completion.chunk`` events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from local_world.scripted_llm.script import Step
from local_world.scripted_llm.wire import Completion


def sse(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def pieces(text: str, size: int) -> list[str]:
    """``text`` in ``size``-character pieces (one empty piece for an empty text)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


async def _pause(step: Step) -> None:
    # A client that goes away cancels the stream's generator (Starlette), ending the stream.
    if step.stream_delay_ms:
        await asyncio.sleep(step.stream_delay_ms / 1000.0)


async def stream(
    completion: Completion, step: Step, *, include_usage: bool, malformed: bool
) -> AsyncIterator[bytes]:
    """OpenAI's ``chat.completion.chunk`` sequence for one scripted reply."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return completion.chunk(delta, finish_reason, include_usage=include_usage)

    yield sse(chunk({"role": "assistant", "content": "", "refusal": None}))
    if malformed:  # an event cut in half, then the stream ends
        text = json.dumps(chunk({"content": completion.content or "partial"}))
        yield f"data: {text[: len(text) // 2]}\n\n".encode()
        return
    content = completion.content
    for piece in pieces(content, step.chunk_chars) if content else []:
        await _pause(step)
        yield sse(chunk({"content": piece}))
    for index, call in enumerate(completion.calls):
        async for event in _tool_call_events(completion, step, index, call, include_usage):
            yield event
    yield sse(chunk({}, completion.finish))
    if include_usage:
        final = chunk({})
        final["choices"] = []
        final["usage"] = completion.usage
        yield sse(final)
    yield sse("[DONE]")


async def _tool_call_events(
    completion: Completion, step: Step, index: int, call: dict[str, Any], include_usage: bool
) -> AsyncIterator[bytes]:
    """One tool call: its id and name first, then its arguments split across chunks."""
    function = call["function"]
    header = {
        "index": index,
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": ""},
    }
    await _pause(step)
    yield sse(completion.chunk({"tool_calls": [header]}, include_usage=include_usage))
    for piece in pieces(function["arguments"], step.chunk_chars):
        await _pause(step)
        delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
        yield sse(completion.chunk(delta, include_usage=include_usage))
