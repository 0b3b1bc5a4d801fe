"""Pure ASGI middleware (no ``BaseHTTPMiddleware``: it would buffer streams and hide client
disconnects from the SSE route).

* ``RequestContextMiddleware``: the request id (``x-request-id``: propagated when the caller
  sends a sane one, generated otherwise, always returned), and the last-resort handler that
  turns an unhandled exception into the 500 envelope and logs it with that id.
* ``BodySizeLimitMiddleware``: request bodies over the limit get 413 with the envelope, from
  ``Content-Length`` before the app runs, or while a chunked body is read.
"""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.api.errors import INTERNAL_ERROR_MESSAGE, error_response

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)


def current_request_id() -> str | None:
    """The id of the request being handled (for logs and backends)."""
    return request_id_var.get()


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = Headers(scope=scope).get(REQUEST_ID_HEADER, "")
        request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        token = request_id_var.set(request_id)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception(
                "unhandled error in %s %s (request_id=%s)",
                scope.get("method"),
                scope.get("path"),
                request_id,
            )
            if started:  # too late for an error response: let the server drop the connection
                raise
            response = error_response(
                500,
                f"{INTERNAL_ERROR_MESSAGE}; quote request id {request_id} when reporting it",
            )
            await response(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body passes the limit (FastAPI re-raises
    ``HTTPException`` from body parsing, so the envelope handler answers 413)."""

    code = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body too large: the limit is {limit} bytes")


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared and declared.strip().isdigit() and int(declared) > self.max_bytes:
            error = BodyTooLarge(self.max_bytes)
            response = error_response(413, str(error.detail), code=BodyTooLarge.code)
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)
