"""The small-model strategy: plan first, then let the model answer a smaller job.

Chosen by the composition root (``serve_app.wiring``: ``PLAN_FIRST``, auto = the
``json_schema`` tool-calling mode of the packaged local models). Before the first model call
the ``Planner`` routes the question, grounds its entities and fetches documentation as the
caller (``agent.small_model.planning``); where that settles the answer it writes it
(``agent.small_model.composing``). Each hop then offers only the route's tools, limits id
arguments to the ids the run has resolved, and lets the model cite a chunk by its short label.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

from agent.answer import AgentEvent
from agent.instrumented import RunTrace
from agent.llm.base import ChatRequest, LLMClient, LLMError, MalformedReply, Message, ToolSpec
from agent.small_model.followups import DeterministicRewriter, QueryRewriter, Rewrite
from agent.small_model.planning import Plan, Planner, offered_tools
from agent.small_model.routing import Route
from agent.strategy import AgentKit, RunHooks, RunStart
from agent.tools.registry import ToolOutcome
from foundation.observability import attributes as attr
from foundation.observability.spans import set_attributes

__all__ = ["SmallModelStrategy"]

log = logging.getLogger(__name__)


def _system_prompt(kit: AgentKit, route: Route, specs: Sequence[ToolSpec]) -> str:
    """The system message a planned route's model calls read (and the warm-up caches): a
    route the service searched up front (documentation, both) reads the short answer
    prompt for its tools, a cached prefix of its own, since the search is done and
    mostly the answer is left to the model; every other route the whole prompt."""
    if route in ("documentation", "both"):
        tools = offered_tools(route, specs)
        answer = kit.prompt.render_answer(kit.mode, tools, live=route == "both")
        if answer is not None:
            return answer
    return kit.prompt.render(kit.mode, specs)


def _record_rewrite(trace: RunTrace, rewrite: Rewrite, rewriter: str) -> None:
    """A follow-up's standalone query on the run's span: which rule and rewriter, always;
    the query itself (request content) only with payloads on."""
    set_attributes(
        trace.root,
        {
            attr.AGENT_QUERY_REWRITER: rewriter,
            attr.AGENT_QUERY_REWRITE_RULE: rewrite.rule,
            attr.AGENT_QUERY_REWRITTEN: rewrite.rewritten,
        },
    )
    trace.observer.payload(trace.root, attr.AGENT_QUERY_STANDALONE, rewrite.query)


class _PlannedRun:
    """One run under the small-model strategy: its planner and, once made, its plan."""

    def __init__(self, start: RunStart, *, compose: bool, rewriter: QueryRewriter) -> None:
        self.start = start
        self.planner = Planner(
            start.kit.tools, compose=compose, rewriter=rewriter, earlier=start.earlier
        )
        self.plan: Plan | None = None

    @property
    def answer(self) -> str | None:
        return self.plan.answer if self.plan is not None else None

    async def before_run(self) -> AsyncIterator[AgentEvent]:
        start = self.start
        async for item in self.planner.plan(start.run, start.run.question, start.specs):
            if isinstance(item, Plan):
                self.plan = item
            else:
                yield item
        if self.plan is None:  # pragma: no cover - plan() always ends with its Plan
            return
        if self.plan.rewrite is not None:
            _record_rewrite(start.trace, self.plan.rewrite, self.planner.rewriter.name)
        if self.plan.decision.wants_docs:
            prompt = _system_prompt(start.kit, self.plan.decision.route, start.specs)
            start.run.messages[0] = Message("system", prompt)

    def prepare_request(self, hop: int) -> ChatRequest:
        """Only the route's tools, its refusal rule, and id arguments limited to the ids the
        run has resolved."""
        run, plan = self.start.run, self.plan
        if plan is None:  # pragma: no cover - before_run always makes the plan
            raise RuntimeError("prepare_request before the plan was made")
        return ChatRequest(
            messages=tuple(run.messages),
            tools=plan.tools,
            model=self.start.model,
            queue_priority=run.asked_at,
            choices=self.planner.entities.choices(plan.constrained_kinds),
            allow_refusal=plan.decision.allow_refusal,
            source_labels=dict(self.planner.source_labels),
        )

    def after_tools(self, outcomes: Sequence[ToolOutcome]) -> None:
        for outcome in outcomes:
            self.planner.entities.add_result(outcome.result_json)


class SmallModelStrategy:
    """Plan first (route, ground, search as the caller), compose what the plan settles
    (``compose``), and constrain each hop to the route. ``rewriter`` turns follow-ups into
    standalone queries for the plan's search and entity resolution."""

    name = "small_model"
    # Small models did not repair an ungrounded answer (see GROUNDING_REPAIR): IDK at once.
    repairs_by_default = False
    warms_up = True

    def __init__(self, *, compose: bool = True, rewriter: QueryRewriter | None = None) -> None:
        self.compose = compose
        self.rewriter: QueryRewriter = rewriter or DeterministicRewriter()

    def begin(self, start: RunStart) -> RunHooks:
        return _PlannedRun(start, compose=self.compose, rewriter=self.rewriter)

    async def warm_up(self, llm: LLMClient, kit: AgentKit) -> bool:
        """Read the static prompt prefixes (the whole system prompt with its tool list and
        examples, and the short answer prompts of the routes searched up front) into the
        model server's prompt cache with a one-token reply each, so the first question does
        not pay for them (about 1,600, 470 and 860 tokens: ~45 s on two cores)."""
        specs = kit.tools.specs()
        # The whole prompt first (a question asked while the warm-up runs most likely needs
        # it), then the answer prompts of the documentation and "both" routes; the server's
        # prompt cache keeps every prefix.
        routes: tuple[Route, ...] = ("live_data", "documentation", "both")
        for prompt in dict.fromkeys(_system_prompt(kit, route, specs) for route in routes):
            system = Message("system", prompt)
            request = ChatRequest(messages=(system, Message("user", "Hello!")), max_output_tokens=1)
            try:
                await llm.chat(request)
            except MalformedReply:
                pass  # one token is never a whole step; the prefix is cached all the same
            except LLMError as exc:
                log.info("prompt warm-up: the model did not answer (%s)", exc)
                return False
        return True
