"""The ``ApiBackend`` port: everything the HTTP routes need from the rest of the service.

Two adapters: an in-process one (``serve_app.local_backend``: the core objects in this
process, for the single-process server and the route tests) and the Ray Serve one
(``deployments.ingress``: deployment handles, the Ray Jobs API). The errors a backend may
raise live in ``serve_app.backend_errors`` and are re-exported here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from agent.answer import AgentAnswer, AgentEvent
from agent.request import AgentRequest
from conversations.feedback import FeedbackStore
from conversations.store import ConversationStore
from foundation.identity import AuthUser
from serve_app.backend_errors import BackendError as BackendError
from serve_app.backend_errors import BackendOverloaded as BackendOverloaded
from serve_app.backend_errors import BackendTimeout as BackendTimeout
from serve_app.backend_errors import ConversationDeleted as ConversationDeleted
from serve_app.backend_errors import ConversationFullError as ConversationFullError
from serve_app.backend_errors import ConversationNotFound as ConversationNotFound
from serve_app.backend_errors import ConversationsUnavailable as ConversationsUnavailable
from serve_app.backend_errors import IngestConflict as IngestConflict
from serve_app.limits import RequestLimits
from serve_app.metrics import MetricsSink
from serve_app.readiness import Readiness


class IngestRequest(BaseModel):
    """``POST /ingest`` body. Roots are the server's configured DOC_ROOTS: a caller cannot
    point the job at arbitrary server paths. Strict: ``"prune": 0`` or ``"yes"`` is a 422,
    not a boolean (the schema says boolean; a guessed meaning would be a silent prune)."""

    model_config = ConfigDict(strict=True)

    prune: bool = Field(default=False, description="delete documents whose source is gone")


IngestStatus = Literal["pending", "running", "succeeded", "failed", "stopped"]


class IngestRun(BaseModel):
    run_id: str
    status: IngestStatus
    submitted_at: datetime | None = None
    finished_at: datetime | None = None
    progress: dict[str, int] = Field(default_factory=dict)  # {"done": n, "total": m}
    counts: dict[str, Any] = Field(default_factory=dict)  # the ingestion report, when done
    message: str | None = None  # why it failed, when it did (no stack traces)


@runtime_checkable
class ApiBackend(Protocol):
    async def ask(self, request: AgentRequest) -> AgentAnswer:
        """The agent's answer to ``request`` (the caller, the question, the model override
        already checked, the thread's earlier turns, the caller's trace): the same object
        the agent takes, across a Ray handle as in process."""
        ...

    def ask_stream(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        """Events as the agent produces them; closing the iterator cancels the work."""
        ...

    async def start_ingest(self, user: AuthUser, request: IngestRequest) -> IngestRun: ...

    async def ingest_status(self, run_id: str) -> IngestRun | None: ...

    @property
    def conversations(self) -> ConversationStore:
        """The callers' conversations (``serve_app.threads`` keeps ``/ask`` turns in them;
        the ``/conversations`` routes read and delete them). A database failure surfaces
        as ``ConversationsUnavailable``."""
        ...

    async def visible_chunks(self, user: AuthUser, chunk_ids: Collection[str]) -> set[str]:
        """Those of ``chunk_ids`` that exist and ``user`` may see now: the knowledge base's
        ACL rule, the search's own (``PgDocumentStore.visible_chunk_ids``). A thread's stored
        citations are re-checked with it when it is read or continued
        (``conversations.recheck``). A database failure surfaces as
        ``ConversationsUnavailable`` (the thread is not shown unchecked)."""
        ...

    @property
    def limits(self) -> RequestLimits:
        """The callers' rate limits and budgets, checked by ``/ask`` (``serve_app.limits``;
        ``RequestLimits.disabled()`` when every limit is off). ``close`` closes them."""
        ...

    @property
    def feedback(self) -> FeedbackStore:
        """Where ``/feedback`` keeps ratings: beside ``conversations``
        (``serve_app.feedback.feedback_store_for``). ``close`` closes it."""
        ...

    @property
    def metrics(self) -> MetricsSink | None:
        """Where the routes count (``/feedback``'s ``agent_feedback``); none: not counted
        (the Serve Ingress counts into Ray's metrics, the single-process server nowhere)."""
        ...

    async def readiness(self) -> Readiness: ...

    async def close(self) -> None: ...
