"""An HTTP passthrough to an OpenAI-compatible upstream (llama.cpp's server).

The Serve deployment answers on the cluster's HTTP port and forwards to the llama.cpp server
its replica owns: request bodies go up unchanged; JSON replies come back whole; SSE replies
(``stream: true``) come back chunk by chunk as llama.cpp writes them (no buffering, no
re-framing), so first-token latency is the upstream's plus a hop. A client that disconnects
closes the upstream request, which makes llama.cpp stop generating for it.

Errors of the proxy itself use OpenAI's envelope (``{"error": {"message", "type", "code"}}``)
so OpenAI SDKs report them properly: 502 when the upstream cannot be reached, 504 when it
stops answering; upstream errors (400 for a bad schema, ...) pass through as they are.

A reply can also travel as parts (:meth:`UpstreamProxy.chat_completion_parts`: a
:class:`ReplyHead`, then body chunks), which cross a Serve deployment handle; the application's
ingress turns them back into a response with :func:`response_from_parts`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from foundation.observability.fastapi_telemetry import FASTAPI_TELEMETRY_OFF

log = logging.getLogger(__name__)

_FORWARDED_REQUEST_HEADERS = ("content-type", "accept", "traceparent", "tracestate")
_STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def error_body(message: str, kind: str, code: str) -> dict[str, Any]:
    """OpenAI's error envelope."""
    return {"error": {"message": message, "type": kind, "code": code}}


def openai_error(status: int, message: str, kind: str, code: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code), status_code=status)


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The caller's headers that go up: content type, accept and the W3C trace context."""
    return {name: headers[name] for name in _FORWARDED_REQUEST_HEADERS if name in headers}


@dataclass(frozen=True)
class ReplyHead:
    """Status and content type of a reply whose body follows in parts."""

    status: int
    content_type: str
    stream: bool = False


def _error_parts(status: int, message: str, code: str = "bad_gateway") -> tuple[ReplyHead, bytes]:
    kind = "timeout" if code == "timeout" else "upstream_error"
    return ReplyHead(status, "application/json"), json.dumps(
        error_body(message, kind, code)
    ).encode()


async def response_from_parts(
    parts: AsyncIterator[ReplyHead | bytes], headers: Mapping[str, str] | None = None
) -> Response:
    """The HTTP response for a :class:`ReplyHead` followed by body chunks: streamed (SSE,
    chunk by chunk, no buffering) when the head says so, else read whole. ``parts`` is
    closed when the response is done or the client goes away."""
    extra = dict(headers or {})
    try:
        head = await anext(parts)
    except BaseException:
        await _aclose(parts)
        raise
    if not isinstance(head, ReplyHead):
        await _aclose(parts)
        raise TypeError(f"a reply must start with its ReplyHead, got {type(head).__name__}")
    if head.stream:
        return StreamingResponse(
            _body_of(parts),
            status_code=head.status,
            media_type=head.content_type,
            headers={**_STREAM_HEADERS, **extra},
        )
    data = b"".join([chunk async for chunk in _body_of(parts)])
    return Response(data, status_code=head.status, media_type=head.content_type, headers=extra)


async def _body_of(parts: AsyncIterator[ReplyHead | bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in parts:
            if isinstance(chunk, bytes | bytearray | memoryview):
                yield bytes(chunk)
    finally:
        # Also runs when the client goes away (the generator is closed or cancelled).
        await _aclose(parts)


async def _aclose(parts: AsyncIterator[Any]) -> None:
    close = getattr(parts, "aclose", None)
    if close is not None:
        await close()


class UpstreamProxy:
    """Forwards chat completions, the model list and health to ``base_url``.

    Only ``content-type``, ``accept`` and the W3C trace headers of the caller go up; the
    upstream is authenticated with ``api_key`` (the per-replica key the llama.cpp server was
    started with), never with the caller's credentials."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float = 600.0,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # The caller's own credentials are never forwarded; the upstream gets this key.
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout_seconds, connect=5.0),
            # Idle connections expire before llama.cpp's keep-alive timeout (5 s) does.
            limits=httpx.Limits(
                max_connections=64, max_keepalive_connections=8, keepalive_expiry=2.0
            ),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    # ----------------------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``: JSON or SSE, whatever the upstream answers."""
        body = await request.body()
        return await response_from_parts(
            self.chat_completion_parts(body, forwarded_headers(request.headers))
        )

    async def chat_completion_parts(
        self, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[ReplyHead | bytes]:
        """``POST /v1/chat/completions`` as parts that cross a Serve handle: one
        :class:`ReplyHead`, then the body in chunks as they arrive (one chunk for JSON).
        ``headers`` are the caller's, already limited by :func:`forwarded_headers`. Closing
        the generator early closes the upstream request."""
        sent = dict(headers)
        sent.setdefault("content-type", "application/json")
        # A fresh loopback connection per completion (~0.1 ms): llama.cpp's HTTP server closes
        # the connection after a streamed reply although it announced keep-alive, and a pooled
        # connection reused right after one failed ~3 times in 10 ("Server disconnected").
        sent["connection"] = "close"
        upstream_request = self._client.build_request(
            "POST", "/v1/chat/completions", content=body, headers=sent
        )
        try:
            upstream = await self._client.send(upstream_request, stream=True)
        except httpx.TimeoutException:
            for part in _error_parts(504, "the local model did not answer in time", "timeout"):
                yield part
            return
        except httpx.HTTPError as exc:
            log.warning("local LLM upstream unreachable: %s", exc)
            for part in _error_parts(502, "the local model server is unreachable"):
                yield part
            return
        content_type = upstream.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            try:
                yield ReplyHead(upstream.status_code, "text/event-stream", stream=True)
                try:
                    async for chunk in upstream.aiter_bytes():
                        yield chunk
                except httpx.HTTPError as exc:
                    # Headers are gone already: end the stream with an SSE error event.
                    log.warning("local LLM stream broke: %s", exc)
                    error = error_body(
                        "the local model stream broke off", "upstream_error", "bad_gateway"
                    )
                    yield f"data: {json.dumps(error)}\n\n".encode()
            finally:
                # Also runs when the caller goes away (the generator is closed or cancelled):
                # closing the upstream connection makes llama.cpp drop the generation.
                await upstream.aclose()
            return
        try:
            data = await upstream.aread()
        except httpx.TimeoutException:
            for part in _error_parts(504, "the local model did not answer in time", "timeout"):
                yield part
            return
        except httpx.HTTPError as exc:
            log.warning("local LLM upstream failed mid-reply: %s", exc)
            for part in _error_parts(502, "the local model server failed mid-reply"):
                yield part
            return
        finally:
            await upstream.aclose()
        yield ReplyHead(upstream.status_code, content_type or "application/json")
        yield data

    async def models(self) -> Response:
        """``GET /v1/models``."""
        return await self._get("/v1/models")

    async def model_entries(self) -> list[dict[str, Any]]:
        """The ``data`` entries of the upstream's ``GET /v1/models`` (``[]`` when it does not
        answer with a model list)."""
        try:
            response = await self._client.get("/v1/models", timeout=10.0)
            entries = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return []
        if not isinstance(entries, list):
            return []
        return [entry for entry in entries if isinstance(entry, dict)]

    async def health(self) -> Response:
        """``GET /health``: 200 ``{"status": "ok"}`` when the upstream is healthy, else 503."""
        ok, detail = await self.probe()
        if ok:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable", "detail": detail}, status_code=503)

    async def probe(self, wait_seconds: float = 5.0) -> tuple[bool, str]:
        """(healthy, detail) from the upstream's ``GET /health``."""
        try:
            response = await self._client.get("/health", timeout=wait_seconds)
        except httpx.HTTPError as exc:
            return False, f"unreachable: {type(exc).__name__}"
        if response.status_code != 200:
            return False, f"upstream /health answered {response.status_code}"
        return True, "ok"

    async def _get(self, path: str) -> Response:
        try:
            upstream = await self._client.get(path, timeout=10.0)
        except httpx.HTTPError:
            return openai_error(
                502, "the local model server is unreachable", "upstream_error", "bad_gateway"
            )
        return Response(
            upstream.content,
            status_code=upstream.status_code,
            media_type=upstream.headers.get("content-type", "application/json"),
        )


def create_proxy_app(proxy: UpstreamProxy) -> FastAPI:
    """The deployment's routes as a plain FastAPI app (no Ray): for tests, and for serving an
    ``UpstreamProxy`` from a single process."""
    app = FastAPI(
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        telemetry=FASTAPI_TELEMETRY_OFF,
    )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.chat_completions(request)

    @app.get("/v1/models")
    async def models() -> Response:
        return await proxy.models()

    @app.get("/health")
    async def health() -> Response:
        return await proxy.health()

    return app
