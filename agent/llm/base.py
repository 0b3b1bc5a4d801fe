"""The ``LLMClient`` port: what the agent loop needs from a chat model, nothing more.

Modelled on the OpenAI Agents SDK's ``Model`` interface: one call for a whole reply, one
streaming call that yields text deltas and tool-call deltas and ends with the full reply.
Adapters map a provider's wire format onto these types; the loop never sees the SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]

# How a reply ended, as the loop sees it: an answer, tool calls, or a refusal to answer
# (OpenAI's ``message.refusal``, or a mode's own out-of-scope signal); the service writes a
# refusal's user-facing text.
ReplyKind = Literal["text", "tool_calls", "refusal"]


QUEUE_PRIORITY_HEADER = "x-queue-priority"
"""The HTTP header an OpenAI-compatible client sends ``ChatRequest.queue_priority`` in."""


@dataclass(frozen=True)
class ToolExample:
    """A worked example for the prompt: a question and the call that answers it."""

    question: str
    reason: str  # the one-line rationale shown before the call (modes that ask for one)
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: its name, description and JSON-schema parameters, plus
    what the system prompt says about it (``guidance``: one line on when to use it;
    ``examples``; ``prompt_order``: where both sit in the prompt, lower first).

    ``entity_arguments`` names the arguments that hold an entity id and the entity kind
    (``{"room_ids": "room"}``): a mode that can constrain values (``ChatRequest.choices``)
    limits them to the ids this request has resolved. ``answers``: the live-data questions
    the tool settles on its own (``"occupancy"``), for a strategy that runs a tool before
    the model (the small-model planner) to find it by what it does, not by its name."""

    name: str
    description: str
    parameters: dict[str, Any]
    guidance: str | None = None
    examples: tuple[ToolExample, ...] = ()
    prompt_order: int = 100
    entity_arguments: Mapping[str, str] = field(default_factory=dict)
    answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text, exactly as the model produced it (validated later)


@dataclass(frozen=True)
class Message:
    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # for role="tool"
    name: str | None = None  # tool name, for role="tool"


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    provider_cost_usd: float | None = None  # e.g. OpenRouter's usage.cost, when reported

    def __add__(self, other: Usage) -> Usage:
        costs = [c for c in (self.provider_cost_usd, other.provider_cost_usd) if c is not None]
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            sum(costs) if costs else None,
        )


@dataclass(frozen=True)
class ChatResult:
    kind: ReplyKind
    text: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    model: str  # the model that answered (the provider's response.model when given)
    finish_reason: str | None = None
    reason: str | None = None  # the model's short reason or refusal text, for traces only


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Completed:
    result: ChatResult


StreamEvent = TextDelta | ToolCallDelta | Completed


@dataclass(frozen=True)
class ChatRequest:
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    model: str | None = None  # None: the client's default (ANSWER_MODEL)
    max_output_tokens: int | None = None
    temperature: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Allowed values per entity kind ("building", "room", "chunk", ...) for this call. A
    # mode with constrained decoding enforces them (json_schema: ``enum``s, and a tool whose
    # required id has no allowed value is not offered); others may ignore them. A kind that
    # is absent is unconstrained.
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    allow_refusal: bool = True  # False: this call may not decline as out of scope
    # Short labels the model may cite instead of chunk ids (label -> chunk id): "1" costs a
    # small model one output token where a 12-character id costs about seven. A mode that
    # uses them maps every cited label back to its id before anything else sees it.
    source_labels: Mapping[str, str] = field(default_factory=dict)
    # When the question this call serves was asked (seconds since the epoch): a server that
    # queues calls (the local LLM app) serves the earliest question's calls first, so an
    # answer under way finishes before a newer one starts. None: no hint.
    queue_priority: float | None = None


class LLMError(Exception):
    """Base of the provider errors left after the SDK's own retries.

    ``status_code`` is the provider's HTTP status when there was one (None for connection
    failures, timeouts and unparseable replies); the message never contains the API key.
    """

    def __init__(self, message: str = "", *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ProviderUnavailable(LLMError):
    """Connection failures, timeouts, 429 and 5xx after retries: try again later."""


class ProviderRejected(LLMError):
    """The provider refused the request (4xx other than 429: auth, unknown model, bad input)."""


class MalformedReply(LLMError):
    """The reply could not be understood (e.g. a structured step that is not valid JSON)."""


@runtime_checkable
class LLMClient(Protocol):
    @property
    def default_model(self) -> str: ...

    async def chat(self, request: ChatRequest) -> ChatResult: ...

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Yields ``TextDelta``/``ToolCallDelta`` as they arrive, then one ``Completed``."""
        ...
