"""``Agent``: the bounded tool-calling loop behind ``POST /ask``.

Each hop sends the conversation plus the tool schemas to the model. A reply with tool calls
runs them concurrently through the ``ToolExecutor`` (errors come back to the model as tool results,
never raised), appends the results and goes round again; a final reply is classified
(answered / idk / declined), its citation markers are validated against the chunks
``search_docs`` returned, and invented markers are stripped. At most ``MAX_TOOL_HOPS`` model
calls: a model still asking for tools after that gets the IDK marker and
``tool_loop_exhausted`` (so does a model asking for tools past ``max_tool_calls`` tool calls
or ``max_total_tokens`` tokens in all). Provider failures (after the client's retries) end the
run with ``provider_error`` and a clean message; nothing is raised to the caller.

``stream`` yields ``progress`` events (``started`` first; each model call, a ``waiting``
heartbeat while it has sent nothing yet, each tool as it starts), ``tool`` events as tools
finish, ``token`` events as text arrives (through ``CitationStreamFilter``, so an invented
marker is never sent), ``citation`` events for each valid marker, then one ``done`` event
carrying the full ``AgentAnswer``. ``answer`` runs the same loop with non-streaming model
calls. The ``done`` answer is authoritative: a model that
writes a preamble before calling tools ("Let me check.") has that preamble streamed as tokens,
but only the final hop's text is the answer.

Tracing stays out of the loop (``agent.instrumented``): the model is called through an
``InstrumentedLLM`` and each run through a ``RunTrace``. Plain async Python: no Ray, no FastAPI.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass

from opentelemetry import context as otel_context

from agent.answer import (
    AgentAnswer,
    AgentEvent,
    CitationEvent,
    Decision,
    DoneEvent,
    ProgressEvent,
    TokenEvent,
    ToolEvent,
)
from agent.citations import (
    Citation,
    CitationStreamFilter,
    extract_citations,
    snippet,
)
from agent.finishing import Finisher
from agent.followups import (
    DeterministicRewriter,
    PriorTurn,
    QueryRewriter,
    prior_turns_from_history,
)
from agent.grounding import ungrounded
from agent.instrumented import InstrumentedLLM, RunTrace
from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    LLMClient,
    LLMError,
    MalformedReply,
    Message,
    TextDelta,
    ToolCall,
    ToolSpec,
)
from agent.planning import Plan, Planner, hop_request, offered_tools
from agent.progress import DEFAULT_HEARTBEAT_SECONDS, prepend, tool_started, with_heartbeat
from agent.prompts import (
    IDK_MARKER,
    Mode,
    SystemPrompt,
    is_idk,
    load_system_prompt,
)
from agent.routing import Route
from agent.run_state import Run, citation_out, tool_trace
from agent.tools.executor import ToolExecutor, ToolRequest
from agent.usage import PriceTable, RunUsage, default_price_table
from foundation.identity import AuthUser
from foundation.observability.attributes import provider_name
from foundation.observability.spans import Observer
from foundation.tracing import inject

__all__ = ["Agent", "AgentAnswer", "AgentConfig", "AgentEvent"]

log = logging.getLogger(__name__)

MAX_MALFORMED_REPLIES = 2  # consecutive unusable replies before giving up (provider_error)

# What one model call gives the hop: events to pass on, then the reply or the provider error.
_Reply = AgentEvent | ChatResult | LLMError


def _retry_note(error: MalformedReply) -> str:
    return (
        f"Your previous reply could not be used: {error}. "
        "Reply again, following the required format exactly."
    )


@dataclass(frozen=True)
class AgentConfig:
    """What the loop needs from the service's settings (the composition root builds it)."""

    max_tool_hops: int = 6
    # Per-request caps beyond the hops (MAX_TOOL_CALLS_PER_ASK, MAX_TOKENS_PER_ASK): tool
    # calls in all (the plan's included), input + output tokens of every model call. A model
    # asking for tools past one ends the run as ``tool_loop_exhausted``. None: no cap.
    max_tool_calls: int | None = 24
    max_total_tokens: int | None = None
    observe_payloads: bool = False
    temperature: float | None = None  # as sent by the client; recorded on spans
    max_output_tokens: int | None = None
    provider_url: str = ""  # names the provider on spans when the client has no base_url
    # Route, ground entities and fetch documentation before the first model call
    # (agent.planning). None: in json_schema mode only (small local models).
    plan_first: bool | None = None
    # Where the plan settles the answer (a live-data measurement, a not-found, a greeting),
    # the service writes it from the tool results instead of calling the model (agent.composing).
    compose_answers: bool = True
    # An ungrounded answer gets one repair call (True) or becomes IDK at once (False).
    # None: no repair where the loop plans first (small models did not repair; see
    # GROUNDING_REPAIR), a repair elsewhere.
    repair_ungrounded: bool | None = None
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS  # between ``waiting`` events


class Agent:
    """The agent core. Build one per process; ``answer``/``stream`` are safe to run
    concurrently (all per-request state lives in the run). Tools run through a
    ``ToolExecutor`` (in-process, or a Serve handle: see ``serve_app.wiring``). The model is
    traced through an ``InstrumentedLLM`` wrapped around ``llm`` (unless it already is one)."""

    def __init__(
        self,
        *,
        llm: LLMClient,
        tools: ToolExecutor,
        config: AgentConfig | None = None,
        prompt: SystemPrompt | None = None,
        prices: PriceTable | None = None,
        rewriter: QueryRewriter | None = None,
    ) -> None:
        self.llm = llm
        self.tools = tools
        # Follow-ups become standalone queries for the plan's search and entity resolution.
        self.rewriter: QueryRewriter = rewriter or DeterministicRewriter()
        self.config = config or AgentConfig()
        self.prompt = prompt or load_system_prompt()
        client = llm.inner if isinstance(llm, InstrumentedLLM) else llm
        # One source of truth for the tool-calling mode: the client that speaks it.
        self.mode: Mode = getattr(client, "tool_calling_mode", "native")
        self.prices = prices or default_price_table()
        self.max_hops = self.config.max_tool_hops
        self.observer = Observer(payloads=self.config.observe_payloads)
        self.provider = provider_name(getattr(client, "base_url", "") or self.config.provider_url)
        self.traced_llm = (
            llm
            if isinstance(llm, InstrumentedLLM)
            else InstrumentedLLM(
                llm,
                observer=self.observer,
                provider=self.provider,
                prices=self.prices,
                temperature=self.config.temperature,
                max_output_tokens=self.config.max_output_tokens,
            )
        )
        repair = self.config.repair_ungrounded
        self.finisher = Finisher(
            self.traced_llm, repair=not self.plans_first if repair is None else repair
        )

    # --- public API ---------------------------------------------------------------------------

    async def warm_up(self) -> bool:
        """Read the static prompt prefixes (the whole system prompt with its tool list and
        examples, and the short answer prompts of the routes searched up front) into the
        model server's prompt cache with a one-token reply each, so the first question does
        not pay for them (about 1,600, 470 and 860 tokens: ~45 s on two cores). Only
        where the loop plans first (the local model in ``json_schema`` mode): a provider
        that bills prompt tokens is not called. False when skipped or when the model did
        not answer."""
        if not self.plans_first:
            return False
        specs = self.tools.specs()
        # The whole prompt first (a question asked while the warm-up runs most likely needs
        # it), then the answer prompts of the documentation and "both" routes; the server's
        # prompt cache keeps every prefix.
        routes: tuple[Route, ...] = ("live_data", "documentation", "both")
        for prompt in dict.fromkeys(self._system_prompt(route, specs) for route in routes):
            system = Message("system", prompt)
            request = ChatRequest(messages=(system, Message("user", "Hello!")), max_output_tokens=1)
            try:
                await self.llm.chat(request)
            except MalformedReply:
                pass  # one token is never a whole step; the prefix is cached all the same
            except LLMError as exc:
                log.info("prompt warm-up: the model did not answer (%s)", exc)
                return False
        return True

    async def answer(
        self,
        question: str,
        user: AuthUser,
        *,
        model: str | None = None,
        top_k: int | None = None,
        history: Sequence[Message] = (),
        earlier: Sequence[PriorTurn] = (),
    ) -> AgentAnswer:
        """Run the loop to completion (non-streaming model calls). ``history``: earlier
        turns of the conversation, ``user`` and ``assistant`` text messages oldest first,
        sent between the system prompt and the question as they are (the caller fits them
        to its token budget: ``serve_app.history``). ``earlier``: the caller's earlier
        turns as the follow-up rewriter reads them (``agent.followups``; not sent to the
        model); empty: read back from ``history``."""
        done: AgentAnswer | None = None
        events = self._run(
            question,
            user,
            model=model,
            top_k=top_k,
            streaming=False,
            history=history,
            earlier=earlier,
        )
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
        history: Sequence[Message] = (),
        earlier: Sequence[PriorTurn] = (),
    ) -> AsyncIterator[AgentEvent]:
        """Run the loop, yielding tool/token/citation events and finally one done event.
        Closing the stream early (``aclose``, a client disconnect) cancels running tools.
        ``history`` and ``earlier`` as for ``answer``."""
        events = self._run(
            question,
            user,
            model=model,
            top_k=top_k,
            streaming=True,
            history=history,
            earlier=earlier,
        )
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
        history: Sequence[Message] = (),
        earlier: Sequence[PriorTurn] = (),
    ) -> AsyncGenerator[AgentEvent, None]:
        """The loop inside its run trace (``agent.answer``), started on the first event."""
        answering = model or self.llm.default_model
        trace = RunTrace.start(
            self.observer,
            question=question,
            user_id=user.sub,
            provider=self.provider,
            model=answering,
            streaming=streaming,
            mode=self.mode,
        )
        loop = self._loop(
            question,
            user,
            model=model,
            top_k=top_k,
            streaming=streaming,
            trace=trace,
            history=history,
            earlier=tuple(earlier) or prior_turns_from_history(history),
        )
        # ``started`` goes out before any work, so a caller hears back at once.
        events = trace.observe(prepend(ProgressEvent(stage="started", model=answering), loop))
        async with aclosing(events):
            async for event in events:
                yield event

    async def _loop(
        self,
        question: str,
        user: AuthUser,
        *,
        model: str | None,
        top_k: int | None,
        streaming: bool,
        trace: RunTrace,
        history: Sequence[Message] = (),
        earlier: Sequence[PriorTurn] = (),
    ) -> AsyncGenerator[AgentEvent, None]:
        specs = self.tools.specs()
        run = Run(
            request=ToolRequest(user=user, top_k=top_k),
            model=model or self.llm.default_model,
            usage=RunUsage(prices=self.prices),
            question=question,
            earlier_questions=tuple(m.content or "" for m in history if m.role == "user"),
            messages=[
                Message("system", self.prompt.render(self.mode, specs)),
                *history,  # after the system prompt: its prompt-cache prefix stays the same
                Message("user", question),
            ],
            trace_id=trace.trace_id,
        )
        plan: Plan | None = None
        if self.plans_first:
            planner = Planner(
                self.tools,
                compose=self.config.compose_answers,
                rewriter=self.rewriter,
                earlier=earlier,
            )
            async for item in planner.plan(run, question, specs):
                if isinstance(item, Plan):
                    plan = item
                else:
                    yield item
            if plan is not None and plan.rewrite is not None:
                trace.rewrite(plan.rewrite, self.rewriter.name)
            if plan is not None and plan.answer is not None:
                composed = self._composed(run, plan.answer, streaming)
                if composed:
                    for composed_event in composed:
                        yield composed_event
                    return
            if plan is not None and plan.decision.wants_docs:
                run.messages[0] = Message("system", self._system_prompt(plan.decision.route, specs))
        for hop in range(1, self.max_hops + 1):
            with trace.hop(hop) as hop_ctx:
                reply: ChatResult | LLMError | None = None
                request = hop_request(run, specs, plan, model)
                replies = self._call_model(run, request, streaming, hop, hop_ctx)
                async with aclosing(replies):
                    async for event in replies:
                        if isinstance(event, ChatResult | LLMError):
                            reply = event
                        else:
                            yield event
                if not isinstance(reply, ChatResult):
                    if isinstance(reply, MalformedReply) and self._retry_malformed(run, hop, reply):
                        continue
                    yield self._failed(run, hop, reply)
                    return
                run.malformed = 0
                run.model = reply.model or run.model
                run.usage.record(reply.usage, run.model, hop=hop)

                if reply.kind == "tool_calls" and reply.tool_calls:
                    limit = self._limit_reached(run, hop, reply.tool_calls)
                    if limit:
                        names = ", ".join(call.name for call in reply.tool_calls)
                        run.notes.append(f"{limit}; the model still asked for: {names}")
                        break
                    run.messages.append(
                        Message("assistant", reply.text, tool_calls=tuple(reply.tool_calls))
                    )
                    tool_events = self._run_tools(run, reply.tool_calls, hop_ctx)
                    async with aclosing(tool_events):
                        async for tool_event in tool_events:
                            yield tool_event
                    continue

                finish = self.finisher.finish(run, reply, streaming, request, trace, hop)
                async for event in finish:
                    yield event
                return

        text = IDK_MARKER
        if streaming:
            yield TokenEvent(text=text)
        yield DoneEvent(response=run.response(text, "tool_loop_exhausted", idk=True))

    @staticmethod
    def _composed(run: Run, text: str, streaming: bool) -> list[AgentEvent]:
        """The events of an answer the service wrote from the plan's tool results (its
        markers cite chunks the run retrieved), or none when a figure in it is not grounded
        or a marker names no such chunk (a composer bug: the model answers instead)."""
        missing = ungrounded(text, run.evidence())
        cited = extract_citations(text, run.retrieved())
        if missing or cited.hallucinated:
            why = "; ".join([*missing, *(f"no chunk {c}" for c in cited.hallucinated)])
            log.warning("composed answer not grounded (%s); asking the model", why)
            return []
        run.notes.append("answer composed by the service from the tool results (no model call)")
        idk = is_idk(text)
        citations = [citation_out(c) for c in cited.citations]
        decision: Decision = "idk" if idk else "answered"
        done = DoneEvent(response=run.response(text, decision, idk=idk, citations=citations))
        if not streaming:
            return [done]
        return [TokenEvent(text=text), *(CitationEvent(citation=c) for c in citations), done]

    def _system_prompt(self, route: Route, specs: Sequence[ToolSpec]) -> str:
        """The system message a planned route's model calls read (and the warm-up caches): a
        route the service searched up front (documentation, both) reads the short answer
        prompt for its tools, a cached prefix of its own, since the search is done and
        mostly the answer is left to the model; every other route the whole prompt."""
        if route in ("documentation", "both"):
            tools = offered_tools(route, specs)
            answer = self.prompt.render_answer(self.mode, tools, live=route == "both")
            if answer is not None:
                return answer
        return self.prompt.render(self.mode, specs)

    @property
    def plans_first(self) -> bool:
        """Whether runs start with the deterministic plan (``PLAN_FIRST``; auto: json_schema)."""
        plan_first = self.config.plan_first
        return self.mode == "json_schema" if plan_first is None else plan_first

    def _limit_reached(self, run: Run, hop: int, calls: Sequence[ToolCall]) -> str | None:
        """Why the run may not go on with ``calls`` (the hop, tool-call or token cap), or
        None. Checked before the calls run: what a cap forbids is never started."""
        config = self.config
        if hop == self.max_hops:
            return f"tool loop exhausted after {hop} model calls"
        made = len(run.traces)
        if config.max_tool_calls is not None and made + len(calls) > config.max_tool_calls:
            return f"tool-call limit reached ({made} of {config.max_tool_calls} made)"
        used = run.usage.input_tokens + run.usage.output_tokens
        if config.max_total_tokens is not None and used >= config.max_total_tokens:
            return f"token limit reached ({used} of {config.max_total_tokens} tokens used)"
        return None

    def _retry_malformed(self, run: Run, hop: int, error: MalformedReply) -> bool:
        """Count an unusable reply; True (with a note to the model) while another try is
        allowed, False once the run must give up."""
        run.malformed += 1
        log.warning("hop %d: malformed reply (%d): %s", hop, run.malformed, error)
        if run.malformed >= MAX_MALFORMED_REPLIES:
            return False
        run.messages.append(Message("user", _retry_note(error)))
        return True

    def _failed(self, run: Run, hop: int, error: LLMError | None) -> DoneEvent:
        if error is None:  # pragma: no cover - the client contract ends with Completed
            error = MalformedReply("the reply stream ended early")
        elif not isinstance(error, MalformedReply):
            log.warning("hop %d: provider error: %s", hop, error)
        return run.provider_error(error)

    async def _call_model(
        self,
        run: Run,
        request: ChatRequest,
        streaming: bool,
        hop: int,
        parent: otel_context.Context,
    ) -> AsyncGenerator[_Reply, None]:
        """One model call under the hop's context: its ``model`` progress event, streamed
        events (when streaming), then the reply, or the provider error the call ended with."""
        yield ProgressEvent(stage="model", hop=hop, model=request.model or run.model)
        try:
            if streaming:
                events = self._stream_hop(request, run, hop, parent)
                async with aclosing(events):
                    async for event in events:
                        yield event
            else:
                yield await self.traced_llm.chat(request, parent=parent, fallback_model=run.model)
        except LLMError as exc:
            yield exc

    async def _stream_hop(
        self, request: ChatRequest, run: Run, hop: int, parent: otel_context.Context
    ) -> AsyncGenerator[AgentEvent | ChatResult, None]:
        """One streamed model call: ``waiting`` heartbeats until the model sends something,
        filtered tokens and citations as they arrive, then the finished ``ChatResult``."""
        retrieved = run.retrieved()
        stream_filter = CitationStreamFilter(valid_ids=frozenset(retrieved))

        def citation_events() -> list[AgentEvent]:
            events: list[AgentEvent] = []
            for chunk_id in stream_filter.pop_citations():
                chunk = retrieved[chunk_id]
                citation = Citation(chunk_id, chunk.source, chunk.section, snippet(chunk.text))
                events.append(CitationEvent(citation=citation_out(citation)))
            return events

        source = with_heartbeat(
            self.traced_llm.stream(request, parent=parent, fallback_model=run.model),
            hop=hop,
            every=self.config.heartbeat_seconds,
        )
        try:
            async for event in source:
                if isinstance(event, ProgressEvent):
                    yield event
                elif isinstance(event, TextDelta):
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
            with suppress(Exception):
                await source.aclose()

    async def _run_tools(
        self,
        run: Run,
        calls: tuple[ToolCall, ...] | list[ToolCall],
        hop: otel_context.Context,
    ) -> AsyncGenerator[AgentEvent, None]:
        """Run one hop's tool calls concurrently; yield a ``tool_started`` progress event for
        each before they start and a tool event as each finishes; append the results to the
        conversation in call order. Each call carries the hop's trace context, so its
        ``tool.<name>`` span (opened where it runs) is the hop's child."""
        for call in calls:
            yield tool_started(call)
        request = dataclasses.replace(run.request, trace_context=inject(hop))
        tasks = [
            asyncio.create_task(self.tools.execute(call, request), name=f"tool:{call.name}")
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
        for task in tasks:
            outcome = task.result()
            run.seen_chunks.add(outcome.chunks)
            run.entities.add_result(outcome.result_json)
            run.traces.append(tool_trace(outcome))
            run.messages.append(
                Message(
                    "tool", outcome.result_json, tool_call_id=outcome.call_id, name=outcome.name
                )
            )
