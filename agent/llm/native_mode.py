"""Native tool calling: OpenAI ``tools`` in the request, ``tool_calls`` in the reply.

Streaming yields ``TextDelta`` for content and ``ToolCallDelta`` for each tool-call fragment;
``Completed`` carries the reassembled calls. OpenAI's ``message.refusal`` (with no content)
becomes a ``refusal`` reply.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall

from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    Message,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)
from agent.llm.modes import ModeAdapter, ReplyMeta, prior_tool_calls


class NativeMode(ModeAdapter):
    name = "native"

    def wire_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        return native_wire_messages(messages)

    def request_fields(self, request: ChatRequest) -> dict[str, Any]:
        # choices are not sent: native providers keep the plain loop (ids are checked by the
        # tools, as before).
        tools = request.tools
        return {"tools": [native_tool(tool) for tool in tools]} if tools else {}

    def parse_reply(
        self, message: ChatCompletionMessage, request: ChatRequest, meta: ReplyMeta
    ) -> ChatResult:
        first = prior_tool_calls(request.messages) + 1
        calls: list[ToolCall] = []
        for index, call in enumerate(message.tool_calls or ()):
            function = getattr(call, "function", None)
            if function is None:  # a custom (non-function) tool call: not ours
                continue
            calls.append(
                ToolCall(
                    id=call.id or f"call_{first + index}",
                    name=function.name,
                    arguments=function.arguments or "",
                )
            )
        refusal = getattr(message, "refusal", None)
        return _result(message.content, refusal, tuple(calls), meta)

    async def stream_events(
        self, deltas: AsyncIterator[ChoiceDelta], request: ChatRequest, meta: ReplyMeta
    ) -> AsyncGenerator[StreamEvent, None]:
        content: list[str] = []
        refusal: list[str] = []
        calls = _CallAssembler()
        async for delta in deltas:
            if delta.content:
                content.append(delta.content)
                yield TextDelta(delta.content)
            if getattr(delta, "refusal", None):
                refusal.append(str(delta.refusal))
            for tool_delta in delta.tool_calls or ():
                yield calls.feed(tool_delta)
        first = prior_tool_calls(request.messages) + 1
        text = "".join(content) if content else None
        yield Completed(_result(text, "".join(refusal) or None, calls.calls(first), meta))


@dataclass
class _ToolCallBuffer:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _CallAssembler:
    """Reassembles streamed tool-call fragments into calls, in order of appearance."""

    def __init__(self) -> None:
        self._buffers: dict[int, _ToolCallBuffer] = {}  # by call slot
        self._slots: dict[int, int] = {}  # the provider's tool-call index -> its current slot

    def feed(self, tool_delta: ChoiceDeltaToolCall) -> ToolCallDelta:
        # Some OpenAI-compatible providers send parallel calls under one index; a new id at a
        # used index starts a new call.
        slot = self._slots.get(tool_delta.index)
        if slot is None or (
            tool_delta.id and self._buffers[slot].id and tool_delta.id != self._buffers[slot].id
        ):
            slot = self._slots[tool_delta.index] = len(self._buffers)
            self._buffers[slot] = _ToolCallBuffer()
        buffer = self._buffers[slot]
        name = tool_delta.function.name if tool_delta.function else None
        arguments = (tool_delta.function.arguments or "") if tool_delta.function else ""
        if tool_delta.id:
            buffer.id = tool_delta.id
        if name:
            buffer.name += name
        if arguments:
            buffer.arguments.append(arguments)
        return ToolCallDelta(
            index=slot, id=tool_delta.id or None, name=name or None, arguments=arguments
        )

    def calls(self, first: int) -> tuple[ToolCall, ...]:
        """The finished calls; ids the provider left out are numbered from ``first``."""
        return tuple(
            ToolCall(
                id=self._buffers[slot].id or f"call_{first + n}",
                name=self._buffers[slot].name,
                arguments="".join(self._buffers[slot].arguments),
            )
            for n, slot in enumerate(sorted(self._buffers))
        )


def _result(
    content: str | None, refusal: str | None, calls: tuple[ToolCall, ...], meta: ReplyMeta
) -> ChatResult:
    usage, model, finish = meta.usage, meta.model, meta.finish_reason
    if calls:
        return ChatResult("tool_calls", content or None, calls, usage, model, finish)
    if refusal and not content:
        # OpenAI's safety refusal: the service answers it like an out-of-scope question.
        return ChatResult("refusal", None, (), usage, model, finish, reason=refusal)
    return ChatResult("text", content or "", (), usage, model, finish)


def native_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        },
    }


def native_wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Port messages -> OpenAI chat messages (``tool`` results keep their ``tool_call_id``)."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            if not message.tool_call_id:
                raise ValueError("a tool message needs the tool_call_id it answers")
            wire.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": message.content or "",
                }
            )
        elif message.role == "assistant" and message.tool_calls:
            wire.append(_assistant_calls(message))
        else:
            wire.append({"role": message.role, "content": message.content or ""})
    return wire


def _assistant_calls(message: Message) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": message.content or None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments or "{}"},
            }
            for call in message.tool_calls
        ],
    }
