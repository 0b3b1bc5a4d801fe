"""FastAPI dependencies, as ``Annotated`` aliases (the full-stack template's style): the
backend, the settings, the authorizer, the caller, and the admin gate of ``/ingest``; and
what the routes take from the backend (its usage limits, feedback store and metrics sink).

The one module that reads ``app.state`` (``create_app`` sets ``backend``, ``settings`` and
``authorizer`` there): the routes reach the service only through these dependencies
(``tests/serve_app/api/test_one_way_in.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from conversations.feedback import FeedbackStore
from foundation.identity import AuthUser
from foundation.settings import Settings
from serve_app.api.errors import ApiError
from serve_app.auth import authenticate
from serve_app.authz import CedarAuthorizer
from serve_app.backend import ApiBackend
from serve_app.limits import RequestLimits
from serve_app.metrics import MetricsSink

__all__ = [
    "AuthorizerDep",
    "BackendDep",
    "CurrentUser",
    "FeedbackStoreDep",
    "IngestAdmin",
    "LimitsDep",
    "MetricsDep",
    "SettingsDep",
    "get_authorizer",
    "get_backend",
    "get_feedback_store",
    "get_limits",
    "get_metrics",
    "get_settings",
    "require_ingest_permission",
    "require_user",
]


def get_settings(request: Request) -> Settings:
    """The app's ``Settings`` (``app.state.settings``, set by ``create_app``)."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def require_user(request: Request, settings: SettingsDep) -> AuthUser:
    """The authenticated caller (raises ``serve_app.auth.AuthenticationError``: 401)."""
    return authenticate(request.headers, request.cookies, settings)


CurrentUser = Annotated[AuthUser, Depends(require_user)]


def get_backend(request: Request) -> ApiBackend:
    backend: ApiBackend = request.app.state.backend
    return backend


def get_authorizer(request: Request) -> CedarAuthorizer:
    authorizer: CedarAuthorizer = request.app.state.authorizer
    return authorizer


BackendDep = Annotated[ApiBackend, Depends(get_backend)]
AuthorizerDep = Annotated[CedarAuthorizer, Depends(get_authorizer)]


def get_limits(backend: BackendDep) -> RequestLimits:
    return backend.limits


def get_feedback_store(backend: BackendDep) -> FeedbackStore:
    return backend.feedback


def get_metrics(backend: BackendDep) -> MetricsSink | None:
    return backend.metrics


LimitsDep = Annotated[RequestLimits, Depends(get_limits)]
FeedbackStoreDep = Annotated[FeedbackStore, Depends(get_feedback_store)]
MetricsDep = Annotated[MetricsSink | None, Depends(get_metrics)]


async def require_ingest_permission(user: CurrentUser, authorizer: AuthorizerDep) -> AuthUser:
    """Cedar's ``IngestDocuments`` (admin only): 403 below."""
    if not authorizer.can_ingest_documents(user):
        raise ApiError(403, "ingesting documents requires the admin role", code="forbidden")
    return user


IngestAdmin = Annotated[AuthUser, Depends(require_ingest_permission)]
