"""In-process fakes of the ``LLMClient`` port, for testing code built on ``Agent``.

Modelled on the OpenAI Agents SDK's scripted ``FakeModel`` and pydantic-ai's
``TestModel``/``FunctionModel``: no HTTP, no provider, no SDK. ``ScriptedModel`` plays a queue
of scripted replies (or provider errors) in order and fails loudly when a call arrives with
nothing left; ``FunctionModel`` computes each reply from the request. Both record every
``ChatRequest`` they got, and stream text as several ``TextDelta`` s and tool calls as
``ToolCallDelta`` s, ending with one ``Completed``, as the real adapters do::

    model = ScriptedModel(
        tool_calls_reply(tool_call("list_buildings", {"name": "Harbor"})),
        text_reply("Riverside Depot has 4 rooms."),
    )
    agent = Agent(llm=model, tools=my_tools)
    answer = await agent.answer("How many rooms does Harbor have?", user)
    assert model.requests[1].messages[-1].role == "tool"

A reply's empty ``model`` becomes the model asked for, and an all-zero ``Usage`` becomes an
estimate (words in, words out), so cost and usage code sees plausible figures.
"""

from __future__ import annotations

import inspect
import itertools
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Literal

from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    LLMError,
    Message,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "FunctionModel",
    "ScriptExhausted",
    "ScriptedModel",
    "text_reply",
    "tool_call",
    "tool_calls_reply",
]

ToolCallingMode = Literal["native", "json_schema"]
Scripted = ChatResult | LLMError
ReplyFunction = Callable[[ChatRequest], ChatResult | Awaitable[ChatResult]]

DEFAULT_MODEL = "test/scripted"
_call_ids = itertools.count(1)


class ScriptExhausted(AssertionError):
    """A model call arrived after the last scripted reply (an AssertionError: the test fails)."""


# --- building replies ------------------------------------------------------------------------


def text_reply(text: str, *, usage: Usage | None = None, model: str = "") -> ChatResult:
    """A final text answer."""
    return ChatResult(
        kind="text",
        text=text,
        tool_calls=(),
        usage=usage or Usage(),
        model=model,
        finish_reason="stop",
    )


def tool_call(
    name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None
) -> ToolCall:
    """One tool call; ``arguments`` as a mapping (dumped to JSON) or raw JSON text."""
    raw = arguments if isinstance(arguments, str) else json.dumps(dict(arguments or {}))
    return ToolCall(id=id or f"call_{next(_call_ids)}", name=name, arguments=raw)


def tool_calls_reply(
    *calls: ToolCall, text: str | None = None, usage: Usage | None = None, model: str = ""
) -> ChatResult:
    """A reply asking for one or several tools (``text``: a preamble, e.g. "Let me check.")."""
    if not calls:
        raise ValueError("tool_calls_reply needs at least one ToolCall")
    return ChatResult(
        kind="tool_calls",
        text=text,
        tool_calls=calls,
        usage=usage or Usage(),
        model=model,
        finish_reason="tool_calls",
    )


# --- the fakes -------------------------------------------------------------------------------


def _words(messages: Iterable[Message]) -> int:
    return sum(len((m.content or "").split()) + len(m.tool_calls) for m in messages)


def _describe(request: ChatRequest, number: int) -> str:
    last = request.messages[-1] if request.messages else None
    said = f"{last.role}: {(last.content or '')[:200]!r}" if last else "no messages"
    return f"call {number} (model={request.model!r}, {len(request.messages)} messages, last {said})"


class _FakeModel:
    """What both fakes share: the port's surface, the request log, streaming."""

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        tool_calling_mode: ToolCallingMode = "native",
        chunk_chars: int | None = None,
    ) -> None:
        self.model = model
        self.tool_calling_mode: ToolCallingMode = tool_calling_mode  # read by Agent
        self.chunk_chars = chunk_chars  # None: stream one delta per word
        self.requests: list[ChatRequest] = []

    @property
    def default_model(self) -> str:
        return self.model

    async def _reply(self, request: ChatRequest) -> ChatResult:
        raise NotImplementedError

    async def chat(self, request: ChatRequest) -> ChatResult:
        self.requests.append(request)
        return self._complete(await self._reply(request), request)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        result = self._complete(await self._reply(request), request)
        for piece in self._pieces(result.text or ""):
            yield TextDelta(piece)
        for index, call in enumerate(result.tool_calls):
            yield ToolCallDelta(index=index, id=call.id, name=call.name)
            half = len(call.arguments) // 2  # arguments arrive in fragments, as on the wire
            for fragment in (call.arguments[:half], call.arguments[half:]):
                if fragment:
                    yield ToolCallDelta(index=index, arguments=fragment)
        yield Completed(result)

    def _pieces(self, text: str) -> list[str]:
        if self.chunk_chars:
            size = self.chunk_chars
            return [text[i : i + size] for i in range(0, len(text), size)]
        return re.findall(r"\S+\s*|\s+", text)

    def _complete(self, result: ChatResult, request: ChatRequest) -> ChatResult:
        """Fill what a script usually leaves out: the model that answered, and usage."""
        model = result.model or request.model or self.model
        usage = result.usage
        if usage == Usage():
            out = len((result.text or "").split()) + len(result.tool_calls)
            usage = Usage(input_tokens=max(1, _words(request.messages)), output_tokens=max(1, out))
        return replace(result, model=model, usage=usage)


class ScriptedModel(_FakeModel):
    """Plays scripted replies in order; a scripted ``LLMError`` is raised on its call.

    A call with nothing left raises ``ScriptExhausted`` naming the request; ``remaining``
    tells how many replies were never asked for (``assert_exhausted`` checks it is none).
    """

    def __init__(
        self,
        *replies: Scripted,
        model: str = DEFAULT_MODEL,
        tool_calling_mode: ToolCallingMode = "native",
        chunk_chars: int | None = None,
    ) -> None:
        super().__init__(model=model, tool_calling_mode=tool_calling_mode, chunk_chars=chunk_chars)
        self._queue: deque[Scripted] = deque(replies)

    def script(self, *replies: Scripted) -> None:
        """Append replies to the queue."""
        self._queue.extend(replies)

    @property
    def remaining(self) -> int:
        return len(self._queue)

    def assert_exhausted(self) -> None:
        if self._queue:
            raise AssertionError(f"{len(self._queue)} scripted replies were never asked for")

    async def _reply(self, request: ChatRequest) -> ChatResult:
        if not self._queue:
            raise ScriptExhausted(
                f"ScriptedModel has no reply left for {_describe(request, len(self.requests))}"
            )
        reply = self._queue.popleft()
        if isinstance(reply, LLMError):
            raise reply
        return reply


class FunctionModel(_FakeModel):
    """Each reply is ``function(request)`` (sync or async); it may raise an ``LLMError``."""

    def __init__(
        self,
        function: ReplyFunction,
        *,
        model: str = DEFAULT_MODEL,
        tool_calling_mode: ToolCallingMode = "native",
        chunk_chars: int | None = None,
    ) -> None:
        super().__init__(model=model, tool_calling_mode=tool_calling_mode, chunk_chars=chunk_chars)
        self.function = function

    async def _reply(self, request: ChatRequest) -> ChatResult:
        reply = self.function(request)
        if inspect.isawaitable(reply):
            return await reply
        return reply
