"""An HTTP passthrough to an OpenAI-compatible upstream (llama.cpp's server).

The Serve deployment answers on the cluster's HTTP port and forwards to the llama.cpp server
its replica owns: request bodies go up unchanged; JSON replies come back whole; SSE replies
(``stream: true``) come back chunk by chunk as llama.cpp writes them (no buffering, no
re-framing), so first-token latency is the upstream's plus a hop. A client that disconnects
closes the upstream request, which makes llama.cpp stop generating for it.

Errors of the proxy itself use OpenAI's envelope (``{"error": {"message", "type", "code"}}``)
so OpenAI SDKs report them properly: 502 when the upstream cannot be reached, 504 when it
stops answering; upstream errors (400 for a bad schema, ...) pass through as they are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from serve_app.observability.fastapi_telemetry import FASTAPI_TELEMETRY_OFF

log = logging.getLogger(__name__)

_FORWARDED_REQUEST_HEADERS = ("content-type", "accept", "traceparent", "tracestate")
_STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def openai_error(status: int, message: str, kind: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": code}}, status_code=status
    )


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
        headers = {
            name: request.headers[name]
            for name in _FORWARDED_REQUEST_HEADERS
            if name in request.headers
        }
        headers.setdefault("content-type", "application/json")
        # A fresh loopback connection per completion (~0.1 ms): llama.cpp's HTTP server closes
        # the connection after a streamed reply although it announced keep-alive, and a pooled
        # connection reused right after one failed ~3 times in 10 ("Server disconnected").
        headers["connection"] = "close"
        upstream_request = self._client.build_request(
            "POST", "/v1/chat/completions", content=body, headers=headers
        )
        try:
            upstream = await self._client.send(upstream_request, stream=True)
        except httpx.TimeoutException:
            return openai_error(504, "the local model did not answer in time", "timeout", "timeout")
        except httpx.HTTPError as exc:
            log.warning("local LLM upstream unreachable: %s", exc)
            return openai_error(
                502, "the local model server is unreachable", "upstream_error", "bad_gateway"
            )
        content_type = upstream.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            return StreamingResponse(
                self._relay(upstream),
                status_code=upstream.status_code,
                media_type="text/event-stream",
                headers=_STREAM_HEADERS,
            )
        try:
            data = await upstream.aread()
        except httpx.TimeoutException:
            return openai_error(504, "the local model did not answer in time", "timeout", "timeout")
        except httpx.HTTPError as exc:
            log.warning("local LLM upstream failed mid-reply: %s", exc)
            return openai_error(
                502, "the local model server failed mid-reply", "upstream_error", "bad_gateway"
            )
        finally:
            await upstream.aclose()
        return Response(
            data, status_code=upstream.status_code, media_type=content_type or "application/json"
        )

    async def _relay(self, upstream: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_bytes():
                yield chunk
        except httpx.HTTPError as exc:
            # Headers are gone already: end the stream with an SSE error event.
            log.warning("local LLM stream broke: %s", exc)
            error = {
                "error": {
                    "message": "the local model stream broke off",
                    "type": "upstream_error",
                    "code": "bad_gateway",
                }
            }
            yield f"data: {json.dumps(error)}\n\n".encode()
        finally:
            # Also runs when the client goes away (the generator is closed or cancelled):
            # closing the upstream connection makes llama.cpp drop the generation.
            await upstream.aclose()

    async def models(self) -> Response:
        """``GET /v1/models``."""
        return await self._get("/v1/models")

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
