"""FastAPI dependencies, as ``Annotated`` aliases (the full-stack template's style): the
backend, the settings, the authorizer, the caller, and the admin gate of ``/ingest``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from foundation.identity import AuthUser
from serve_app.api.errors import ApiError
from serve_app.auth import CurrentUser, SettingsDep, get_settings, require_user
from serve_app.authz import CedarAuthorizer
from serve_app.backend import ApiBackend
from serve_app.limits import RequestLimits

__all__ = [
    "AuthorizerDep",
    "BackendDep",
    "CurrentUser",
    "IngestAdmin",
    "LimitsDep",
    "SettingsDep",
    "get_authorizer",
    "get_backend",
    "get_settings",
    "require_ingest_permission",
    "require_user",
]


def get_backend(request: Request) -> ApiBackend:
    backend: ApiBackend = request.app.state.backend
    return backend


def get_authorizer(request: Request) -> CedarAuthorizer:
    authorizer: CedarAuthorizer = request.app.state.authorizer
    return authorizer


def get_limits(request: Request) -> RequestLimits:
    limits: RequestLimits = request.app.state.limits
    return limits


BackendDep = Annotated[ApiBackend, Depends(get_backend)]
LimitsDep = Annotated[RequestLimits, Depends(get_limits)]
AuthorizerDep = Annotated[CedarAuthorizer, Depends(get_authorizer)]


async def require_ingest_permission(user: CurrentUser, authorizer: AuthorizerDep) -> AuthUser:
    """Cedar's ``IngestDocuments`` (admin only): 403 below."""
    if not authorizer.can_ingest_documents(user):
        raise ApiError(403, "ingesting documents requires the admin role", code="forbidden")
    return user


IngestAdmin = Annotated[AuthUser, Depends(require_ingest_permission)]
