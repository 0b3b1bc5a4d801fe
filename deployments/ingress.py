"""``Ingress`` deployment: the FastAPI app (``serve_app.api``) over a backend made of
deployment handles and the Ray Jobs API.

``/ask`` goes to the ``AgentLoop`` deployment (a streaming handle for SSE, so events flow per
token and a client disconnect cancels the work two hops down); ``/ingest`` submits the
ingestion job as a Ray Job, so it outlives the request and shows in the dashboard;
``/conversations`` and the turns of ``/ask`` use a conversation store the Ingress opens
itself (``serve_app.threads``)."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import sys
import time
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from agent.answer import AgentAnswer, AgentEvent
from agent.request import AgentRequest
from conversations.feedback import FeedbackStore
from conversations.store import ConversationStore
from deployments.metrics import RayServeMetrics
from foundation.identity import AuthUser
from foundation.settings import Settings
from serve_app.api.app import create_app
from serve_app.authz import load_authorizer
from serve_app.backend import (
    BackendError,
    BackendTimeout,
    IngestRequest,
    IngestRun,
    IngestStatus,
)
from serve_app.feedback import feedback_store_for
from serve_app.knowledge import LazyStore
from serve_app.limits import RequestLimits, build_request_limits
from serve_app.metrics import MetricsSink
from serve_app.readiness import Readiness, ReadinessCheck
from serve_app.threads import visible_chunks
from serve_app.wiring import (
    build_conversation_store,
    limit_policy,
    replica_settings,
    store_config,
)

RUN_PREFIX = "ingest-"
JOB_SUBMIT_PATIENCE_S = 30.0
AGENT_LOST = "the agent handling this question stopped (it is being replaced); try again"
AGENT_LOST_RETRY_AFTER_S = 1.0

log = logging.getLogger(__name__)

_JOB_STATUS: dict[str, IngestStatus] = {
    "PENDING": "pending",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "stopped",
}


def ingest_job_env(settings: Settings) -> dict[str, str]:
    """The settings the job needs, made absolute: the job's working directory is Ray's."""
    roots = ",".join(
        f"{path.resolve()}={' '.join(acl)}" for path, acl in settings.ingestion.doc_root_acls
    )
    env = {
        "DOC_ROOTS": roots,
        "AGENT_SERVICE_HOME": str(settings.home),
        "EMBEDDING_BACKEND": settings.embedding.backend,
        "EMBEDDING_MODEL": settings.embedding.model,
        "EMBEDDING_DIM": str(settings.embedding.resolved_dim),
        "HF_HUB_OFFLINE": "1",
    }
    if settings.database.url:
        env["DATABASE_URL"] = settings.database.url
    return env


def parse_job_output(text: str) -> tuple[dict[str, int], dict[str, Any]]:
    """The last progress line and the final report from ``ingest --json-lines`` output."""
    progress: dict[str, int] = {}
    report: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if item.get("event") == "progress":
            progress = {"done": int(item["done"]), "total": int(item["total"])}
        elif item.get("event") == "report":
            report = {k: v for k, v in item.items() if k != "event"}
    return progress, report


class ServeBackend:
    """The ``ApiBackend`` port over deployment handles and the Ray Jobs API."""

    def __init__(
        self,
        agent: DeploymentHandle[Any],
        settings: Settings,
        *,
        conversations: ConversationStore | None = None,
        knowledge: LazyStore | None = None,
        limits: RequestLimits | None = None,
        feedback: FeedbackStore | None = None,
        metrics: MetricsSink | None = None,
    ) -> None:
        self._agent = agent
        self._stream = agent.options(stream=True)
        self._settings = settings
        self._jobs: Any = None
        # The Ingress reaches the database itself for conversations (a pool of its own,
        # opened on first use): a turn is written where the final answer is sent.
        self._conversations = (
            conversations if conversations is not None else build_conversation_store(settings)
        )
        # The knowledge base (a pool of its own, opened on first use), only to re-check a
        # thread's stored citations against the caller's permissions now; searches run in
        # the Retriever deployment.
        self._knowledge = (
            knowledge if knowledge is not None else LazyStore(settings, store_config(settings))
        )
        # The callers' rate limits and budgets, counted in the database every replica shares
        # (a pool of its own, opened on first use; nothing when every limit is off).
        self.limits = (
            limits if limits is not None else build_request_limits(settings, limit_policy(settings))
        )
        # Where /feedback keeps ratings: beside the conversations (a pool of its own, opened
        # on first use).
        self.feedback = (
            feedback if feedback is not None else feedback_store_for(self._conversations, settings)
        )
        # Where the routes count (the replica's Ray metrics; none: not counted).
        self.metrics = metrics

    @property
    def conversations(self) -> ConversationStore:
        return self._conversations

    async def visible_chunks(self, user: AuthUser, chunk_ids: Collection[str]) -> set[str]:
        return await visible_chunks(self._knowledge, user, chunk_ids)

    async def ask(self, request: AgentRequest) -> AgentAnswer:
        # Our own deadline, below Serve's request_timeout_s, so a slow run ends with the
        # error envelope (504) rather than the proxy's plain-text timeout.
        response = self._agent.answer.remote(request)
        try:
            async with asyncio.timeout(self._settings.http.ask_timeout_seconds):
                answer: AgentAnswer = await response
        except TimeoutError:
            response.cancel()  # type: ignore[no-untyped-call]
            raise BackendTimeout(
                f"no answer within {self._settings.http.ask_timeout_seconds:.0f} s; try again"
            ) from None
        except RayActorError as exc:
            # The AgentLoop replica died (or became unreachable) under this request: Serve
            # replaces it and routes new requests elsewhere. Not a bug of ours (500) but a
            # transient unavailability: 503 with Retry-After. Not retried here: the run may
            # already have spent model tokens.
            log.warning("AgentLoop replica lost under /ask: %s", exc)
            raise BackendError(AGENT_LOST, retry_after=AGENT_LOST_RETRY_AFTER_S) from None
        return answer

    async def ask_stream(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        gen = cast(DeploymentResponseGenerator[Any], self._stream.stream.remote(request))
        try:
            async for event in gen:
                yield event
        except RayActorError as exc:
            log.warning("AgentLoop replica lost under a streamed /ask: %s", exc)
            raise BackendError(AGENT_LOST, retry_after=AGENT_LOST_RETRY_AFTER_S) from None
        finally:
            gen.cancel()  # type: ignore[no-untyped-call]  # a client disconnect (or any early exit) stops the work downstream

    def _client(self) -> Any:
        if self._jobs is None:
            from ray.job_submission import JobSubmissionClient

            self._jobs = JobSubmissionClient(self._settings.ray.jobs_address)
        return self._jobs

    async def start_ingest(self, user: AuthUser, request: IngestRequest) -> IngestRun:
        run_id = f"{RUN_PREFIX}{uuid.uuid4().hex[:12]}"
        cmd = [sys.executable, "-m", "serve_app.cli", "ingest", "--json-lines"]
        if request.prune:
            cmd.append("--prune")
        entrypoint = " ".join(shlex.quote(part) for part in cmd)
        # The Jobs API answers "No available agent to submit job, please try again later"
        # while a fresh node's job agent starts: retry that for a while, then a clean 503.
        delay = 0.5
        deadline = time.monotonic() + JOB_SUBMIT_PATIENCE_S
        while True:
            try:
                client = await asyncio.to_thread(self._client)
                await asyncio.to_thread(
                    client.submit_job,
                    entrypoint=entrypoint,
                    submission_id=run_id,
                    runtime_env={"env_vars": ingest_job_env(self._settings)},
                    metadata={"kind": "agent-service-ingest", "submitted_by": user.sub},
                    entrypoint_num_cpus=0,
                )
                break
            except (RuntimeError, ConnectionError) as exc:
                retryable = "try again later" in str(exc) or isinstance(exc, ConnectionError)
                if not retryable or time.monotonic() > deadline:
                    log.warning("ingestion job submission failed: %s", exc)
                    raise BackendError(
                        "the Ray Jobs API did not accept the ingestion job; try again shortly",
                        retry_after=5,
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 4.0)
        return IngestRun(run_id=run_id, status="pending", submitted_at=datetime.now(UTC))

    async def ingest_status(self, run_id: str) -> IngestRun | None:
        if not run_id.startswith(RUN_PREFIX):
            return None
        client = self._client()
        try:
            info = await asyncio.to_thread(client.get_job_info, run_id)
        except RuntimeError:  # the Jobs API answers 404 with a RuntimeError
            return None
        logs = await asyncio.to_thread(client.get_job_logs, run_id)
        progress, report = parse_job_output(logs)
        status = _JOB_STATUS.get(str(info.status), "running")

        def when(ms: int | None) -> datetime | None:
            return datetime.fromtimestamp(ms / 1000, UTC) if ms else None

        message = None
        if status == "failed":
            message = (info.message or "the ingestion job failed")[:500]
        return IngestRun(
            run_id=run_id,
            status=status,
            submitted_at=when(info.start_time),
            finished_at=when(info.end_time),
            progress=progress,
            counts=report,
            message=message,
        )

    async def readiness(self) -> Readiness:
        try:
            async with asyncio.timeout(5):
                checks: list[ReadinessCheck] = await self._agent.readiness.remote()
        except TimeoutError:
            checks = [ReadinessCheck(name="deployments", ok=False, detail="timed out")]
        return Readiness(ready=all(c.ok for c in checks), checks=checks)

    async def close(self) -> None:
        await self.feedback.close()
        await self._conversations.close()
        await self._knowledge.close()
        await self.limits.close()


@serve.deployment(
    name="Ingress",
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=200,
    autoscaling_config={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 64},
)
@serve.ingress()
class IngressDeployment:
    def __init__(self, agent_loop: DeploymentHandle[Any]) -> None:
        self.settings = replica_settings("Ingress")
        self.authorizer = load_authorizer()
        self.metrics = RayServeMetrics()
        limits = build_request_limits(
            self.settings, limit_policy(self.settings), metrics=self.metrics
        )
        self.backend = ServeBackend(agent_loop, self.settings, limits=limits, metrics=self.metrics)

    @asynccontextmanager
    async def _closing(self, app: FastAPI) -> AsyncIterator[None]:
        """The app's lifespan: the backend's pools (conversations, feedback, knowledge base,
        usage limits) are closed when Serve shuts the replica down."""
        try:
            yield
        finally:
            await self.backend.close()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self.backend, self.settings, self.authorizer, lifespan=self._closing)
