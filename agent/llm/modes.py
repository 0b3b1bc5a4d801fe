"""The tool-calling mode: how a chat request and its reply look on the OpenAI wire.

``OpenAICompatibleClient`` is the transport (SDK, common request fields, usage, errors); a
:class:`ModeAdapter` is everything that differs between the two modes: the wire messages,
the mode's request fields (``tools`` or ``response_format``), and how a reply, whole or
streamed, becomes the port's ``ChatResult`` and ``StreamEvent`` types.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from agent.llm.base import ChatRequest, ChatResult, Message, StreamEvent, Usage

ToolCallingMode = Literal["native", "json_schema"]


@dataclass
class ReplyMeta:
    """What the transport knows about a reply besides its message: the model that answered,
    the usage and the finish reason. Updated chunk by chunk while a stream runs."""

    model: str
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None


class ModeAdapter(ABC):
    """One tool-calling mode's side of a chat completion (see the module docstring)."""

    name: ClassVar[ToolCallingMode]

    @abstractmethod
    def wire_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """Port messages -> the ``messages`` request field."""

    @abstractmethod
    def request_fields(self, request: ChatRequest) -> dict[str, Any]:
        """The mode's own request fields (``tools`` or ``response_format``) for ``request``
        (its tools, and the ``choices`` a constraining mode enforces)."""

    @abstractmethod
    def parse_reply(
        self, message: ChatCompletionMessage, request: ChatRequest, meta: ReplyMeta
    ) -> ChatResult:
        """A complete reply's message -> ``ChatResult``."""

    @abstractmethod
    def stream_events(
        self, deltas: AsyncIterator[ChoiceDelta], request: ChatRequest, meta: ReplyMeta
    ) -> AsyncGenerator[StreamEvent, None]:
        """The first choice's deltas -> ``TextDelta``/``ToolCallDelta``, then one ``Completed``
        (``meta`` is final once ``deltas`` is exhausted)."""


def prior_tool_calls(messages: Sequence[Message]) -> int:
    """How many tool calls the conversation already holds (numbers the next call ids)."""
    return sum(len(m.tool_calls) for m in messages if m.role == "assistant")
