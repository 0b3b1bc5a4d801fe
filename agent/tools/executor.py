"""``ToolExecutor``: the port the loop runs tools through, and its in-process adapter.

The loop only needs the tool specs and "run this call for this user". Keeping that behind a
port lets the composition root run the tools in-process (``LocalToolExecutor``) or in their
own Serve deployment (an adapter that forwards ``execute`` to a handle whose replica holds a
``LocalToolExecutor``): ``ToolCall``, ``ToolRequest`` and ``ToolOutcome`` are plain picklable
data, and an outcome carries the documentation chunks it showed the model, so citations are
validated the same way either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from agent.access import DomainAuthorizer
from agent.llm.base import ToolCall, ToolSpec
from agent.tools.base import Retriever, ToolContext, utc_now
from agent.tools.downstream import Downstream
from agent.tools.instrumented import traced_dispatch
from agent.tools.registry import ToolOutcome, ToolRegistry
from foundation.identity import AuthUser
from foundation.tracing import use_context


@dataclass(frozen=True)
class ToolRequest:
    """Who a tool call runs for, and the request options tools honour."""

    user: AuthUser
    top_k: int | None = None
    trace_context: dict[str, str] = field(default_factory=dict)  # for the next hop


class ToolExecutor(Protocol):
    def specs(self) -> list[ToolSpec]: ...

    async def execute(self, call: ToolCall, request: ToolRequest) -> ToolOutcome:
        """Run one call as ``request.user``; never raises (errors are in the outcome)."""
        ...


class LocalToolExecutor:
    """Runs the registry's tools in this process, each call inside its ``tool.<name>`` span."""

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        downstream: Downstream,
        authorizer: DomainAuthorizer,
        retriever: Retriever | None = None,
        clock: Callable[[], datetime] = utc_now,
        observe_payloads: bool = False,
    ) -> None:
        self.registry = registry
        self.downstream = downstream
        self.authorizer = authorizer
        self.retriever = retriever
        self.clock = clock
        self.observe_payloads = observe_payloads

    def specs(self) -> list[ToolSpec]:
        return self.registry.specs()

    def context(self, request: ToolRequest) -> ToolContext:
        return ToolContext(
            user=request.user,
            downstream=self.downstream,
            authorizer=self.authorizer,
            retriever=self.retriever,
            top_k=request.top_k,
            clock=self.clock,
            observe_payloads=self.observe_payloads,
        )

    async def execute(self, call: ToolCall, request: ToolRequest) -> ToolOutcome:
        # The hop's trace context: the tool's span (and retrieval's below it) are its children.
        with use_context(request.trace_context):
            return await traced_dispatch(self.registry, call, self.context(request))
