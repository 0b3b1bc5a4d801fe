"""The ``ApiBackend`` port: everything the HTTP routes need from the rest of the service.

Two adapters: an in-process one (``serve_app.local_backend``: the core objects in this
process, for the single-process server and the route tests) and the Ray Serve one
(``deployments.ingress``: deployment handles, the Ray Jobs API)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from agent.answer import AgentAnswer, AgentEvent
from agent.followups import PriorTurn
from agent.llm.base import Message
from conversations.store import ConversationStore
from foundation.identity import AuthUser
from serve_app.readiness import Readiness


@dataclass(frozen=True)
class AskParams:
    question: str
    model: str | None = None  # already checked against the override policy by the route
    top_k: int | None = None
    trace_context: dict[str, str] = field(default_factory=dict)  # W3C traceparent carrier
    # Earlier turns of the conversation, fitted to HISTORY_MAX_TOKENS (serve_app.history)
    history: tuple[Message, ...] = ()
    # The same turns as the follow-up rewriter reads them (serve_app.history.prior_turns)
    earlier: tuple[PriorTurn, ...] = ()


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
    async def ask(self, user: AuthUser, params: AskParams) -> AgentAnswer: ...

    def ask_stream(self, user: AuthUser, params: AskParams) -> AsyncIterator[AgentEvent]:
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

    async def readiness(self) -> Readiness: ...

    async def close(self) -> None: ...


# --- errors a backend may raise (additive) -----------------------------------------------------


class BackendError(Exception):
    """A failure of the backend itself (not of the agent's run, which ends in an answer with
    ``decision="provider_error"``). The routes turn it into the error envelope with
    ``status``; ``message`` is shown to the caller, so it must hold no secrets."""

    status: int = 503
    code: str = "backend_unavailable"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        # Extra members of the error envelope (e.g. a 429's ``exceeded``) and response headers.
        self.details = dict(details or {})
        self.headers = dict(headers or {})


class BackendOverloaded(BackendError):
    """Too many requests in flight (e.g. Serve's back-pressure): try again shortly -> 429."""

    status = 429
    code = "overloaded"


class BackendTimeout(BackendError):
    """The work did not finish in time (e.g. Serve's request timeout) -> 504."""

    status = 504
    code = "timeout"


class IngestConflict(BackendError):
    """An ingestion run is already running -> 409."""

    status = 409
    code = "ingest_in_progress"


class ConversationNotFound(BackendError):
    """No conversation with this id belongs to the caller -> 404, one message whether it
    never existed or is another caller's (no existence oracle)."""

    status = 404
    code = "not_found"


class ConversationFullError(BackendError):
    """The conversation holds ``CONVERSATION_MAX_TURNS`` turns -> 409: start a new one."""

    status = 409
    code = "conversation_full"


class ConversationDeleted(BackendError):
    """The conversation was deleted while its question was being answered -> 409; the
    answer was not stored."""

    status = 409
    code = "conversation_deleted"


class ConversationsUnavailable(BackendError):
    """The conversation store (the database) cannot be reached -> 503."""

    code = "conversations_unavailable"
