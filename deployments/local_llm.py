"""The local LLM as a Serve application of its own (route prefix ``/llm`` by default).

One ``LocalLLM-<model>`` deployment per served model (``LOCAL_LLM_MODELS``; one model unless
set): each replica owns one llama.cpp server for its model
(``serve_app.local_llm.server.LocalLLMServer``, in-process through xllamacpp, on 127.0.0.1 and
a port llama.cpp picks). The ingress, ``LocalLLMRouter``, routes by the request body's
``model`` (``serve_app.local_llm.router``: case-insensitive, ``local/`` prefix optional, none
= the first model, an unknown one = 404 ``model_not_found``):

    POST {prefix}/v1/chat/completions   JSON, or SSE passed through chunk by chunk
    GET  {prefix}/v1/models             every served model
    GET  {prefix}/health                200 when every model's llama.cpp answers its /health

so an OpenAI client points at ``http://127.0.0.1:8000/llm/v1`` and picks the model per
request. A reply crosses the handle as parts (a head, then body chunks); a client that goes
away cancels the model's generator, which closes its llama.cpp request. Serve's own health
check (``check_health``) of a model replica probes its llama.cpp, so a wedged one gets its
replica restarted.

Sizing: the router lets ``LOCAL_LLM_PARALLEL`` chat completions per model through at once;
the rest wait in the router, the earliest ``/ask`` first (``serve_app.local_llm.slots``: an
ask under way finishes before a newer one takes the model), not inside llama.cpp's queue. A
model deployment's ``max_ongoing_requests`` is its slot count plus one, so a cheap
``/v1/models`` or ``/health`` probe gets through while every slot generates. (A serve config
that gives a model several replicas should raise ``parallel`` to the total slot count.)
``num_cpus`` is a fractional reservation per model replica (``LOCAL_LLM_NUM_CPUS``, 0.5): the
real CPU use is ``LOCAL_LLM_THREADS``. The router only relays (0.05 CPU).

Serve config::

    applications:
      - name: llm
        route_prefix: /llm
        import_path: deployments.local_llm:build_local_llm_app
        args: {threads: 1, models: "qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct"}
        # any LocalLLMSettings field; env vars otherwise. Per-model deployment options:
        # deployments: [{name: LocalLLM-qwen2.5-coder-0.5b-instruct, ...}]
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from foundation.observability.fastapi_telemetry import FASTAPI_TELEMETRY_OFF
from serve_app.local_llm.proxy import ReplyHead, UpstreamProxy
from serve_app.local_llm.router import ModelBackend, ModelRouter, RoutedLLM
from serve_app.local_llm.server import LocalLLMServer
from serve_app.local_llm.settings import LocalLLMSettings

APP_NAME = "llm"
DEPLOYMENT_NAME = "LocalLLM"
ROUTER_DEPLOYMENT_NAME = "LocalLLMRouter"

app = FastAPI(
    title="agent-service local LLM",
    description="llama.cpp's OpenAI-compatible chat endpoint over local GGUF models, one "
    "picked per request by its `model`.",
    docs_url=None,
    redoc_url=None,
    telemetry=FASTAPI_TELEMETRY_OFF,
)


def max_ongoing_for(parallel: int) -> int:
    """``max_ongoing_requests`` for a replica with ``parallel`` llama.cpp slots."""
    return parallel + 1


def deployment_name_for(model_name: str) -> str:
    """The deployment serving ``model_name``: ``LocalLLM-<name>`` (characters other than
    letters, digits, ``.``, ``_`` and ``-`` become ``-``)."""
    return f"{DEPLOYMENT_NAME}-{re.sub(r'[^A-Za-z0-9._-]', '-', model_name.strip())}"


class LocalLLMReplica:
    """One llama.cpp server per replica, for one model, answering through its handle."""

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

    async def chat_completion_parts(
        self, body: bytes, headers: dict[str, str]
    ) -> AsyncIterator[ReplyHead | bytes]:
        # Called through a streaming handle; cancelling it closes the llama.cpp request.
        async for part in self.proxy.chat_completion_parts(body, headers):
            yield part

    async def model_entries(self) -> list[dict[str, Any]]:
        return await self.proxy.model_entries()

    async def probe(self) -> tuple[bool, str]:
        return await self.proxy.probe()

    async def check_health(self) -> None:
        """Serve's periodic replica check: raising marks the replica unhealthy."""
        ok, detail = await self.proxy.probe()
        if not ok:
            raise RuntimeError(f"local LLM server unhealthy: {detail}")

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()


class HandleBackend:
    """The router's ``ModelBackend`` port over a ``LocalLLM-<model>`` deployment handle."""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self._handle = handle
        self._stream = handle.options(stream=True)

    async def chat_completion_parts(
        self, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[ReplyHead | bytes]:
        gen = cast(
            DeploymentResponseGenerator[Any],
            self._stream.chat_completion_parts.remote(body, dict(headers)),
        )
        try:
            async for part in gen:
                yield part
        finally:
            gen.cancel()  # type: ignore[no-untyped-call]  # a client that went away stops llama.cpp

    async def model_entries(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = await self._handle.model_entries.remote()
        return entries

    async def probe(self) -> tuple[bool, str]:
        try:
            result: tuple[bool, str] = await self._handle.probe.remote()
        except Exception as exc:  # a dead or restarting replica
            return False, f"unreachable: {type(exc).__name__}"
        return result


class LocalLLMRouterIngress:
    """The application's HTTP face: routes each request to its model's deployment."""

    def __init__(
        self, names: list[str], slots: dict[str, int], *models: DeploymentHandle[Any]
    ) -> None:
        backends: list[tuple[str, ModelBackend]] = [
            (name, HandleBackend(handle)) for name, handle in zip(names, models, strict=True)
        ]
        # One router replica, so one queue per model: the earliest ask goes first.
        self.routes = RoutedLLM(ModelRouter(backends), slots)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self.routes.chat_completions(request)

    @app.get("/v1/models")
    async def models(self) -> Response:
        return await self.routes.models()

    @app.get("/health")
    async def health(self) -> Response:
        return await self.routes.health()


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
)(LocalLLMReplica)

LocalLLMRouter: serve.Deployment = serve.deployment(
    name=ROUTER_DEPLOYMENT_NAME,
    num_replicas=1,
    ray_actor_options={"num_cpus": 0.05},
    # It only relays: requests beyond a model's slots wait here, earliest ask first
    # (serve_app.local_llm.slots); one replica, so that order holds for every caller.
    max_ongoing_requests=200,
)(serve.ingress(app)(LocalLLMRouterIngress))


def build_local_llm_app(args: dict[str, Any] | None = None) -> serve.Application:
    """The Serve application (``import_path: deployments.local_llm:build_local_llm_app``).

    ``args`` take any :class:`LocalLLMSettings` field (``models``, ``threads``,
    ``batch_threads``, ``context``, ``parallel``, ``model_path``, ``model_name``, ``home``,
    ``num_cpus``, ``timeout_seconds``); the rest comes from the ``LOCAL_LLM_*`` environment.
    Paths are made absolute here, where the working directory is the project's. A serve
    config's ``deployments:`` section still overrides the options set here."""
    settings = LocalLLMSettings.from_env(**dict(args or {})).resolved()
    models = [
        LocalLLM.options(
            name=deployment_name_for(name),
            ray_actor_options={"num_cpus": settings.num_cpus},
            max_ongoing_requests=max_ongoing_for(settings.parallel),
        ).bind(settings.for_model(name).to_dict())
        for name in settings.served_models
    ]
    slots = {name: settings.for_model(name).parallel for name in settings.served_models}
    return LocalLLMRouter.bind(list(settings.served_models), slots, *models)


def run_local_llm(
    settings: LocalLLMSettings | None = None, *, name: str = APP_NAME
) -> DeploymentHandle[Any]:
    """Deploy the application on the connected Ray cluster at ``settings.route_prefix`` and
    wait until it is running (the first start joins each model: ~5 s, then loads it: ~2 s)."""
    settings = settings or LocalLLMSettings.from_env()
    application = build_local_llm_app(settings.to_dict())
    return serve.run(application, name=name, route_prefix=settings.route_prefix)
