"""The ``ApiBackend`` port: everything the HTTP routes need from the rest of the service.

Two adapters: an in-process one (``serve_app.api.local_backend``: the core objects in this
process, for the single-process server and the route tests) and the Ray Serve one
(``deployments.ingress``: deployment handles, the Ray Jobs API)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from serve_app.agent.answer import AgentAnswer, AgentEvent
from serve_app.identity import AuthUser


@dataclass(frozen=True)
class AskParams:
    question: str
    model: str | None = None  # already checked against the override policy by the route
    top_k: int | None = None


class IngestRequest(BaseModel):
    """``POST /ingest`` body. Roots are the server's configured DOC_ROOTS: a caller cannot
    point the job at arbitrary server paths."""

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


class ReadinessCheck(BaseModel):
    name: str  # "database", "schema", "embedding_dim", "provider", ...
    ok: bool
    detail: str | None = None


class Readiness(BaseModel):
    ready: bool
    checks: list[ReadinessCheck]


@runtime_checkable
class ApiBackend(Protocol):
    async def ask(self, user: AuthUser, params: AskParams) -> AgentAnswer: ...

    def ask_stream(self, user: AuthUser, params: AskParams) -> AsyncIterator[AgentEvent]:
        """Events as the agent produces them; closing the iterator cancels the work."""
        ...

    async def start_ingest(self, user: AuthUser, request: IngestRequest) -> IngestRun: ...

    async def ingest_status(self, run_id: str) -> IngestRun | None: ...

    async def readiness(self) -> Readiness: ...

    async def close(self) -> None: ...
