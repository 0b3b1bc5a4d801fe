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

from serve_app.agent.access import DomainAuthorizer
from serve_app.agent.llm.base import ToolCall, ToolSpec
from serve_app.agent.tools.base import Retriever, ToolContext, utc_now
from serve_app.agent.tools.downstream import Downstream
from serve_app.agent.tools.registry import ToolOutcome, ToolRegistry
from serve_app.config import Settings
from serve_app.identity import AuthUser
from serve_app.tracing import use_context


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
    """Runs the registry's tools in this process."""

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        downstream: Downstream,
        settings: Settings,
        authorizer: DomainAuthorizer,
        retriever: Retriever | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.registry = registry
        self.downstream = downstream
        self.settings = settings
        self.authorizer = authorizer
        self.retriever = retriever
        self.clock = clock

    def specs(self) -> list[ToolSpec]:
        return self.registry.specs()

    def context(self, request: ToolRequest) -> ToolContext:
        return ToolContext(
            user=request.user,
            downstream=self.downstream,
            settings=self.settings,
            authorizer=self.authorizer,
            retriever=self.retriever,
            top_k=request.top_k,
            clock=self.clock,
        )

    async def execute(self, call: ToolCall, request: ToolRequest) -> ToolOutcome:
        # The hop's trace context: the tool's span (and retrieval's below it) are its children.
        with use_context(request.trace_context):
            return await self.registry.dispatch(call, self.context(request))
