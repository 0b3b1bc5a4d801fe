"""``create_app``: the HTTP API as a FastAPI app over an ``ApiBackend``.

Routes (all under ``API_PREFIX``, e.g. ``/agent``; OpenAPI at ``{prefix}/docs`` and
``{prefix}/openapi.json``):

* ``POST /ask``: JSON or SSE (``serve_app.api.routes.ask``).
* ``POST /ingest`` (202), ``GET /ingest/{run_id}``: admin only (Cedar ``IngestDocuments``).
* ``GET /conversations``, ``GET|DELETE /conversations/{id}``: the caller's own conversations
  (``serve_app.api.routes.conversations``); ``/ask`` stores its turns in them.
* ``POST /feedback``: a rating of one of the caller's turns (``serve_app.api.routes.feedback``).
* ``GET /healthz``, ``GET /readyz`` (503 with the checks when not ready): no credentials.
* ``GET /ui/``: the chat page (``serve_app.api.routes.ui``; not in the schema).

With a non-empty prefix, ``/healthz``, ``/readyz``, ``/docs`` and ``/openapi.json`` also answer
at the root (out of the schema), for probes and proxies that strip the prefix.

Status codes. Every error body is the envelope ``{"error": {"code", "message"}}`` (see
``serve_app.api.errors``); the ``x-request-id`` response header (the caller's, when sane, or a
new one) identifies the request in the logs.

* 200 an answered ``/ask`` (also ``idk``, ``declined_out_of_scope``, ``tool_loop_exhausted``:
  the run finished; the body says how). 202 ``/ingest`` started.
* 400 ``model_not_allowed`` (override outside a non-empty ``ALLOWED_MODELS``).
* 401 ``unauthenticated`` (missing or invalid claims header or eval token; with
  ``WWW-Authenticate: Bearer``). 403 ``forbidden`` (``/ingest`` below admin) or
  ``model_override_forbidden`` (below ``MODEL_OVERRIDE_MIN_ROLE``).
* 404 ``not_found`` (unknown route, run id, conversation or turn: another caller's
  conversation is the same 404 as an unknown one), 405 ``method_not_allowed``.
* 409 ``ingest_in_progress``; ``conversation_full`` (``CONVERSATION_MAX_TURNS``),
  ``conversation_deleted`` (deleted while its question was answered; nothing stored);
  ``ambiguous_trace_id`` (``/feedback`` by a trace id several of the caller's turns carry).
  413 ``payload_too_large`` (body over ``max_body_bytes``).
* 422 ``validation_error`` with ``fields: [{"field", "message", "type"}]``.
* 429 ``overloaded`` (the backend sheds load; ``Retry-After``); ``rate_limited`` /
  ``budget_exceeded`` (``/ask`` over a ``RATE_LIMIT_*``/``BUDGET_*`` limit: ``Retry-After``,
  the envelope's ``exceeded`` says which; ``serve_app.limits``).
* 500 ``internal_error``: a generic message with the request id; the exception is logged,
  never returned.
* ``/ask`` runs that end in ``provider_error``: 502 (``provider_rejected``, ``malformed_reply``),
  503 (``provider_unavailable``), 504 (the provider timed out); the body is the full
  ``AgentAnswer``, whose ``error`` member is the envelope (plus the provider's
  ``status_code``), so usage and cost stay visible. With ``stream=true`` the same object is
  the data of the stream's final ``error`` event (the status is already 200 by then).
* Backend failures (``BackendError``: e.g. Serve timeouts or back-pressure) -> their status
  (503/504/429) with the envelope; 503 ``conversations_unavailable`` when the conversation
  store's database cannot be reached; 503 ``limits_unavailable`` when the usage limits'
  cannot (and ``LIMITS_FAIL_OPEN`` is false).

No Ray import here: the Serve ingress passes a backend of deployment handles, the
single-process server an in-process one.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from foundation.observability.fastapi_telemetry import FASTAPI_TELEMETRY_OFF
from foundation.settings import Settings
from serve_app.api.errors import install_error_handlers
from serve_app.api.middleware import (
    REQUEST_ID_HEADER,
    BodySizeLimitMiddleware,
    RequestContextMiddleware,
)
from serve_app.api.routes import ask, conversations, feedback, health, ingest
from serve_app.api.routes.ui import install_ui
from serve_app.auth import warn_if_auth_disabled
from serve_app.authz import CedarAuthorizer
from serve_app.backend import ApiBackend
from serve_app.limits import LIMIT_HEADERS

DEFAULT_MAX_BODY_BYTES = 64 * 1024
API_TITLE = "agent-service"
API_VERSION = "0.1.0"
API_DESCRIPTION = (
    "CrowdVision's tool-calling assistant. Authenticate with the mesh's `x-gateway-claims` "
    "header (or, where enabled, an HS256 eval token as `Authorization: Bearer` or the "
    '`authentication_token` cookie). Every error is `{"error": {"code", "message"}}`.'
)


def create_app(
    backend: ApiBackend,
    settings: Settings,
    authorizer: CedarAuthorizer,
    *,
    lifespan: Any = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The API over ``backend``: every route reaches the service through it (its
    conversations, usage limits, feedback store and metrics sink included), by the
    dependencies of ``serve_app.api.deps``. ``lifespan`` (a FastAPI lifespan context) lets
    the caller start and close what the backend holds; the app never closes a backend it
    was given."""
    prefix = settings.http.api_prefix
    app = FastAPI(
        title=API_TITLE,
        version=API_VERSION,
        description=API_DESCRIPTION,
        docs_url=f"{prefix}/docs",
        redoc_url=None,
        openapi_url=f"{prefix}/openapi.json",
        lifespan=lifespan,
        telemetry=FASTAPI_TELEMETRY_OFF,
    )
    app.state.backend = backend
    app.state.settings = settings
    app.state.authorizer = authorizer
    install_error_handlers(app)

    api = APIRouter(prefix=prefix)
    api.include_router(ask.router)
    api.include_router(ingest.router)
    api.include_router(conversations.router)
    api.include_router(feedback.router)
    api.include_router(health.router)
    app.include_router(api)
    if prefix:
        _root_aliases(app, prefix)
    install_ui(app, settings)  # the chat page, {prefix}/ui/ (serve_app.api.routes.ui)

    # Added innermost first: CORS (outermost) -> request id / 500 -> body limit -> routes.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(RequestContextMiddleware)
    if settings.http.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.http.cors_origins),
            allow_credentials=True,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["authorization", "content-type", REQUEST_ID_HEADER],
            expose_headers=[REQUEST_ID_HEADER, "retry-after", *LIMIT_HEADERS],
            max_age=600,
        )
    warn_if_auth_disabled(settings)
    return app


def _root_aliases(app: FastAPI, prefix: str) -> None:
    root = APIRouter(include_in_schema=False)
    root.include_router(health.router)

    @root.get("/openapi.json")
    async def openapi_alias() -> JSONResponse:
        return JSONResponse(app.openapi())

    @root.get("/docs")
    async def docs_alias() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=f"{prefix}/openapi.json", title=f"{API_TITLE} docs")

    app.include_router(root)
