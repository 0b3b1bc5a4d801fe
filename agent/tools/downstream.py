"""Calls to twin-service and sensor-service, always as the asking user.

One shared ``httpx.AsyncClient`` (timeout ``TWIN_TIMEOUT_SECONDS``) per process. Every request
carries the caller's ``x-gateway-claims`` (``auth_headers``): forwarded as received from the
mesh, or, for an eval-token user, built from the same flat roles/domains. There is no service
account. Failures become ``DownstreamError`` (a ``ToolError``) with a message the model can act
on; ``NotFoundError`` is the one answer for "unknown" and "not yours" alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Literal
from urllib.parse import quote

import httpx
from pydantic import JsonValue

from agent.tools.errors import ToolError
from foundation.identity import AuthUser

log = logging.getLogger(__name__)

Service = Literal["twin-service", "sensor-service"]
MAX_MESSAGE_CHARS = 200


class DownstreamError(ToolError):
    def __init__(self, service: Service, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.service = service
        self.status = status


class NotFoundError(DownstreamError):
    """404: unknown, or not visible to the caller (the services do not say which)."""


def auth_headers(user: AuthUser) -> dict[str, str]:
    """The headers that make a downstream call act as ``user``."""
    return user.downstream_headers()


def path(*segments: str) -> str:
    """A URL path from raw segments, each percent-encoded (no ``/`` or ``..`` smuggling)."""
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            message = error.get("message")
            if isinstance(message, str):
                return message[:MAX_MESSAGE_CHARS]
        detail = body.get("detail") or body.get("message")
        if isinstance(detail, str):
            return detail[:MAX_MESSAGE_CHARS]
    return ""


class Downstream:
    """The live-data services, reached through one shared client."""

    def __init__(
        self,
        *,
        twin_url: str,
        sensor_url: str,
        timeout_seconds: float = 5.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.twin_url = twin_url.rstrip("/")
        self.sensor_url = sensor_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._owns_client = client is None
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_seconds),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    async def twin(
        self, url_path: str, user: AuthUser, params: Mapping[str, str] | None = None
    ) -> JsonValue:
        return await self._get("twin-service", self.twin_url + url_path, user, params)

    async def sensor(
        self, url_path: str, user: AuthUser, params: Mapping[str, str] | None = None
    ) -> JsonValue:
        return await self._get("sensor-service", self.sensor_url + url_path, user, params)

    async def _get(
        self,
        service: Service,
        url: str,
        user: AuthUser,
        params: Mapping[str, str] | None,
    ) -> JsonValue:
        try:
            response = await self.client.get(
                url,
                params=dict(params) if params else None,
                headers={**auth_headers(user), "accept": "application/json"},
                timeout=self.timeout_seconds,
            )
        except httpx.TimeoutException as exc:
            raise DownstreamError(
                service, f"{service} timed out; try again later or say live data is unavailable"
            ) from exc
        except httpx.HTTPError as exc:
            log.warning("%s unreachable: %s", service, exc)
            raise DownstreamError(
                service, f"{service} is unreachable; say live data is unavailable"
            ) from exc
        status = response.status_code
        if status == 404:
            raise NotFoundError(service, "not found", status=status)
        if status in (401, 403):
            raise DownstreamError(
                service, f"{service} refused access for this user (HTTP {status})", status=status
            )
        if status == 429:
            raise DownstreamError(service, f"{service} is busy; try again later", status=status)
        if 400 <= status < 500:
            detail = _error_message(response) or "bad request"
            raise DownstreamError(
                service, f"{service} rejected the request: {detail}", status=status
            )
        if status >= 300:
            raise DownstreamError(
                service,
                f"{service} is unavailable (HTTP {status}); say live data is unavailable",
                status=status,
            )
        try:
            data: JsonValue = json.loads(response.content)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DownstreamError(
                service, f"{service} returned an unreadable response", status=status
            ) from exc
        return data
