"""How a run is steered around the loop: the ``RunStrategy`` seam.

The loop (``agent.loop``) is the same for every model: call the model, run the tools it asks
for, finish. A strategy decides what happens around it, through a few hooks on a per-run
object (``RunHooks``), as pydantic-ai's capabilities and the OpenAI Agents SDK's ``RunHooks``
do:

* ``before_run``: work before the first model call (events to pass on); it may leave a
  finished ``answer`` that the loop checks and returns without calling the model;
* ``prepare_request``: each hop's ``ChatRequest`` (which tools, which constraints);
* ``after_tools``: what a hop's tool results teach the strategy.

``AgenticStrategy`` (the default) is the plain agentic loop: every tool on every hop, nothing
before. The small-model strategy (``agent.small_model``) plans first; the composition root
(``serve_app.wiring``) chooses it from configuration. Nothing in the core imports it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.answer import AgentEvent
from agent.instrumented import RunTrace
from agent.llm.base import ChatRequest, LLMClient, ToolSpec
from agent.prompts import Mode, SystemPrompt
from agent.run_state import Run
from agent.tools.executor import ToolExecutor
from agent.tools.registry import ToolOutcome
from agent.turns import PriorTurn

__all__ = ["AgentKit", "AgenticStrategy", "RunHooks", "RunStart", "RunStrategy"]


@dataclass(frozen=True)
class AgentKit:
    """What an agent runs with, lent to its strategy: the tools (run as the caller), the
    system prompt and the tool-calling mode the model speaks."""

    tools: ToolExecutor
    prompt: SystemPrompt
    mode: Mode


@dataclass(frozen=True)
class RunStart:
    """One run as its strategy meets it."""

    run: Run
    kit: AgentKit
    specs: tuple[ToolSpec, ...]
    model: str | None  # the caller's model override, None: the client's default
    earlier: tuple[PriorTurn, ...]  # the caller's earlier turns, oldest first
    trace: RunTrace


class RunHooks(Protocol):
    """One run's side of a strategy (``RunStrategy.begin``)."""

    @property
    def answer(self) -> str | None:
        """An answer ``before_run`` wrote from its own tool results (None: the model
        answers). The loop returns it only when its figures and markers are grounded."""
        ...

    def before_run(self) -> AsyncIterator[AgentEvent]: ...

    def prepare_request(self, hop: int) -> ChatRequest: ...

    def after_tools(self, outcomes: Sequence[ToolOutcome]) -> None: ...


class RunStrategy(Protocol):
    name: str
    # An ungrounded answer gets one repair call unless the configuration says otherwise.
    repairs_by_default: bool
    warms_up: bool  # whether ``warm_up`` has prompt prefixes to read (a thread is worth it)

    def begin(self, start: RunStart) -> RunHooks: ...

    async def warm_up(self, llm: LLMClient, kit: AgentKit) -> bool:
        """Read the strategy's static prompt prefixes into the model server's cache; False
        when there is nothing to warm or the model did not answer."""
        ...


class _AgenticRun:
    def __init__(self, start: RunStart) -> None:
        self.start = start

    answer: str | None = None

    async def before_run(self) -> AsyncIterator[AgentEvent]:
        return
        yield  # an async generator that yields nothing

    def prepare_request(self, hop: int) -> ChatRequest:
        run = self.start.run
        return ChatRequest(
            messages=tuple(run.messages),
            tools=self.start.specs,
            model=self.start.model,
            queue_priority=run.asked_at,
        )

    def after_tools(self, outcomes: Sequence[ToolOutcome]) -> None:
        pass


class AgenticStrategy:
    """The plain agentic loop: the model sees every tool on every hop and decides alone."""

    name = "agentic"
    repairs_by_default = True
    warms_up = False

    def begin(self, start: RunStart) -> RunHooks:
        return _AgenticRun(start)

    async def warm_up(self, llm: LLMClient, kit: AgentKit) -> bool:
        return False  # a provider that bills prompt tokens is not called for nothing
