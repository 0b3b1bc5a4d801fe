"""The chat page: ``GET {prefix}/ui/`` and its static files (``serve_app.ui.STATIC_DIR``),
``GET {prefix}/ui/session`` (who the page is talking as, and what it may show), and the
development sign-in (``{prefix}/ui/dev/...``), which exists only when ``REQUIRE_AUTH=false``
or ``EVAL_JWT_SECRET`` is set: otherwise its routes are never registered (404).

None of these is in the OpenAPI schema: the page is a client of the API, not part of it.
Every file carries a strict Content-Security-Policy (``serve_app.ui.SECURITY_HEADERS``).

The page holds no credential of its own: in production the mesh sets ``x-gateway-claims`` on
its requests; with the development sign-in the server mints the eval token into an
``HttpOnly`` cookie (``EVAL_JWT_SECRET``), or, with only ``REQUIRE_AUTH=false``, hands the
page the chosen local user's ``x-gateway-claims`` value to send (what ``agent-service ask``
sends).
"""

from __future__ import annotations

import ipaddress
import mimetypes
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from foundation.eval_tokens import mint_eval_token, secret_value
from foundation.identity import AuthUser
from foundation.settings import Settings
from local_world.claims import encode_claims
from serve_app.api.deps import AuthorizerDep, SettingsDep
from serve_app.api.errors import ApiError
from serve_app.auth import EVAL_TOKEN_COOKIE, AuthenticationError, authenticate
from serve_app.authz import CedarAuthorizer
from serve_app.ui import SECURITY_HEADERS, STATIC_DIR
from serve_app.ui.dev_users import (
    DEV_TOKEN_TTL_SECONDS,
    dev_sign_in_enabled,
    dev_user,
    dev_users,
)

# Python 3.11 does not know .mjs; a module script must be served as JavaScript.
mimetypes.add_type("text/javascript", ".mjs")

UI_PATH = "/ui"


class _PageFiles(StaticFiles):
    """The page's files, each with the security headers; revalidated on every load (ETag),
    so a new release is picked up at once."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        response.headers["cache-control"] = "no-cache"
        return response


def _session(user: AuthUser | None, settings: Settings, authorizer: CedarAuthorizer) -> Any:
    if user is None:
        return None
    can_override = authorizer.can_override_model(
        user, settings.answer_model, min_role_weight=settings.role_weight_min_override
    )
    models = [settings.answer_model]
    models += [m for m in settings.allowed_models if m != settings.answer_model]
    return {
        "sub": user.sub,
        "roles": list(user.roles),
        "domains": list(user.domains),
        "anonymous": user.anonymous,
        "can_override_model": can_override,
        "models": models if can_override else [],
        "can_ingest": authorizer.can_ingest_documents(user),
    }


def _router(settings: Settings) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    prefix = settings.api_prefix

    @router.get(UI_PATH)
    async def page_root() -> RedirectResponse:
        return RedirectResponse(f"{prefix}{UI_PATH}/", status_code=307)

    @router.get(f"{UI_PATH}/session")
    async def session(
        request: Request, settings: SettingsDep, authorizer: AuthorizerDep
    ) -> JSONResponse:
        """Who the page's requests run as (null when unauthenticated, with the reason), what
        it may offer them, and whether the development sign-in exists here."""
        user: AuthUser | None
        reason = None
        try:
            user = authenticate(request.headers, request.cookies, settings)
        except AuthenticationError as exc:
            user, reason = None, exc.message
        body = {
            "user": _session(user, settings, authorizer),
            "unauthenticated_reason": reason,
            "answer_model": settings.answer_model,
            "dev_sign_in": dev_sign_in_enabled(settings),
            "api_prefix": prefix,
        }
        return JSONResponse(body, headers={"cache-control": "no-store"})

    if dev_sign_in_enabled(settings):
        _add_dev_routes(router)
    return router


class DevSignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(max_length=64)


def _from_this_machine(request: Request) -> None:
    """The development sign-in answers loopback clients only: with ``EVAL_JWT_SECRET`` set it
    mints any local user's token, admins' included, for whoever asks, so a service reachable
    from elsewhere (``SERVE_HOST=0.0.0.0``, a forwarded port) must not offer it there. Anyone
    else gets the 404 of a service without it."""
    host = request.client.host if request.client else ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise StarletteHTTPException(404)  # the unknown route's envelope, byte for byte


def _add_dev_routes(router: APIRouter) -> None:
    @router.get(f"{UI_PATH}/dev/users", dependencies=[Depends(_from_this_machine)])
    async def list_dev_users(settings: SettingsDep) -> JSONResponse:
        users = [
            {"id": u.id, "label": u.label, "roles": list(u.roles), "domains": list(u.domains)}
            for u in dev_users(settings)
        ]
        return JSONResponse({"users": users}, headers={"cache-control": "no-store"})

    @router.post(f"{UI_PATH}/dev/sign-in", dependencies=[Depends(_from_this_machine)])
    async def dev_sign_in(body: DevSignIn, settings: SettingsDep) -> JSONResponse:
        chosen = dev_user(body.user, dev_users(settings))
        if chosen is None:
            raise ApiError(404, "no such development user", code="not_found")
        secret = secret_value(settings.eval_jwt_secret)
        if secret:
            token = mint_eval_token(
                secret, chosen.id, chosen.roles, chosen.domains, ttl=DEV_TOKEN_TTL_SECONDS
            )
            response = JSONResponse({"mode": "cookie", "user": chosen.id})
            response.set_cookie(
                EVAL_TOKEN_COOKIE,
                token,
                max_age=DEV_TOKEN_TTL_SECONDS,
                path="/",
                httponly=True,
                samesite="strict",
            )
            return response
        claims = encode_claims(chosen.id, [(d, r) for d in chosen.domains for r in chosen.roles])
        return JSONResponse({"mode": "header", "user": chosen.id, "claims": claims})

    @router.post(f"{UI_PATH}/dev/sign-out")
    async def dev_sign_out() -> JSONResponse:
        response = JSONResponse({"signed_out": True})
        response.delete_cookie(EVAL_TOKEN_COOKIE, path="/", httponly=True, samesite="strict")
        return response


def install_ui(app: FastAPI, settings: Settings) -> None:
    """The page's routes, then its files under ``{prefix}/ui/`` (after every API route)."""
    app.include_router(_router(settings), prefix=settings.api_prefix)
    files = _PageFiles(directory=STATIC_DIR, html=True, follow_symlink=False)
    app.mount(f"{settings.api_prefix}{UI_PATH}", files, name="ui")


__all__ = ["UI_PATH", "install_ui"]
