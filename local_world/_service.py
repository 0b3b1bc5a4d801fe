"""Plumbing shared by the twin and sensor simulators: the error envelope, caller claims,
fault injection, the request log and the loopback-only control endpoints."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from local_world.claims import HEADER, Claims, ClaimsError, parse_claims

# The simulators stand in for other services: they do not add spans to the agent's traces.
FASTAPI_TELEMETRY_OFF: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
}

SECRET_HEADERS = frozenset(
    {"authorization", "cookie", "set-cookie", "proxy-authorization", "x-api-key", "api-key"}
)
REDACTED = "[redacted]"
GARBAGE_BODY = b'[{"buildingId": "bld-northwind-harbor", "roomId": "room-harb'
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", "testclient"})


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


class ApiError(Exception):
    """Raised by handlers; rendered as the JSON error envelope."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def not_found(kind: str) -> ApiError:
    """The one 404 for both "does not exist" and "you may not see it" (no existence oracle)."""
    return ApiError(404, "not_found", f"{kind} not found")


def caller(request: Request) -> Claims:
    """The caller's claims from ``x-gateway-claims``; 401 when missing or invalid."""
    header = request.headers.get(HEADER)
    if header is None:
        raise ApiError(401, "unauthenticated", f"missing {HEADER} header")
    try:
        return parse_claims(header)
    except ClaimsError as exc:
        raise ApiError(401, "unauthenticated", f"invalid {HEADER} header") from exc


@dataclass
class Faults:
    """Fault-injection knobs. ``path_prefix`` limits every fault to matching paths."""

    fail_rate: float = 0.0
    latency_ms: int = 0
    garbage: bool = False
    leak_foreign_rooms: bool = False
    leak_foreign_buildings: bool = False
    path_prefix: str | None = None


class FaultsPatch(BaseModel):
    """Body of ``POST /_control``: any subset of the knobs, or ``reset``."""

    model_config = ConfigDict(extra="forbid")

    fail_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    latency_ms: int | None = Field(default=None, ge=0, le=600_000)
    garbage: bool | None = None
    leak_foreign_rooms: bool | None = None
    leak_foreign_buildings: bool | None = None
    path_prefix: str | None = None
    reset: bool = False


@dataclass(frozen=True)
class LoggedRequest:
    seq: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    sub: str | None
    status: int | None
    received_at: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def redact_headers(headers: Any) -> dict[str, str]:
    return {
        key.lower(): (REDACTED if key.lower() in SECRET_HEADERS else value)
        for key, value in headers.items()
    }


class ServiceControl:
    """Per-app mutable state: faults and the request log. Thread-safe, because tests drive it
    from the test thread while the app runs in a server thread."""

    def __init__(
        self, name: str, faults: Faults | None = None, *, seed: int = 0, world: str | None = None
    ) -> None:
        self.name = name
        self.world = world  # the name of the world served (``GET /_control`` shows it)
        self._initial = dataclasses.replace(faults) if faults else Faults()
        self.faults = dataclasses.replace(self._initial)
        self._rng = random.Random(seed)
        self._log: list[LoggedRequest] = []
        self._lock = threading.Lock()

    # --- faults -----------------------------------------------------------------------------

    def set_faults(self, **changes: Any) -> Faults:
        with self._lock:
            self.faults = dataclasses.replace(self.faults, **changes)
            return self.faults

    def reset_faults(self) -> Faults:
        """Back to the faults the app was constructed with."""
        with self._lock:
            self.faults = dataclasses.replace(self._initial)
            return self.faults

    def applies_to(self, path: str) -> bool:
        prefix = self.faults.path_prefix
        return prefix is None or path.startswith(prefix)

    def roll_failure(self) -> bool:
        with self._lock:
            rate = self.faults.fail_rate
            return rate > 0.0 and self._rng.random() < rate

    # --- request log --------------------------------------------------------------------------

    def record(self, request: Request) -> int:
        sub: str | None
        try:
            sub = parse_claims(request.headers.get(HEADER)).sub
        except ClaimsError:
            sub = None
        with self._lock:
            seq = len(self._log)
            self._log.append(
                LoggedRequest(
                    seq=seq,
                    method=request.method,
                    path=request.url.path,
                    query=request.url.query,
                    headers=redact_headers(request.headers),
                    sub=sub,
                    status=None,
                    received_at=time.time(),
                )
            )
            return seq

    def finish(self, seq: int, status: int) -> None:
        with self._lock:
            if seq < len(self._log) and self._log[seq].seq == seq:
                self._log[seq] = dataclasses.replace(self._log[seq], status=status)

    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._log)

    def paths(self) -> list[str]:
        return [entry.path for entry in self.requests()]

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()


def get_control(app: FastAPI) -> ServiceControl:
    """The :class:`ServiceControl` of an app built by one of the factories."""
    control = getattr(app.state, "control", None)
    if not isinstance(control, ServiceControl):
        raise TypeError("app was not built by a local_world factory")
    return control


def _is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def require_loopback(request: Request) -> None:
    if not _is_loopback(request):
        raise ApiError(403, "forbidden", "control endpoints are loopback-only")


def install(app: FastAPI, control: ServiceControl) -> None:
    """Error handlers, the fault/log middleware and ``/_control``, ``/_requests``, ``/healthz``."""
    app.state.control = control

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.message)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(400, "invalid_request", f"{where}: {first.get('msg', 'invalid')}")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)

    @app.middleware("http")
    async def faults_and_log(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        path = request.url.path
        if path.startswith("/_") or path == "/healthz":
            return await call_next(request)
        seq = control.record(request)
        faults = control.faults
        if control.applies_to(path):
            if faults.latency_ms:
                await asyncio.sleep(faults.latency_ms / 1000.0)
            if control.roll_failure():
                control.finish(seq, 500)
                return error_response(500, "internal", "injected failure")
            if faults.garbage:
                control.finish(seq, 200)
                return Response(GARBAGE_BODY, status_code=200, media_type="application/json")
        response = await call_next(request)
        control.finish(seq, response.status_code)
        return response

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": control.name}

    @app.get("/_control")
    async def read_control(request: Request) -> dict[str, Any]:
        require_loopback(request)
        return {
            "service": control.name,
            "world": control.world,
            "faults": dataclasses.asdict(control.faults),
        }

    @app.post("/_control")
    async def write_control(request: Request, patch: FaultsPatch) -> dict[str, Any]:
        require_loopback(request)
        if not caller(request).is_admin:
            raise ApiError(403, "forbidden", "control requires the admin role")
        if patch.reset:
            control.reset_faults()
        changes = {
            key: value
            for key, value in patch.model_dump(exclude_unset=True, exclude={"reset"}).items()
            if value is not None or key == "path_prefix"
        }
        faults = control.set_faults(**changes)
        return {"service": control.name, "faults": dataclasses.asdict(faults)}

    @app.get("/_requests")
    async def read_requests(request: Request) -> dict[str, Any]:
        require_loopback(request)
        return {"requests": [entry.to_json() for entry in control.requests()]}

    @app.delete("/_requests", status_code=204)
    async def clear_requests(request: Request) -> Response:
        require_loopback(request)
        control.clear_requests()
        return Response(status_code=204)
