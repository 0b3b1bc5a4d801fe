"""``Agent``: the bounded tool-calling loop behind ``POST /ask``.

Each hop sends the conversation plus the tool schemas to the model. A reply with tool calls
runs them concurrently through the ``ToolExecutor`` (errors come back to the model as tool results,
never raised), appends the results and goes round again; a final reply is classified
(answered / idk / declined), its citation markers are validated against the chunks
``search_docs`` returned, and invented markers are stripped. At most ``MAX_TOOL_HOPS`` model
calls: a model still asking for tools after that gets the IDK marker and
``tool_loop_exhausted``. Provider failures (after the client's retries) end the run with
``provider_error`` and a clean message; nothing is raised to the caller.

``stream`` yields ``tool`` events as tools finish, ``token`` events as text arrives (through
``CitationStreamFilter``, so an invented marker is never sent), ``citation`` events for each
valid marker, then one ``done`` event carrying the full ``AgentAnswer``. ``answer`` runs the
same loop with non-streaming model calls. The ``done`` answer is authoritative: a model that
writes a preamble before calling tools ("Let me check.") has that preamble streamed as tokens,
but only the final hop's text is the answer.

Plain async Python: no Ray, no FastAPI.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import Literal

from opentelemetry import context as otel_context
from opentelemetry.trace import Span

from agent.answer import (
    AgentAnswer,
    AgentError,
    AgentEvent,
    CitationEvent,
    CitationOut,
    CostOut,
    Decision,
    DoneEvent,
    HopUsageOut,
    RetrievalOut,
    TokenEvent,
    ToolCallTrace,
    ToolEvent,
    UsageOut,
)
from agent.citations import (
    ChunkInfo,
    Citation,
    CitationStreamFilter,
    extract_citations,
    snippet,
)
from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    LLMClient,
    LLMError,
    MalformedReply,
    Message,
    ProviderRejected,
    TextDelta,
    ToolCall,
)
from agent.payloads import message_payload, reply_payload
from agent.prompts import (
    DECLINE_TEXT,
    IDK_MARKER,
    Mode,
    SystemPrompt,
    is_idk,
    is_refusal,
    load_system_prompt,
)
from agent.tools.base import ChunkSink
from agent.tools.executor import ToolExecutor, ToolRequest
from agent.tools.registry import ToolOutcome
from agent.usage import HopUsage, PriceTable, RunUsage, default_price_table
from foundation.identity import AuthUser
from foundation.observability import attributes as attr
from foundation.observability.attributes import provider_name
from foundation.observability.spans import Observer, in_span, set_attributes, to_json
from foundation.tracing import inject, request_context, trace_id_of

__all__ = ["Agent", "AgentAnswer", "AgentConfig", "AgentEvent"]

log = logging.getLogger(__name__)

PROVIDER_UNAVAILABLE_TEXT = (
    "The assistant is temporarily unavailable: the language model did not respond. "
    "Please try again in a moment."
)
PROVIDER_REJECTED_TEXT = (
    "The assistant could not get an answer from the language model. Please try again later."
)
MALFORMED_TEXT = "The assistant could not understand the language model's reply. Please try again."
MAX_MALFORMED_REPLIES = 2  # consecutive unusable replies before giving up (provider_error)


def _retry_note(error: MalformedReply) -> str:
    return (
        f"Your previous reply could not be used: {error}. "
        "Reply again, following the required format exactly."
    )


@dataclass
class _Run:
    """The mutable state of one question."""

    request: ToolRequest
    model: str
    usage: RunUsage
    messages: list[Message] = field(default_factory=list)
    traces: list[ToolCallTrace] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    malformed: int = 0
    seen_chunks: ChunkSink = field(default_factory=ChunkSink)
    trace_id: str | None = None

    def retrieved(self) -> dict[str, ChunkInfo]:
        return {
            hit.chunk_id: ChunkInfo(hit.source, hit.section, hit.text) for hit in self.seen_chunks
        }


def _citation_out(citation: Citation) -> CitationOut:
    return CitationOut(
        chunk_id=citation.chunk_id,
        source=citation.source,
        section=citation.section,
        snippet=citation.snippet,
    )


def _trace(outcome: ToolOutcome) -> ToolCallTrace:
    return ToolCallTrace(
        name=outcome.name,
        arguments=outcome.arguments,
        ok=outcome.ok,
        error=outcome.error,
        duration_ms=outcome.duration_ms,
    )


@dataclass(frozen=True)
class AgentConfig:
    """What the loop needs from the service's settings (the composition root builds it)."""

    max_tool_hops: int = 6
    observe_payloads: bool = False
    temperature: float | None = None  # as sent by the client; recorded on spans
    max_output_tokens: int | None = None
    provider_url: str = ""  # names the provider on spans when the client has no base_url


class Agent:
    """The agent core. Build one per process; ``answer``/``stream`` are safe to run
    concurrently (all per-request state lives in the run). Tools run through a
    ``ToolExecutor`` (in-process, or a Serve handle: see ``serve_app.wiring``)."""

    def __init__(
        self,
        *,
        llm: LLMClient,
        tools: ToolExecutor,
        config: AgentConfig | None = None,
        prompt: SystemPrompt | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.llm = llm
        self.tools = tools
        self.config = config or AgentConfig()
        self.prompt = prompt or load_system_prompt()
        # One source of truth for the tool-calling mode: the client that speaks it.
        self.mode: Mode = getattr(llm, "tool_calling_mode", "native")
        self.prices = prices or default_price_table()
        self.max_hops = self.config.max_tool_hops
        self.observer = Observer(payloads=self.config.observe_payloads)
        self.provider = provider_name(getattr(llm, "base_url", "") or self.config.provider_url)

    # --- public API ---------------------------------------------------------------------------

    async def answer(
        self,
        question: str,
        user: AuthUser,
        *,
        model: str | None = None,
        top_k: int | None = None,
    ) -> AgentAnswer:
        """Run the loop to completion (non-streaming model calls)."""
        done: AgentAnswer | None = None
        events = self._run(question, user, model=model, top_k=top_k, streaming=False)
        async with aclosing(events):
            async for event in events:
                if isinstance(event, DoneEvent):
                    done = event.response
        if done is None:  # pragma: no cover - every path ends with a done event
            raise RuntimeError("the agent loop ended without a done event")
        return done

    async def stream(
        self,
        question: str,
        user: AuthUser,
        *,
        model: str | None = None,
        top_k: int | None = None,
    ) -> AsyncIterator[AgentEvent]:
        """Run the loop, yielding tool/token/citation events and finally one done event.
        Closing the stream early (``aclose``, a client disconnect) cancels running tools."""
        events = self._run(question, user, model=model, top_k=top_k, streaming=True)
        async with aclosing(events):
            async for event in events:
                yield event

    # --- the loop -----------------------------------------------------------------------------

    async def _run(
        self,
        question: str,
        user: AuthUser,
        *,
        model: str | None,
        top_k: int | None,
        streaming: bool,
    ) -> AsyncGenerator[AgentEvent, None]:
        """The loop inside its ``agent.answer`` span (opened and ended here, never attached
        across a yield: the consumer may resume or close this generator from another task)."""
        parent = request_context(user.sub)
        root = self._start_root(parent, question, model or self.llm.default_model, streaming)
        done: AgentAnswer | None = None
        try:
            events = self._loop(
                question,
                user,
                model=model,
                top_k=top_k,
                streaming=streaming,
                root=in_span(root, parent),
            )
            async with aclosing(events):
                async for event in events:
                    if isinstance(event, DoneEvent):
                        done = event.response
                    yield event
        except (GeneratorExit, asyncio.CancelledError):
            root.set_attribute(attr.AGENT_CANCELLED, True)
            raise
        except Exception as exc:  # pragma: no cover - the loop turns failures into answers
            self.observer.fail(root, "internal_error", message=str(exc), exception=exc)
            raise
        finally:
            self._end_root(root, question, done)

    def _start_root(
        self, parent: otel_context.Context, question: str, model: str, streaming: bool
    ) -> Span:
        # Attached for the start only: a fresh request's preset trace id is read from the
        # current context by the id generator (see foundation.tracing).
        token = otel_context.attach(parent)
        try:
            root = self.observer.start(
                "agent.answer",
                "agent",
                parent=parent,
                attributes={
                    attr.GEN_AI_OPERATION: "invoke_agent",
                    attr.GEN_AI_AGENT_NAME: attr.AGENT_NAME,
                    attr.GEN_AI_PROVIDER: self.provider,
                    attr.GEN_AI_REQUEST_MODEL: model,
                    attr.LANGFUSE_TRACE_NAME: "agent.answer",
                    attr.AGENT_STREAMING: streaming,
                    attr.AGENT_TOOL_CALLING_MODE: self.mode,
                },
            )
        finally:
            otel_context.detach(token)
        self.observer.payload(root, attr.LANGFUSE_INPUT, question)
        self.observer.payload(root, attr.LANGFUSE_TRACE_INPUT, question)
        return root

    def _end_root(self, root: Span, question: str, done: AgentAnswer | None) -> None:
        if done is not None:
            cost = (
                done.cost.provider_usd
                if done.cost.provider_usd is not None
                else (done.cost.estimated_usd)
            )
            set_attributes(
                root,
                {
                    attr.AGENT_DECISION: done.decision,
                    attr.AGENT_IDK: done.idk,
                    attr.AGENT_HOPS: len(done.usage.hops),
                    attr.AGENT_TOOL_CALLS: len(done.tool_calls),
                    attr.AGENT_CITATIONS: len(done.citations),
                    attr.AGENT_HALLUCINATED: len(done.retrieval.hallucinated_citations),
                    attr.GEN_AI_RESPONSE_MODEL: done.model,
                    attr.GEN_AI_INPUT_TOKENS: done.usage.input_tokens,
                    attr.GEN_AI_OUTPUT_TOKENS: done.usage.output_tokens,
                    attr.GEN_AI_COST: cost,
                },
            )
            self.observer.payload(root, attr.LANGFUSE_OUTPUT, done.answer)
            self.observer.payload(root, attr.LANGFUSE_TRACE_OUTPUT, done.answer)
            if done.error is not None:
                self.observer.fail(root, done.error.code, message=done.error.message)
        root.end()

    async def _loop(
        self,
        question: str,
        user: AuthUser,
        *,
        model: str | None,
        top_k: int | None,
        streaming: bool,
        root: otel_context.Context,
    ) -> AsyncGenerator[AgentEvent, None]:
        specs = self.tools.specs()
        run = _Run(
            request=ToolRequest(user=user, top_k=top_k),
            model=model or self.llm.default_model,
            usage=RunUsage(prices=self.prices),
            messages=[
                Message("system", self.prompt.render(self.mode, specs)),
                Message("user", question),
            ],
            trace_id=trace_id_of(root),
        )
        for hop in range(1, self.max_hops + 1):
            hop_span = self.observer.start(
                f"agent.hop.{hop}", "chain", parent=root, attributes={attr.AGENT_HOP: hop}
            )
            hop_ctx = in_span(hop_span, root)
            try:
                request = ChatRequest(messages=tuple(run.messages), tools=specs, model=model)
                retrieved = run.retrieved()
                stream_filter = CitationStreamFilter(valid_ids=frozenset(retrieved))
                result: ChatResult | None = None
                generation = self._start_generation(request, run.model, hop_ctx)
                try:
                    if streaming:
                        hop_events = self._stream_hop(request, stream_filter, retrieved)
                        async with aclosing(hop_events):
                            async for event in hop_events:
                                if isinstance(event, ChatResult):
                                    result = event
                                else:
                                    yield event
                    else:
                        result = await self.llm.chat(request)
                except MalformedReply as exc:
                    self._end_generation(generation, None, None, error=exc)
                    run.malformed += 1
                    log.warning("hop %d: malformed reply (%d): %s", hop, run.malformed, exc)
                    if run.malformed >= MAX_MALFORMED_REPLIES:
                        yield self._provider_error(run, exc)
                        return
                    run.messages.append(Message("user", _retry_note(exc)))
                    continue
                except LLMError as exc:
                    self._end_generation(generation, None, None, error=exc)
                    log.warning("hop %d: provider error: %s", hop, exc)
                    yield self._provider_error(run, exc)
                    return
                except BaseException:
                    generation.end()
                    raise
                if result is None:  # pragma: no cover - the client contract ends with Completed
                    generation.end()
                    yield self._provider_error(run, MalformedReply("the reply stream ended early"))
                    return
                run.malformed = 0
                run.model = result.model or run.model
                recorded = run.usage.record(result.usage, run.model, hop=hop)
                self._end_generation(generation, result, recorded)

                if result.kind == "tool_calls" and result.tool_calls:
                    if hop == self.max_hops:
                        names = ", ".join(call.name for call in result.tool_calls)
                        run.notes.append(
                            f"tool loop exhausted after {hop} model calls; "
                            f"the model still asked for: {names}"
                        )
                        break
                    run.messages.append(
                        Message("assistant", result.text, tool_calls=tuple(result.tool_calls))
                    )
                    tool_events = self._run_tools(run, result.tool_calls, hop_ctx)
                    async with aclosing(tool_events):
                        async for tool_event in tool_events:
                            yield tool_event
                    continue

                async for event in self._finish(run, result, streaming):
                    yield event
                return
            finally:
                hop_span.end()

        text = IDK_MARKER
        if streaming:
            yield TokenEvent(text=text)
        yield DoneEvent(response=self._response(run, text, "tool_loop_exhausted", idk=True))

    def _start_generation(
        self, request: ChatRequest, model: str, parent: otel_context.Context
    ) -> Span:
        span = self.observer.start(
            f"gen_ai.chat {request.model or model}",
            "generation",
            parent=parent,
            attributes={
                attr.GEN_AI_OPERATION: "chat",
                attr.GEN_AI_PROVIDER: self.provider,
                attr.GEN_AI_REQUEST_MODEL: request.model or model,
                attr.GEN_AI_REQUEST_TEMPERATURE: self.config.temperature,
                attr.GEN_AI_REQUEST_MAX_TOKENS: self.config.max_output_tokens,
                attr.AGENT_TOOLS_OFFERED: len(request.tools),
            },
        )
        if self.observer.payloads and span.is_recording():
            messages = [message_payload(m) for m in request.messages]
            self.observer.payload(span, attr.GEN_AI_INPUT_MESSAGES, messages)
            self.observer.payload(span, attr.LANGFUSE_INPUT, messages)
        return span

    def _end_generation(
        self,
        span: Span,
        result: ChatResult | None,
        usage: HopUsage | None,
        *,
        error: LLMError | None = None,
    ) -> None:
        if error is not None:
            kind = "malformed_reply" if isinstance(error, MalformedReply) else "provider_error"
            self.observer.fail(span, kind, message=str(error), exception=error)
            set_attributes(span, {attr.GEN_AI_ERROR_STATUS: error.status_code})
        if result is not None:
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
            if usage is not None:
                cost = usage.provider_usd if usage.provider_usd is not None else usage.estimated_usd
                if cost is not None:
                    span.set_attribute(attr.GEN_AI_COST, cost)
                    span.set_attribute(attr.LANGFUSE_COST_DETAILS, to_json({"total": cost}))
            if self.observer.payloads and span.is_recording():
                output = reply_payload(result)
                self.observer.payload(span, attr.GEN_AI_OUTPUT_MESSAGES, [output])
                self.observer.payload(span, attr.LANGFUSE_OUTPUT, output)
        span.end()

    async def _stream_hop(
        self,
        request: ChatRequest,
        stream_filter: CitationStreamFilter,
        retrieved: dict[str, ChunkInfo],
    ) -> AsyncGenerator[AgentEvent | ChatResult, None]:
        """One streamed model call: filtered tokens and citations as they arrive, then the
        finished ``ChatResult``."""

        def citation_events() -> list[AgentEvent]:
            events: list[AgentEvent] = []
            for chunk_id in stream_filter.pop_citations():
                chunk = retrieved[chunk_id]
                citation = Citation(chunk_id, chunk.source, chunk.section, snippet(chunk.text))
                events.append(CitationEvent(citation=_citation_out(citation)))
            return events

        source = self.llm.stream(request)
        try:
            async for event in source:
                if isinstance(event, TextDelta):
                    text = stream_filter.feed(event.text)
                    if text:
                        yield TokenEvent(text=text)
                    for citation_event in citation_events():
                        yield citation_event
                elif isinstance(event, Completed):
                    tail = stream_filter.flush()
                    if tail:
                        yield TokenEvent(text=tail)
                    for citation_event in citation_events():
                        yield citation_event
                    yield event.result
                    return
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with suppress(Exception):
                    await aclose()

    async def _run_tools(
        self,
        run: _Run,
        calls: tuple[ToolCall, ...] | list[ToolCall],
        hop: otel_context.Context,
    ) -> AsyncGenerator[AgentEvent, None]:
        """Run one hop's tool calls concurrently; yield a tool event as each finishes;
        append the results to the conversation in call order. Each call carries the hop's
        trace context, so its ``tool.<name>`` span (opened where it runs) is the hop's child."""
        request = dataclasses.replace(run.request, trace_context=inject(hop))
        tasks = [
            asyncio.create_task(self.tools.execute(call, request), name=f"tool:{call.name}")
            for call in calls
        ]
        try:
            for finished in asyncio.as_completed(tasks):
                outcome = await finished
                yield ToolEvent(call=_trace(outcome))
        finally:
            pending = [task for task in tasks if not task.done()]
            for task in pending:
                task.cancel()
            if pending:  # the stream was closed early: wait for the cancellations to land
                await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:
            outcome = task.result()
            run.seen_chunks.add(outcome.chunks)
            run.traces.append(_trace(outcome))
            run.messages.append(
                Message(
                    "tool", outcome.result_json, tool_call_id=outcome.call_id, name=outcome.name
                )
            )

    async def _finish(
        self,
        run: _Run,
        result: ChatResult,
        streaming: bool,
    ) -> AsyncIterator[AgentEvent]:
        """Classify the final reply, validate its citations, yield the done event."""
        if result.kind == "decline":
            if streaming:
                yield TokenEvent(text=DECLINE_TEXT)
            yield DoneEvent(response=self._declined(run, DECLINE_TEXT, result))
            return
        if result.kind == "idk":
            if streaming:
                yield TokenEvent(text=IDK_MARKER)
            yield DoneEvent(response=self._response(run, IDK_MARKER, "idk", idk=True))
            return

        raw = (result.text or "").strip()
        if not raw:
            if streaming:
                yield TokenEvent(text=IDK_MARKER)
            run.notes.append("the model returned an empty answer")
            yield DoneEvent(response=self._response(run, IDK_MARKER, "idk", idk=True))
            return
        checked = extract_citations(result.text or "", run.retrieved())
        answer = checked.answer.strip()
        citations = [_citation_out(c) for c in checked.citations]
        if is_refusal(answer):
            yield DoneEvent(response=self._declined(run, answer, result))
            return
        decision: Decision = "idk" if is_idk(answer) else "answered"
        yield DoneEvent(
            response=self._response(
                run,
                answer,
                decision,
                idk=decision == "idk",
                citations=citations,
                hallucinated=checked.hallucinated,
            )
        )

    # --- building the response ----------------------------------------------------------------

    def _declined(self, run: _Run, text: str, result: ChatResult) -> AgentAnswer:
        if run.traces:
            run.notes.append(f"declined after {len(run.traces)} tool call(s)")
        if result.reason:
            run.notes.append(f"model reason: {result.reason[:200]}")
        return self._response(run, text, "declined_out_of_scope")

    def _provider_error(self, run: _Run, error: LLMError) -> DoneEvent:
        code: Literal["provider_unavailable", "provider_rejected", "malformed_reply"]
        if isinstance(error, MalformedReply):
            code, text = "malformed_reply", MALFORMED_TEXT
        elif isinstance(error, ProviderRejected):
            code, text = "provider_rejected", PROVIDER_REJECTED_TEXT
        else:
            code, text = "provider_unavailable", PROVIDER_UNAVAILABLE_TEXT
        response = self._response(run, text, "provider_error")
        response.error = AgentError(code=code, message=str(error), status_code=error.status_code)
        return DoneEvent(response=response)

    def _response(
        self,
        run: _Run,
        text: str,
        decision: Decision,
        *,
        idk: bool = False,
        citations: list[CitationOut] | None = None,
        hallucinated: list[str] | None = None,
    ) -> AgentAnswer:
        usage = run.usage.usage_dict()
        cost = run.usage.cost_dict()
        chunk_ids = [hit.chunk_id for hit in run.seen_chunks]
        return AgentAnswer(
            answer=text,
            citations=citations or [],
            tool_calls=list(run.traces),
            usage=UsageOut(
                input_tokens=usage["input_tokens"],
                output_tokens=usage["output_tokens"],
                hops=[HopUsageOut(**hop) for hop in usage["hops"]],
            ),
            cost=CostOut(estimated_usd=cost["estimated_usd"], provider_usd=cost["provider_usd"]),
            idk=idk,
            decision=decision,
            retrieval=RetrievalOut(
                hallucinated_citations=hallucinated or [],
                chunks_seen=len(chunk_ids),
                chunk_ids=chunk_ids,
            ),
            model=run.model,
            trace_id=run.trace_id,
            notes=list(run.notes),
        )
