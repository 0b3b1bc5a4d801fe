"""``Agent``: the bounded tool-calling loop behind ``POST /ask``.

Each hop sends the conversation plus the tool schemas to the model. A reply with tool calls
runs them concurrently through the ``ToolExecutor`` (errors come back to the model as tool results,
never raised), appends the results and goes round again; a final reply is classified
(answered / idk / declined), its citation markers are validated against the chunks
``search_docs`` returned, and invented markers are stripped (``agent.finishing``). At most
``MAX_TOOL_HOPS`` model calls: a model still asking for tools after that gets the IDK marker
and ``tool_loop_exhausted`` (so does a model asking for tools past ``max_tool_calls`` tool
calls or ``max_total_tokens`` tokens in all). Provider failures (after the client's retries)
end the run with ``provider_error`` and a clean message; nothing is raised to the caller.
A final "I don't know" with no search of the knowledge base in the run is not accepted yet:
the loop searches first and asks again (``agent.search_first``).

What happens around the loop (work before the first call, what each hop offers, what tool
results teach) is the run's ``RunStrategy`` (``agent.strategy``): the plain agentic loop by
default; the composition root may choose another, such as the small-model planner.

``stream`` yields ``progress`` events (``started`` first, each model call, ``waiting``
heartbeats, each tool as it starts), ``tool`` events as tools finish, ``token`` and
``citation`` events as text arrives (``agent.streaming``), then one ``done`` event carrying
the full ``AgentAnswer`` (authoritative: a preamble streamed before a tool call is not part of
it); ``answer`` runs the same loop with non-streaming model calls. Tracing stays out of the
loop (``agent.instrumented``). Plain async Python: no Ray, no FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Unpack

from opentelemetry import context as otel_context

from agent.answer import AgentAnswer, AgentEvent, DoneEvent, ProgressEvent, TokenEvent
from agent.finishing import Finisher
from agent.instrumented import InstrumentedLLM, RunTrace, model_call
from agent.llm.base import (
    ChatRequest,
    ChatResult,
    LLMClient,
    LLMError,
    MalformedReply,
    Message,
    ToolCall,
)
from agent.progress import DEFAULT_HEARTBEAT_SECONDS, prepend
from agent.prompts import IDK_MARKER, SystemPrompt, load_system_prompt
from agent.request import AgentRequest, RequestFields
from agent.run_state import Run
from agent.search_first import search_before_giving_up
from agent.strategy import AgenticStrategy, AgentKit, RunHooks, RunStart, RunStrategy
from agent.streaming import stream_hop
from agent.tool_calls import run_tool_calls
from agent.tools.executor import ToolExecutor, ToolRequest
from agent.turns import MAX_EARLIER, history_messages
from agent.usage import PriceTable, RunUsage, default_price_table
from foundation.identity import AuthUser
from foundation.observability.attributes import provider_name
from foundation.observability.spans import Observer

__all__ = ["Agent", "AgentAnswer", "AgentConfig", "AgentEvent", "AgentRequest"]

log = logging.getLogger(__name__)

MAX_MALFORMED_REPLIES = 2  # consecutive unusable replies before giving up (provider_error)

# What one model call gives the hop: events to pass on, then the reply or the provider error.
_Reply = AgentEvent | ChatResult | LLMError


@dataclass(frozen=True)
class AgentConfig:
    """What the loop needs from the service's settings (the composition root builds it)."""

    max_tool_hops: int = 6
    # Per-request caps beyond the hops (MAX_TOOL_CALLS_PER_ASK, MAX_TOKENS_PER_ASK): tool
    # calls in all (a strategy's own included), input + output tokens of every model call. A
    # model asking for tools past one ends the run as ``tool_loop_exhausted``. None: no cap.
    max_tool_calls: int | None = 24
    max_total_tokens: int | None = None
    observe_payloads: bool = False
    temperature: float | None = None  # as sent by the client; recorded on spans
    max_output_tokens: int | None = None
    provider_url: str = ""  # names the provider on spans when the client has no base_url
    # One repair call for an ungrounded answer, or IDK at once; None: the strategy's default.
    repair_ungrounded: bool | None = None
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS  # between ``waiting`` events
    # HISTORY_MAX_TOKENS (``agent.turns``). None: every earlier turn; 0: none, for the strategy too.
    history_max_tokens: int | None = None


class Agent:
    """The agent core. Build one per process; ``answer``/``stream`` are safe to run
    concurrently (all per-request state lives in the run). Tools run through a
    ``ToolExecutor`` (in-process, or a Serve handle: see ``serve_app.wiring``). The model is
    traced through an ``InstrumentedLLM`` wrapped around ``llm`` (unless it already is one);
    ``strategy`` steers each run (default: ``AgenticStrategy``)."""

    def __init__(
        self,
        *,
        llm: LLMClient,
        tools: ToolExecutor,
        config: AgentConfig | None = None,
        prompt: SystemPrompt | None = None,
        prices: PriceTable | None = None,
        strategy: RunStrategy | None = None,
    ) -> None:
        self.tools = tools
        self.config = config or AgentConfig()
        self.strategy: RunStrategy = strategy or AgenticStrategy()
        self.prompt = prompt or load_system_prompt()
        client = llm.inner if isinstance(llm, InstrumentedLLM) else llm
        # The prompt's format follows the wire format of the client that speaks it.
        self.kit = AgentKit(tools, self.prompt, getattr(client, "tool_calling_mode", "native"))
        self.mode = self.kit.mode
        self.prices = prices or default_price_table()
        self.max_hops = self.config.max_tool_hops
        self.observer = Observer(payloads=self.config.observe_payloads)
        self.provider = provider_name(getattr(client, "base_url", "") or self.config.provider_url)
        self.llm: InstrumentedLLM = (
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
            self.llm,
            repair=self.strategy.repairs_by_default if repair is None else repair,
            settles={spec.name: spec.answers for spec in tools.specs()},
        )

    # --- public API ---------------------------------------------------------------------------

    async def warm_up(self) -> bool:
        """Let the strategy read its static prompt prefixes into the model server's cache
        (untraced); False when it has none or the model did not answer."""
        return await self.strategy.warm_up(self.llm.inner, self.kit)

    async def run(self, request: AgentRequest) -> AgentAnswer:
        """Run the loop to completion (non-streaming model calls)."""
        done: AgentAnswer | None = None
        events = self._run(request, streaming=False)
        async with aclosing(events):
            async for event in events:
                if isinstance(event, DoneEvent):
                    done = event.response
        if done is None:  # pragma: no cover - every path ends with a done event
            raise RuntimeError("the agent loop ended without a done event")
        return done

    async def run_stream(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        """Run the loop, yielding tool/token/citation events and finally one done event.
        Closing the stream early (``aclose``, a client disconnect) cancels running tools."""
        events = self._run(request, streaming=True)
        async with aclosing(events):
            async for event in events:
                yield event

    async def answer(
        self, question: str, user: AuthUser, **fields: Unpack[RequestFields]
    ) -> AgentAnswer:
        """``run`` of ``AgentRequest.of(question, user, **fields)`` (scripts and tests)."""
        return await self.run(AgentRequest.of(question, user, **fields))

    def stream(
        self, question: str, user: AuthUser, **fields: Unpack[RequestFields]
    ) -> AsyncIterator[AgentEvent]:
        """``run_stream`` of ``AgentRequest.of(question, user, **fields)``."""
        return self.run_stream(AgentRequest.of(question, user, **fields))

    # --- the loop -----------------------------------------------------------------------------

    async def _run(
        self, request: AgentRequest, *, streaming: bool
    ) -> AsyncGenerator[AgentEvent, None]:
        """The loop inside its run trace (``agent.answer``), started on the first event."""
        question, user, model = request.question, request.user, request.model
        budget = self.config.history_max_tokens
        history = history_messages(request.earlier, max_tokens=budget)
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
        specs = tuple(self.tools.specs())
        run = Run(
            request=ToolRequest(user=user, top_k=request.top_k),
            model=answering,
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
        earlier = request.earlier[-MAX_EARLIER:] if budget != 0 else ()
        hooks = self.strategy.begin(RunStart(run, self.kit, specs, model, earlier, trace))
        loop = self._loop(run, hooks, streaming, trace)
        # ``started`` goes out before any work, so a caller hears back at once.
        events = trace.observe(prepend(ProgressEvent(stage="started", model=answering), loop))
        async with aclosing(events):
            async for event in events:
                yield event

    async def _loop(
        self, run: Run, hooks: RunHooks, streaming: bool, trace: RunTrace
    ) -> AsyncGenerator[AgentEvent, None]:
        async for early in hooks.before_run():
            yield early
        if hooks.answer is not None:
            composed = self.finisher.composed(run, hooks.answer, streaming)
            if composed:
                for composed_event in composed:
                    yield composed_event
                return
        for hop in range(1, self.max_hops + 1):
            with trace.hop(hop) as hop_ctx:
                reply: ChatResult | LLMError | None = None
                request = hooks.prepare_request(hop)
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
                    asked = Message("assistant", reply.text, tool_calls=tuple(reply.tool_calls))
                elif hop < self.max_hops and (
                    search := search_before_giving_up(run, request, reply, self.finisher.settles)
                ):
                    asked = Message("assistant", None, tool_calls=(search,))
                else:
                    finish = self.finisher.finish(run, reply, streaming, request, trace, hop)
                    async for event in finish:
                        yield event
                    return
                async with aclosing(self._run_calls(run, asked, hop_ctx, hooks)) as calls:
                    async for tool_event in calls:
                        yield tool_event

        if streaming:
            yield TokenEvent(text=IDK_MARKER)
        yield DoneEvent(
            response=run.response(IDK_MARKER, "tool_loop_exhausted", by="service", idk=True)
        )

    def _run_calls(
        self, run: Run, asked: Message, hop_ctx: otel_context.Context, hooks: RunHooks
    ) -> AsyncGenerator[AgentEvent, None]:
        """The calls of ``asked`` (appended to the run's messages), as the caller."""
        run.messages.append(asked)
        return run_tool_calls(self.tools, run, asked.tool_calls, hop_ctx, then=hooks.after_tools)

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
        note = f"Your previous reply could not be used: {error}. Reply again, following the "
        run.messages.append(Message("user", note + "required format exactly."))
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
                with model_call(parent, run.model):
                    source = self.llm.stream(request)
                events = stream_hop(source, run, hop, self.config.heartbeat_seconds)
                async with aclosing(events):
                    async for event in events:
                        yield event
            else:
                with model_call(parent, run.model):
                    result = await self.llm.chat(request)
                yield result
        except LLMError as exc:
            yield exc
