"""Several local models behind one OpenAI-compatible base URL, picked per request.

The local LLM application serves each of its models (``LOCAL_LLM_MODELS``) from a deployment
of its own; its ingress routes by the request body's ``model``, so one base URL
(``http://127.0.0.1:8000/llm/v1``) serves them all and a client picks one per request, as the
agent's answer-model override does:

* ``POST /v1/chat/completions``: to the model the body names, compared case-insensitively and
  with or without the agent's ``local/`` prefix (``local/qwen2.5-coder-0.5b-instruct`` is
  ``qwen2.5-coder-0.5b-instruct``); no ``model`` (or an empty one): the first model. A model
  not served here: 404 in OpenAI's shape (``code: model_not_found``, the message lists the
  served models). The body goes up unchanged and the reply comes back as the model's server
  wrote it (JSON whole, SSE chunk by chunk); the ``x-local-llm-model`` header names the model
  that answered.
* ``GET /v1/models``: every served model (with what llama.cpp tells about it).
* ``GET /health``: 200 only when every model's server is healthy, else 503 naming the sick.

Plain Python over the :class:`ModelBackend` port, so it runs without Ray: the Serve ingress
wraps Serve deployment handles, the tests wrap :class:`~serve_app.local_llm.proxy.UpstreamProxy`
objects pointing at fake servers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from typing import Any, Generic, Protocol, TypeVar

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from foundation.observability.fastapi_telemetry import FASTAPI_TELEMETRY_OFF
from serve_app.local_llm.proxy import (
    ReplyHead,
    forwarded_headers,
    openai_error,
    response_from_parts,
)
from serve_app.local_llm.settings import canonical_model_name
from serve_app.local_llm.slots import SlotGate, priority_of

MODEL_HEADER = "x-local-llm-model"
"""Response header naming the served model that answered a chat completion."""


class ModelBackend(Protocol):
    """One served model: a chat completion as reply parts, its model-list entries, health."""

    def chat_completion_parts(
        self, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[ReplyHead | bytes]: ...

    async def model_entries(self) -> list[dict[str, Any]]: ...

    async def probe(self) -> tuple[bool, str]: ...


B = TypeVar("B")


class ModelNotServedError(LookupError):
    """A request named a model that is not served here."""

    def __init__(self, requested: str, served: Sequence[str]) -> None:
        self.requested = requested
        self.served = tuple(served)
        super().__init__(
            f"the model {requested!r} is not served here; served models: "
            f"{', '.join(self.served)} (a 'local/' prefix is optional)"
        )


class InvalidModelFieldError(ValueError):
    """The body's ``model`` is neither a string nor null."""


class ModelRouter(Generic[B]):
    """Served model names (the first is the default) to their backends."""

    def __init__(self, backends: Sequence[tuple[str, B]]) -> None:
        if not backends:
            raise ValueError("a model router needs at least one model")
        self._backends = list(backends)
        self._by_key: dict[str, tuple[str, B]] = {}
        for name, backend in self._backends:
            key = canonical_model_name(name)
            if not key:
                raise ValueError("a served model needs a name")
            if key in self._by_key:
                raise ValueError(f"two served models are named {name!r}")
            self._by_key[key] = (name, backend)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._backends)

    @property
    def backends(self) -> list[tuple[str, B]]:
        return list(self._backends)

    @property
    def default(self) -> tuple[str, B]:
        return self._backends[0]

    def select(self, requested: str | None) -> tuple[str, B]:
        """The served model a request for ``requested`` goes to (``None`` or blank: the
        default); :class:`ModelNotServedError` when none matches."""
        if requested is None or not requested.strip():
            return self.default
        found = self._by_key.get(canonical_model_name(requested))
        if found is None:
            raise ModelNotServedError(requested, self.names)
        return found


def requested_model(body: bytes) -> str | None:
    """The ``model`` a chat-completion body names; ``None`` when it names none, or when the
    body is not a JSON object (the model's server then reports what is wrong with it).
    :class:`InvalidModelFieldError` when ``model`` is not a string."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    model = data.get("model")
    if model is None or isinstance(model, str):
        return model
    raise InvalidModelFieldError(f"'model' must be a string, got {type(model).__name__}")


class RoutedLLM:
    """The application's routes over a :class:`ModelRouter` of :class:`ModelBackend`.

    ``slots`` (model name -> its llama.cpp slot count, 1 when absent) bounds the chat
    completions each model runs at once; the rest wait here, earliest ask first
    (:mod:`serve_app.local_llm.slots`)."""

    def __init__(
        self, router: ModelRouter[ModelBackend], slots: Mapping[str, int] | None = None
    ) -> None:
        self.router = router
        self.gates = {name: SlotGate((slots or {}).get(name, 1)) for name in router.names}

    async def chat_completions(self, request: Request) -> Response:
        body = await request.body()
        try:
            name, backend = self.router.select(requested_model(body))
        except ModelNotServedError as exc:
            return openai_error(404, str(exc), "invalid_request_error", "model_not_found")
        except InvalidModelFieldError as exc:
            return openai_error(400, str(exc), "invalid_request_error", "invalid_model")
        parts = self._in_turn(name, backend, body, request.headers)
        return await response_from_parts(parts, {MODEL_HEADER: name})

    async def _in_turn(
        self, name: str, backend: ModelBackend, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[ReplyHead | bytes]:
        """The model's reply, once a slot is ours; the slot is held until the reply ends."""
        async with self.gates[name].slot(priority_of(headers)):
            parts = backend.chat_completion_parts(body, forwarded_headers(headers))
            async with aclosing(parts):  # type: ignore[type-var]
                async for part in parts:
                    yield part

    async def models(self) -> Response:
        backends = self.router.backends
        found = await asyncio.gather(
            *(backend.model_entries() for _, backend in backends), return_exceptions=True
        )
        created = int(time.time())
        data: list[dict[str, Any]] = []
        for (name, _), entries in zip(backends, found, strict=True):
            upstream = entries[0] if isinstance(entries, list) and entries else {}
            entry: dict[str, Any] = {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "llamacpp",
            }
            entry.update({k: v for k, v in upstream.items() if k != "id"})
            data.append(entry)
        return JSONResponse({"object": "list", "data": data})

    async def probe(self) -> tuple[bool, dict[str, str]]:
        """(every model healthy, model name -> ``ok`` or what is wrong)."""
        backends = self.router.backends
        results = await asyncio.gather(
            *(backend.probe() for _, backend in backends), return_exceptions=True
        )
        details: dict[str, str] = {}
        healthy = True
        for (name, _), result in zip(backends, results, strict=True):
            if isinstance(result, BaseException):
                ok, detail = False, f"unreachable: {type(result).__name__}"
            else:
                ok, detail = result
            healthy = healthy and ok
            details[name] = "ok" if ok else detail
        return healthy, details

    async def health(self) -> Response:
        """200 ``{"status": "ok", "models": {...}}`` when every model is healthy, else 503."""
        healthy, details = await self.probe()
        if healthy:
            return JSONResponse({"status": "ok", "models": details})
        sick = "; ".join(f"{name}: {detail}" for name, detail in details.items() if detail != "ok")
        return JSONResponse(
            {"status": "unavailable", "detail": sick, "models": details}, status_code=503
        )


def create_router_app(routes: RoutedLLM) -> FastAPI:
    """The application's routes as a plain FastAPI app (no Ray), for tests and single-process
    use."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, telemetry=FASTAPI_TELEMETRY_OFF)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await routes.chat_completions(request)

    @app.get("/v1/models")
    async def models() -> Response:
        return await routes.models()

    @app.get("/health")
    async def health() -> Response:
        return await routes.health()

    return app
