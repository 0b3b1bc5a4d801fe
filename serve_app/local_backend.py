"""``LocalBackend``: the ``ApiBackend`` port with every core object in this process.

It holds the ``Agent`` (with its LLM client, the ``Downstream`` client for twin/sensor
services, and a hybrid retriever over the knowledge base) and the callers' conversations
(``serve_app.threads.LazyConversationStore``, their ratings beside them:
``serve_app.feedback``) and their usage limits, and runs ingestion as asyncio tasks
(``run_ingest`` with the local executor over ``DOC_ROOTS``), tracked in memory by run id. Used by
the single-process server (``serve_app.api.single_process``, the spec's FastAPI-only
architecture and the benchmarks' baseline) and by the route tests.

The database is opened lazily (``LazyStore``): the process starts, and ``/readyz`` says why it
is not ready, while the database is down; the first use after it comes back opens the pool.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from agent.answer import AgentAnswer, AgentEvent
from agent.loop import Agent
from agent.request import AgentRequest
from conversations.feedback import FeedbackStore
from conversations.store import ConversationStore
from foundation.identity import AuthUser
from foundation.settings import Settings
from foundation.tracing import use_context
from ingest_jobs.config import IngestConfig
from ingest_jobs.pipeline import IngestOptions, effective_max_tokens, run_ingest
from retrieval.embedders import Embedder
from serve_app.backend import (
    IngestConflict,
    IngestRequest,
    IngestRun,
)
from serve_app.feedback import feedback_store_for
from serve_app.knowledge import LazyStore
from serve_app.limits import RequestLimits
from serve_app.metrics import MetricsSink
from serve_app.readiness import Readiness, ReadinessCheck, lazy_store_checks, provider_check
from serve_app.threads import visible_chunks

log = logging.getLogger(__name__)

MAX_TRACKED_RUNS = 100
MAX_MESSAGE_CHARS = 500
MISSING_KEY_PLACEHOLDER = "missing-api-key"


@runtime_checkable
class Closable(Protocol):
    async def aclose(self) -> None: ...


# --- the knowledge base, opened on first use ------------------------------------------------------


# --- ingestion runs -------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


class _Run:
    def __init__(self, run_id: str) -> None:
        self.state = IngestRun(run_id=run_id, status="pending", submitted_at=_now())
        self.task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.state.status in ("pending", "running")

    def finish(self, status: Any, message: str | None = None) -> None:
        self.state.status = status
        self.state.finished_at = _now()
        self.state.message = message[:MAX_MESSAGE_CHARS] if message else None


# --- the backend ----------------------------------------------------------------------------------


class LocalBackend:
    """The ``ApiBackend`` port, in-process (built by ``serve_app.wiring.build_local_backend``)."""

    def __init__(
        self,
        *,
        settings: Settings,
        agent: Agent,
        store: LazyStore,
        embedder: Embedder,
        conversations: ConversationStore,
        ingest: IngestConfig,
        closables: Sequence[Closable] = (),
        limits: RequestLimits | None = None,
        feedback: FeedbackStore | None = None,
        metrics: MetricsSink | None = None,
    ) -> None:
        self.settings = settings
        self.agent = agent
        self.store = store
        self.embedder = embedder
        self.ingest = ingest  # POST /ingest's runs (serve_app.wiring.ingest_config)
        self._conversations = conversations
        # The callers' rate limits and budgets (the app's /ask checks them; closed here).
        self.limits = limits if limits is not None else RequestLimits.disabled()
        # Where /feedback keeps ratings: beside the conversations (closed here).
        self.feedback = (
            feedback if feedback is not None else feedback_store_for(conversations, settings)
        )
        # Where the routes count (none here unless given: the single-process server has no
        # metrics sink).
        self.metrics = metrics
        self._closables = list(closables)
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    async def start(self) -> None:
        """Open the database now if it is there (a failure is logged; ``/readyz`` reports
        it and the next use retries)."""
        try:
            await self.store.get()
        except Exception as exc:
            log.warning("the knowledge base is not available yet: %s", _describe(exc))

    # --- ask ------------------------------------------------------------------------------------

    async def ask(self, request: AgentRequest) -> AgentAnswer:
        with use_context(request.trace_context):
            return await self.agent.run(request)

    async def ask_stream(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        with use_context(request.trace_context):
            events = self.agent.run_stream(request)
            try:
                async for event in events:
                    yield event
            finally:
                # Close the agent's stream now (not at garbage collection): a client
                # disconnect must cancel running tools promptly.
                aclose = getattr(events, "aclose", None)
                if aclose is not None:
                    await aclose()

    # --- ingestion ------------------------------------------------------------------------------

    async def start_ingest(self, user: AuthUser, request: IngestRequest) -> IngestRun:
        for run in self._runs.values():
            if run.active:
                raise IngestConflict(
                    f"ingestion run {run.state.run_id} is still {run.state.status}; "
                    "wait for it to finish"
                )
        run = _Run(f"ingest-{uuid.uuid4().hex[:12]}")
        self._runs[run.state.run_id] = run
        self._forget_old_runs()
        log.info("ingestion run %s started by %s", run.state.run_id, user.sub)
        run.task = asyncio.create_task(
            self._ingest(run, request), name=f"ingest:{run.state.run_id}"
        )
        return run.state.model_copy(deep=True)

    async def _ingest(self, run: _Run, request: IngestRequest) -> None:
        run.state.status = "running"
        settings = self.settings

        def progress(event: str, done: int, total: int) -> None:
            run.state.progress = {"done": done, "total": total}

        try:
            store = await self.store.get()
            options = IngestOptions(
                roots=[(path, list(acl)) for path, acl in settings.ingestion.doc_root_acls],
                prune=request.prune,
                executor="local",
                embed_actors=settings.ingestion.embed_actors,
                batch_size=settings.embedding.batch_size,
                max_tokens=effective_max_tokens(self.ingest, self.embedder.max_tokens),
            )
            report = await run_ingest(
                store, self.ingest, options, embedder=self.embedder, progress=progress
            )
        except asyncio.CancelledError:
            run.finish("stopped", "the server stopped during the run")
            raise
        except Exception as exc:
            log.warning("ingestion run %s failed", run.state.run_id, exc_info=True)
            run.finish("failed", _describe(exc))
            return
        run.state.counts = report.as_dict()
        run.finish("succeeded")
        log.info("ingestion run %s: %s", run.state.run_id, run.state.counts)

    def _forget_old_runs(self) -> None:
        while len(self._runs) > MAX_TRACKED_RUNS:
            oldest = next((k for k, r in self._runs.items() if not r.active), None)
            if oldest is None:
                return
            del self._runs[oldest]

    async def ingest_status(self, run_id: str) -> IngestRun | None:
        run = self._runs.get(run_id)
        return None if run is None else run.state.model_copy(deep=True)

    # --- conversations --------------------------------------------------------------------------

    @property
    def conversations(self) -> ConversationStore:
        return self._conversations

    async def visible_chunks(self, user: AuthUser, chunk_ids: Collection[str]) -> set[str]:
        return await visible_chunks(self.store, user, chunk_ids)

    # --- readiness ------------------------------------------------------------------------------

    async def readiness(self) -> Readiness:
        checks = await self._database_checks()
        expected = self.settings.embedding.resolved_dim
        dim_ok = self.embedder.dim == expected
        checks.append(
            ReadinessCheck(
                name="embedding_dim",
                ok=dim_ok,
                detail=f"{self.embedder.name} gives {self.embedder.dim}, EMBEDDING_DIM is "
                f"{expected}",
            )
        )
        checks.append(provider_check(self.settings))
        return Readiness(ready=all(check.ok for check in checks), checks=checks)

    async def _database_checks(self) -> list[ReadinessCheck]:
        return await lazy_store_checks(self.store, self.settings)

    # --- lifecycle -----------------------------------------------------------------------------

    async def close(self) -> None:
        tasks = [run.task for run in self._runs.values() if run.task and not run.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for run in self._runs.values():
            if run.active:  # cancelled before it started
                run.finish("stopped", "the server stopped before the run finished")
        for closable in self._closables:
            try:
                await closable.aclose()
            except Exception:
                log.warning("closing %s failed", type(closable).__name__, exc_info=True)
        await self.feedback.close()
        await self._conversations.close()
        await self.limits.close()
        await self.store.close()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
