"""Tracing for the agent loop, kept out of it (as pydantic-ai's ``InstrumentedModel`` wraps a
``Model``): ``InstrumentedLLM`` opens the ``gen_ai.chat <model>`` span around each model call,
``RunTrace`` owns one run's ``agent.answer`` span and its ``agent.hop.N`` children. (The
``tool.<name>`` spans are opened where the tools run: ``agent.tools.instrumented``.)

Spans are opened against explicit parent contexts and ended explicitly, never attached across
a ``yield``: the loop is an async generator whose consumer may resume or close it from another
task, and a context token attached in one task cannot be detached in another. So a model
call's parent travels in a context variable set around the call alone (``model_call``), and
``InstrumentedLLM`` keeps the port's exact signature.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry.trace import Span

from agent.answer import AgentAnswer, AgentEvent, DoneEvent
from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    LLMClient,
    LLMError,
    MalformedReply,
    StreamEvent,
)
from agent.payloads import message_payload, reply_payload
from agent.usage import PriceTable
from foundation.observability import attributes as attr
from foundation.observability.spans import Observer, in_span, set_attributes, to_json
from foundation.tracing import request_context, trace_id_of

__all__ = ["InstrumentedLLM", "RunTrace", "model_call"]


@dataclass(frozen=True)
class _CallScope:
    parent: otel_context.Context | None
    fallback_model: str | None


_SCOPE: ContextVar[_CallScope | None] = ContextVar("agent_model_call", default=None)


@contextmanager
def model_call(
    parent: otel_context.Context | None, fallback_model: str | None = None
) -> Iterator[None]:
    """The scope of the model calls made (``chat``) or started (``stream``) inside it:
    ``parent`` is their span's parent context; ``fallback_model`` the model the caller
    believes it is talking to (it names the span when the request leaves the model to the
    client, and prices a reply that does not name its model). Hold it around the call
    alone, never across a ``yield``."""
    token = _SCOPE.set(_CallScope(parent, fallback_model))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def _scope() -> _CallScope:
    return _SCOPE.get() or _CallScope(None, None)


class InstrumentedLLM:
    """An ``LLMClient`` whose ``chat``/``stream`` run inside a ``gen_ai.chat <model>`` span
    (request, reply, usage, cost and errors; messages only with payloads on), with the port's
    own signature. The span's parent and the fallback model come from ``model_call`` (the
    agent holds it around each call; default: the current context, and the request's model,
    else the client's ``default_model``)."""

    def __init__(
        self,
        inner: LLMClient,
        *,
        observer: Observer,
        provider: str,
        prices: PriceTable,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
    ) -> None:
        self.inner = inner
        self.observer = observer
        self.provider = provider
        self.prices = prices
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens

    @property
    def default_model(self) -> str:
        return self.inner.default_model

    async def chat(self, request: ChatRequest) -> ChatResult:
        scope = _scope()
        model = request.model or scope.fallback_model or self.default_model
        span = self._start(request, model, scope.parent)
        try:
            result = await self.inner.chat(request)
            self._record(span, result, scope.fallback_model or model)
            return result
        except LLMError as exc:
            self._fail(span, exc)
            raise
        finally:
            span.end()

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """The inner stream's events; the span ends at ``Completed`` (or when the stream
        fails, ends early or is closed). The ``model_call`` scope is read here, when the
        stream is made, not when it is first iterated."""
        return self._stream(request, _scope())

    async def _stream(
        self, request: ChatRequest, scope: _CallScope
    ) -> AsyncGenerator[StreamEvent, None]:
        fallback_model = scope.fallback_model
        model = request.model or fallback_model or self.default_model
        span = self._start(request, model, scope.parent)
        ended = False
        source = self.inner.stream(request)
        try:
            async for event in source:
                if isinstance(event, Completed):
                    self._record(span, event.result, fallback_model or model)
                    span.end()
                    ended = True
                yield event
        except LLMError as exc:
            if not ended:
                self._fail(span, exc)
            raise
        finally:
            if not ended:
                span.end()
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with suppress(Exception):
                    await aclose()

    def _start(self, request: ChatRequest, model: str, parent: otel_context.Context | None) -> Span:
        span = self.observer.start(
            f"gen_ai.chat {model}",
            "generation",
            parent=parent,
            attributes={
                attr.GEN_AI_OPERATION: "chat",
                attr.GEN_AI_PROVIDER: self.provider,
                attr.GEN_AI_REQUEST_MODEL: model,
                attr.GEN_AI_REQUEST_TEMPERATURE: self.temperature,
                attr.GEN_AI_REQUEST_MAX_TOKENS: self.max_output_tokens,
                attr.AGENT_TOOLS_OFFERED: len(request.tools),
            },
        )
        if self.observer.payloads and span.is_recording():
            messages = [message_payload(m) for m in request.messages]
            self.observer.payload(span, attr.GEN_AI_INPUT_MESSAGES, messages)
            self.observer.payload(span, attr.LANGFUSE_INPUT, messages)
        return span

    def _record(self, span: Span, result: ChatResult, priced_as: str) -> None:
        set_attributes(
            span,
            {
                attr.GEN_AI_RESPONSE_MODEL: result.model or None,
                attr.LANGFUSE_MODEL: result.model or None,
                attr.GEN_AI_FINISH_REASONS: (
                    [result.finish_reason] if result.finish_reason else None
                ),
                attr.GEN_AI_REPLY_KIND: result.kind,
                attr.GEN_AI_INPUT_TOKENS: result.usage.input_tokens,
                attr.GEN_AI_OUTPUT_TOKENS: result.usage.output_tokens,
            },
        )
        # The same rule as the run's usage record: the provider's cost, else the list price
        # of the model that answered.
        cost = result.usage.provider_cost_usd
        if cost is None:
            cost = self.prices.estimate(result.model or priced_as, result.usage)
        if cost is not None:
            span.set_attribute(attr.GEN_AI_COST, cost)
            span.set_attribute(attr.LANGFUSE_COST_DETAILS, to_json({"total": cost}))
        if self.observer.payloads and span.is_recording():
            output = reply_payload(result)
            self.observer.payload(span, attr.GEN_AI_OUTPUT_MESSAGES, [output])
            self.observer.payload(span, attr.LANGFUSE_OUTPUT, output)

    def _fail(self, span: Span, error: LLMError) -> None:
        kind = "malformed_reply" if isinstance(error, MalformedReply) else "provider_error"
        self.observer.fail(span, kind, message=str(error), exception=error)
        set_attributes(span, {attr.GEN_AI_ERROR_STATUS: error.status_code})


class RunTrace:
    """One run's ``agent.answer`` span (``context`` is the parent for its children), its
    ``agent.hop.N`` spans, and what the finished answer records on it."""

    def __init__(self, observer: Observer, root: Span, context: otel_context.Context) -> None:
        self.observer = observer
        self.root = root
        self.context = context

    @classmethod
    def start(
        cls,
        observer: Observer,
        *,
        question: str,
        user_id: str | None,
        provider: str,
        model: str,
        streaming: bool,
        mode: str,
    ) -> RunTrace:
        """Open ``agent.answer`` under the request's context."""
        parent = request_context(user_id)
        # Attached for the start only: a fresh request's preset trace id is read from the
        # current context by the id generator (see foundation.tracing).
        token = otel_context.attach(parent)
        try:
            root = observer.start(
                "agent.answer",
                "agent",
                parent=parent,
                attributes={
                    attr.GEN_AI_OPERATION: "invoke_agent",
                    attr.GEN_AI_AGENT_NAME: attr.AGENT_NAME,
                    attr.GEN_AI_PROVIDER: provider,
                    attr.GEN_AI_REQUEST_MODEL: model,
                    attr.LANGFUSE_TRACE_NAME: "agent.answer",
                    attr.AGENT_STREAMING: streaming,
                    attr.AGENT_TOOL_CALLING_MODE: mode,
                },
            )
        finally:
            otel_context.detach(token)
        observer.payload(root, attr.LANGFUSE_INPUT, question)
        observer.payload(root, attr.LANGFUSE_TRACE_INPUT, question)
        return cls(observer, root, in_span(root, parent))

    @property
    def trace_id(self) -> str | None:
        return trace_id_of(self.context)

    @contextmanager
    def hop(self, number: int) -> Iterator[otel_context.Context]:
        """The ``agent.hop.N`` span, as the context its model call and tools run under. Never
        attached, so it may stay open across the loop's yields."""
        span = self.observer.start(
            f"agent.hop.{number}", "chain", parent=self.context, attributes={attr.AGENT_HOP: number}
        )
        try:
            yield in_span(span, self.context)
        finally:
            span.end()

    async def observe(
        self, events: AsyncGenerator[AgentEvent, None]
    ) -> AsyncGenerator[AgentEvent, None]:
        """Pass the run's events through; end the root span with the done answer, a
        cancellation (the stream was closed) or the failure."""
        done: AgentAnswer | None = None
        try:
            async with aclosing(events):
                async for event in events:
                    if isinstance(event, DoneEvent):
                        done = event.response
                    yield event
        except (GeneratorExit, asyncio.CancelledError):
            self.root.set_attribute(attr.AGENT_CANCELLED, True)
            raise
        except Exception as exc:  # pragma: no cover - the loop turns failures into answers
            self.observer.fail(self.root, "internal_error", message=str(exc), exception=exc)
            raise
        finally:
            self._end(done)

    def _end(self, done: AgentAnswer | None) -> None:
        if done is not None:
            self._record(done)
        self.root.end()

    def _record(self, done: AgentAnswer) -> None:
        cost = done.cost.provider_usd
        set_attributes(
            self.root,
            {
                attr.AGENT_DECISION: done.decision,
                attr.AGENT_IDK: done.idk,
                attr.AGENT_HOPS: len(done.usage.hops),
                attr.AGENT_TOOL_CALLS: len(done.tool_calls),
                attr.AGENT_CITATIONS: len(done.citations),
                attr.AGENT_HALLUCINATED: len(done.retrieval.hallucinated_citations),
                attr.AGENT_UNGROUNDED: len(done.retrieval.ungrounded),
                attr.GEN_AI_RESPONSE_MODEL: done.model,
                attr.GEN_AI_INPUT_TOKENS: done.usage.input_tokens,
                attr.GEN_AI_OUTPUT_TOKENS: done.usage.output_tokens,
                attr.GEN_AI_COST: cost if cost is not None else done.cost.estimated_usd,
            },
        )
        self.observer.payload(self.root, attr.LANGFUSE_OUTPUT, done.answer)
        self.observer.payload(self.root, attr.LANGFUSE_TRACE_OUTPUT, done.answer)
        if done.error is not None:
            self.observer.fail(self.root, done.error.code, message=done.error.message)
