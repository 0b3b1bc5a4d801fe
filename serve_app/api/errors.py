"""The error envelope: every error the API returns is ``{"error": {"code", "message"}}``.

``code`` is a stable machine-readable string, ``message`` a human-readable sentence that
never holds a stack trace or a secret. Validation errors (422) add ``fields``: one entry per
bad field (``field``, ``message``, ``type``), never echoing the input.

Codes: 400 ``bad_request`` (and ``model_not_allowed``), 401 ``unauthenticated``, 403
``forbidden`` (and ``model_override_forbidden``), 404 ``not_found``, 405
``method_not_allowed``, 409 ``ingest_in_progress``, ``conversation_full``,
``conversation_deleted``, 413 ``payload_too_large``, 422 ``validation_error``, 429
``overloaded``, ``rate_limited``, ``budget_exceeded`` (with ``exceeded``: what, by whom, the
limit, the use, the window), 500 ``internal_error``, 502/503/504 (see ``serve_app.api.app``:
``provider_rejected``, ``malformed_reply``, ``provider_unavailable``, ``backend_unavailable``,
``conversations_unavailable``, ``timeout``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import compile_path

from serve_app.auth import AuthenticationError
from serve_app.backend import BackendError
from serve_app.model_override import ModelOverrideError

log = logging.getLogger(__name__)

STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "overloaded",
    500: "internal_error",
    502: "bad_gateway",
    503: "unavailable",
    504: "timeout",
}
INTERNAL_ERROR_MESSAGE = "internal server error"
MAX_PATH_CHARS = 200
# FastAPI's 400 for a JSON body ``json.loads`` fails on with anything but a JSONDecodeError:
# bytes that are not UTF-8/16/32 text, or nesting past the parser's depth (RecursionError).
FASTAPI_BODY_PARSE_ERROR = "There was an error parsing the body"


# --- OpenAPI shapes --------------------------------------------------------------------------


class ErrorBody(BaseModel):
    code: str
    message: str


class FieldError(BaseModel):
    field: str
    message: str
    type: str


class ValidationErrorBody(ErrorBody):
    fields: list[FieldError]


class ErrorEnvelope(BaseModel):
    """``{"error": {"code", "message"}}``: the body of every error response."""

    error: ErrorBody


class ValidationErrorEnvelope(BaseModel):
    error: ValidationErrorBody


class ExceededLimit(BaseModel):
    """One usage limit a request went over (``serve_app.limits``)."""

    scope: Literal["user", "domain"]
    subject: str = Field(description="The user's `sub`, or the domain's name.")
    limit: Literal["requests", "tokens", "cost_usd"]
    allowed: float = Field(description="The limit: requests per minute, tokens or USD per period.")
    used: float = Field(description="What was used, this request included for `requests`.")
    window: Literal["minute", "hour", "day", "week", "month"]
    retry_after_s: int


class LimitErrorBody(ErrorBody):
    exceeded: list[ExceededLimit] | None = Field(
        default=None,
        description="`rate_limited` and `budget_exceeded`: each limit the request went over "
        "(absent for `overloaded`).",
    )


class LimitErrorEnvelope(BaseModel):
    """A 429: ``overloaded`` (back-pressure), or a usage limit (``rate_limited``,
    ``budget_exceeded``, with ``exceeded``)."""

    error: LimitErrorBody


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these statuses, all with the envelope."""
    descriptions = {
        400: "Bad request (e.g. a model outside ALLOWED_MODELS)",
        401: "Missing or invalid credentials",
        403: "Authenticated, but not allowed",
        404: "Not found",
        409: "Conflict: an ingestion run is already running (`ingest_in_progress`), or the "
        "conversation is full (`conversation_full`) or was deleted during the run "
        "(`conversation_deleted`)",
        413: "Request body too large",
        422: "Invalid request body or parameters; `fields` names each bad field",
        429: "Overloaded (`overloaded`), or a usage limit reached: `rate_limited` (requests "
        "per minute) or `budget_exceeded` (tokens or cost per period), with `exceeded` "
        "listing each limit; retry after `Retry-After` seconds",
        500: "Internal error (logged with the request id)",
        502: "The model provider rejected the request or sent an unusable reply",
        503: "Unavailable (the model provider, or a dependency)",
        504: "Timed out (the model provider, or the service)",
    }
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        model: type[BaseModel] = ErrorEnvelope
        if status == 422:
            model = ValidationErrorEnvelope
        elif status == 429:
            model = LimitErrorEnvelope
        out[status] = {"model": model, "description": descriptions.get(status, "Error")}
    return out


# --- building responses ------------------------------------------------------------------------


class ApiError(Exception):
    """An error a route raises on purpose; becomes the envelope with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or STATUS_CODES.get(status, "error")
        self.message = message
        self.headers = dict(headers or {})


def envelope(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(
        envelope(code or STATUS_CODES.get(status, "error"), message, **extra),
        status_code=status,
        headers=dict(headers or {}),
    )


def _retry_after(seconds: float | None) -> dict[str, str]:
    if seconds is None:
        return {}
    return {"retry-after": str(max(1, round(seconds)))}


# --- handlers ------------------------------------------------------------------------------------


def _http_message(request: Request, exc: StarletteHTTPException) -> str:
    path = request.url.path[:MAX_PATH_CHARS]
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"no such endpoint: {request.method} {path}"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("allow") or (exc.headers or {}).get("Allow")
        message = f"method {request.method} is not allowed on {path}"
        return f"{message}; allowed: {allowed}" if allowed else message
    if exc.status_code == 413:
        return str(exc.detail)
    if isinstance(exc.detail, str) and exc.detail:
        return exc.detail
    return STATUS_CODES.get(exc.status_code, "error").replace("_", " ")


HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _allowed_methods(request: Request) -> str | None:
    """Every method the schema documents at this path. Starlette's 405 names only the first
    route whose path matches, and a path can have one route per method (``GET`` and
    ``DELETE /conversations/{id}``). None for a path the schema does not hold."""
    app = request.scope.get("app")
    if not isinstance(app, FastAPI):
        return None
    path = request.scope.get("path", "")
    root = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    for template, item in app.openapi().get("paths", {}).items():
        if compile_path(template)[0].match(path):
            methods = sorted(m.upper() for m in item if m in HTTP_METHODS)
            return ", ".join(methods) or None
    return None


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code in (204, 304) or exc.status_code < 200:
        return Response(status_code=exc.status_code, headers=exc.headers)
    if exc.status_code == 400 and exc.detail == FASTAPI_BODY_PARSE_ERROR:
        return _unparseable_body()
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        allowed = _allowed_methods(request)
        if allowed:
            headers = {k: v for k, v in headers.items() if k.lower() != "allow"}
            headers["allow"] = allowed
            exc = StarletteHTTPException(405, exc.detail, headers=headers)
    code = getattr(exc, "code", None) or STATUS_CODES.get(exc.status_code, "error")
    return error_response(exc.status_code, _http_message(request, exc), code=code, headers=headers)


def _field_name(loc: Sequence[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in {"body", "query", "path", "header", "cookie"}:
        source, rest = parts[0], parts[1:]
        if not rest:
            return str(source)
        name = ".".join(str(p) for p in rest)
        return name if source == "body" else f"{source}.{name}"
    return ".".join(str(p) for p in parts) or "request"


def field_errors(errors: Sequence[Any]) -> list[FieldError]:
    """Pydantic/FastAPI error dicts -> ``FieldError`` (the input itself is never echoed)."""
    out: list[FieldError] = []
    for error in errors:
        if not isinstance(error, Mapping):
            continue
        kind = str(error.get("type", "invalid"))
        loc = error.get("loc", ())
        if kind == "json_invalid":
            ctx = error.get("ctx") or {}
            reason = ctx.get("error") if isinstance(ctx, Mapping) else None
            position = loc[1] if isinstance(loc, Sequence) and len(loc) > 1 else None
            message = "the body is not valid JSON"
            if reason:
                message += f" ({reason})"
            if isinstance(position, int):
                message += f" at position {position}"
            out.append(FieldError(field="body", message=message, type=kind))
            continue
        message = str(error.get("msg", "invalid value"))
        if isinstance(loc, Sequence) and list(loc) == ["body"]:
            if kind == "missing":
                message = "a JSON body is required"
            elif kind in ("model_attributes_type", "dict_type", "model_type"):
                message = "expected a JSON object (sent as Content-Type: application/json)"
        out.append(
            FieldError(
                field=_field_name(loc if isinstance(loc, Sequence) else ()),
                message=message,
                type=kind,
            )
        )
    return out


def _unparseable_body() -> Response:
    """A body that is not JSON text at all is a 422 ``json_invalid``, like any other body
    that is not valid JSON (FastAPI's own answer is an undocumented 400)."""
    field = FieldError(
        field="body",
        message="the body is not valid JSON (not UTF-8 text, or nested too deeply)",
        type="json_invalid",
    )
    return error_response(
        422,
        f"invalid request: {field.field}: {field.message}",
        code="validation_error",
        fields=[field.model_dump()],
    )


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    fields = field_errors(exc.errors())
    summary = "; ".join(f"{f.field}: {f.message}" for f in fields) or "invalid request"
    return error_response(
        422,
        f"invalid request: {summary}",
        code="validation_error",
        fields=[f.model_dump() for f in fields],
    )


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, code=exc.code, headers=exc.headers)


async def _authentication_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AuthenticationError)
    return error_response(
        exc.status, exc.message, code=exc.code, headers={"www-authenticate": "Bearer"}
    )


async def _model_override_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ModelOverrideError)
    return error_response(exc.status, str(exc), code=exc.code)


async def _backend_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BackendError)
    if exc.status >= 500:
        log.warning("backend error %s (%s): %s", exc.status, exc.code, exc.message)
    headers = {**exc.headers, **_retry_after(exc.retry_after)}
    return error_response(exc.status, exc.message, code=exc.code, headers=headers, **exc.details)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI and our code raise to the envelope. (Unhandled exceptions
    are turned into the 500 envelope by ``RequestContextMiddleware``, which also logs them.)"""
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(AuthenticationError, _authentication_error)
    app.add_exception_handler(ModelOverrideError, _model_override_error)
    app.add_exception_handler(BackendError, _backend_error)
