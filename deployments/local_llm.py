"""The local LLM as a Serve application of its own (route prefix ``/llm`` by default).

Each replica owns one llama.cpp server (``serve_app.local_llm.server.LocalLLMServer``,
in-process through xllamacpp, on 127.0.0.1 and a port llama.cpp picks) and proxies to it:

    POST {prefix}/v1/chat/completions   JSON, or SSE passed through chunk by chunk
    GET  {prefix}/v1/models
    GET  {prefix}/health                 200 when llama.cpp answers its /health

so an OpenAI client points at ``http://127.0.0.1:8000/llm/v1``. Serve's own health check
(``check_health``) probes the same upstream, so a wedged llama.cpp gets its replica
restarted.

Sizing: ``max_ongoing_requests`` is the llama.cpp slot count (``LOCAL_LLM_PARALLEL``) plus one:
a request beyond that waits in Serve's queue (where autoscaling and other replicas can see it),
not inside one replica's llama.cpp queue; the extra one lets a cheap ``/v1/models`` or
``/health`` through while every slot generates. ``num_cpus`` is a fractional reservation
(``LOCAL_LLM_NUM_CPUS``, 0.5): the real CPU use is ``LOCAL_LLM_THREADS``.

Serve config::

    applications:
      - name: llm
        route_prefix: /llm
        import_path: deployments.local_llm:build_local_llm_app
        args: {threads: 2, parallel: 1}      # any LocalLLMSettings field; env vars otherwise
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.local_llm.proxy import UpstreamProxy
from serve_app.local_llm.server import LocalLLMServer
from serve_app.local_llm.settings import LocalLLMSettings
from serve_app.observability.fastapi_telemetry import FASTAPI_TELEMETRY_OFF

APP_NAME = "llm"
DEPLOYMENT_NAME = "LocalLLM"

app = FastAPI(
    title="agent-service local LLM",
    description="llama.cpp's OpenAI-compatible chat endpoint, served from a local GGUF file.",
    docs_url=None,
    redoc_url=None,
    telemetry=FASTAPI_TELEMETRY_OFF,
)


def max_ongoing_for(parallel: int) -> int:
    """``max_ongoing_requests`` for a replica with ``parallel`` llama.cpp slots."""
    return parallel + 1


class LocalLLMReplica:
    """One llama.cpp server per replica, behind an OpenAI-compatible passthrough."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = LocalLLMSettings.from_env({}, **settings)
        # A per-replica key: only this replica's proxy can use llama.cpp's port.
        key = secrets.token_urlsafe(24)
        # Joins the packaged model into <home>/models on first use, then loads it (~2 s).
        self.server = LocalLLMServer.from_settings(self.settings, api_key=key)
        self.server.start()
        self.proxy = UpstreamProxy(
            self.server.base_url, timeout_seconds=self.settings.timeout_seconds, api_key=key
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self.proxy.chat_completions(request)

    @app.get("/v1/models")
    async def models(self) -> Response:
        return await self.proxy.models()

    @app.get("/health")
    async def health(self) -> Response:
        return await self.proxy.health()

    async def check_health(self) -> None:
        """Serve's periodic replica check: raising marks the replica unhealthy."""
        ok, detail = await self.proxy.probe()
        if not ok:
            raise RuntimeError(f"local LLM server unhealthy: {detail}")

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()


# Applied as calls rather than class decorators so type checkers see a ``Deployment``.
LocalLLM: serve.Deployment = serve.deployment(
    name=DEPLOYMENT_NAME,
    num_replicas=1,
    ray_actor_options={"num_cpus": 0.5},
    max_ongoing_requests=max_ongoing_for(1),
    health_check_period_s=10,
    health_check_timeout_s=30,
    graceful_shutdown_wait_loop_s=2,
    graceful_shutdown_timeout_s=30,
)(serve.ingress(app)(LocalLLMReplica))


def build_local_llm_app(args: dict[str, Any] | None = None) -> serve.Application:
    """The Serve application (``import_path: deployments.local_llm:build_local_llm_app``).

    ``args`` take any :class:`LocalLLMSettings` field (``threads``, ``batch_threads``,
    ``context``, ``parallel``, ``model_path``, ``model_name``, ``home``, ``num_cpus``,
    ``timeout_seconds``); the rest comes from the ``LOCAL_LLM_*`` environment. Paths are made
    absolute here, where the working directory is the project's. A serve config's
    ``deployments:`` section still overrides the options set here."""
    settings = LocalLLMSettings.from_env(**dict(args or {})).resolved()
    return LocalLLM.options(
        ray_actor_options={"num_cpus": settings.num_cpus},
        max_ongoing_requests=max_ongoing_for(settings.parallel),
    ).bind(settings.to_dict())


def run_local_llm(
    settings: LocalLLMSettings | None = None, *, name: str = APP_NAME
) -> DeploymentHandle[Any]:
    """Deploy the application on the connected Ray cluster at ``settings.route_prefix`` and
    wait until it is running (the first start joins the model: ~5 s, then loads it: ~2 s)."""
    settings = settings or LocalLLMSettings.from_env()
    application = build_local_llm_app(settings.to_dict())
    return serve.run(application, name=name, route_prefix=settings.route_prefix)
