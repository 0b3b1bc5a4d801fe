"""Authentication: who is calling. ``authenticate`` decides; ``require_user`` is its FastAPI
dependency (``CurrentUser``, in ``serve_app.api.deps``).

In order:

1. ``x-gateway-claims`` (set by the mesh after it verified the gateway JWT; trusted, never
   re-verified): base64 JSON, standard or url-safe, padded or not, claims-gateway shape
   ``{"sub", "memberships": [{"domain", "role"}]}`` (flattened) or the flat
   ``{"sub", "roles", "domains"}``. When the header is present it decides alone: an invalid
   header is a 401 even if a token is also sent. A repeated ``x-gateway-claims`` or
   ``Authorization`` header is a 401 (never "pick the first": a mesh that appends its
   header instead of replacing the client's would otherwise let the client's copy win).
2. Otherwise the eval token: an HS256 JWT signed with ``EVAL_JWT_SECRET``, from
   ``Authorization: Bearer <token>`` or, when that header is absent, the
   ``authentication_token`` cookie. Only HS256 is accepted (``none``, ``HS512``, ``RS256``...
   are refused before any signature check); ``exp`` and ``sub`` are required; ``exp``,
   ``nbf`` and ``iat`` are checked with a small clock-skew leeway. Unset secret = the path is
   off (a token is then refused with a message saying so).
3. No credentials at all: 401, or the anonymous user when ``REQUIRE_AUTH=false`` (local use
   only; ``warn_if_auth_disabled`` logs a loud warning at startup). Credentials that *are*
   sent are still verified with ``REQUIRE_AUTH=false``: a bad token is a 401, never a silent
   downgrade to anonymous.

Every failure is an ``AuthenticationError`` (HTTP 401, code ``unauthenticated``) whose message
says what was wrong and never echoes the credential or the secret. Malformed input of any kind
(non-base64, non-JSON, wrong types, oversized values) ends here, never in a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jwt
from pydantic import SecretStr

from foundation.eval_tokens import EVAL_JWT_ALGORITHM, secret_value
from foundation.identity import CLAIMS_HEADER, AuthUser, IdentityError
from foundation.settings import Settings

log = logging.getLogger(__name__)

EVAL_TOKEN_COOKIE = "authentication_token"
MAX_TOKEN_CHARS = 8 * 1024
CLOCK_SKEW_SECONDS = 10
MIN_SECRET_BYTES = 32  # RFC 7518 3.2: an HS256 key at least as long as the hash


class AuthenticationError(Exception):
    """The caller could not be authenticated (HTTP 401). ``message`` is safe to show."""

    status = 401
    code = "unauthenticated"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- the decision ------------------------------------------------------------------------------


def authenticate(
    headers: Mapping[str, str], cookies: Mapping[str, str], settings: Settings
) -> AuthUser:
    """The caller of a request, from its headers and cookies (see the module docstring).

    ``headers`` may be Starlette's case-insensitive ``Headers`` or a plain dict in any case.
    Raises ``AuthenticationError``."""
    for name in (CLAIMS_HEADER, "authorization"):
        _refuse_repeated(headers, name)
    claims = _header(headers, CLAIMS_HEADER)
    if claims is not None:
        try:
            return AuthUser.from_claims_header(claims)
        except IdentityError as exc:
            raise AuthenticationError(f"invalid {CLAIMS_HEADER} header: {exc}") from None
    token = _token(headers, cookies)
    if token is None:
        if not settings.auth.require_auth:
            return AuthUser.anonymous_user()
        raise AuthenticationError(_missing_message(settings))
    return verify_eval_token(token, settings.auth.eval_jwt_secret)


def verify_eval_token(token: str, secret: SecretStr | str | None) -> AuthUser:
    """Verify an eval token (HS256 with ``secret``) and normalise its claims."""
    key = secret_value(secret)
    if not key:
        raise AuthenticationError(
            "token authentication is disabled on this server (EVAL_JWT_SECRET is unset); "
            f"requests must carry the {CLAIMS_HEADER} header"
        )
    if len(token) > MAX_TOKEN_CHARS:
        raise AuthenticationError(f"token too large (more than {MAX_TOKEN_CHARS} characters)")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise AuthenticationError("token is not a well-formed JWT") from None
    if header.get("alg") != EVAL_JWT_ALGORITHM:
        raise AuthenticationError(f"token algorithm not accepted: only {EVAL_JWT_ALGORITHM}")
    try:
        payload: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[EVAL_JWT_ALGORITHM],
            options={"require": ["exp", "sub"]},
            leeway=CLOCK_SKEW_SECONDS,
        )
    except jwt.ExpiredSignatureError:
        raise AuthenticationError("token has expired") from None
    except jwt.ImmatureSignatureError:
        raise AuthenticationError("token is not valid yet (nbf or iat in the future)") from None
    except jwt.MissingRequiredClaimError as exc:
        raise AuthenticationError(f"token lacks the required '{exc.claim}' claim") from None
    except jwt.InvalidSignatureError:
        raise AuthenticationError("token signature does not verify") from None
    except jwt.exceptions.InvalidSubjectError:
        raise AuthenticationError("token 'sub' must be a non-empty string") from None
    except jwt.PyJWTError as exc:
        raise AuthenticationError(f"invalid token ({type(exc).__name__})") from None
    except Exception:  # never a 500 for a bad credential, whatever PyJWT does with it
        log.warning("unexpected error verifying an eval token", exc_info=True)
        raise AuthenticationError("invalid token") from None
    try:
        return AuthUser.from_claims(payload)
    except IdentityError as exc:
        raise AuthenticationError(f"invalid token claims: {exc}") from None


def warn_if_auth_disabled(settings: Settings) -> None:
    """Startup warnings: authentication off, or a weak eval secret."""
    if not settings.auth.require_auth:
        banner = "!" * 78
        log.warning(
            "\n%s\nREQUIRE_AUTH=false: requests without credentials run as an ANONYMOUS user."
            "\nUse this only for isolated local use; never expose this server.\n%s",
            banner,
            banner,
        )
    key = secret_value(settings.auth.eval_jwt_secret)
    if key:
        log.warning(
            "EVAL_JWT_SECRET is set: self-minted HS256 eval tokens are accepted "
            "(local development and evals only)"
        )
        if len(key.encode("utf-8")) < MIN_SECRET_BYTES:
            log.warning(
                "EVAL_JWT_SECRET is shorter than %d bytes: tokens signed with it are easy to forge",
                MIN_SECRET_BYTES,
            )


# --- helpers ------------------------------------------------------------------------------------


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    for key, item in headers.items():  # a plain dict with other casing
        if key.lower() == name:
            return item
    return None


def _refuse_repeated(headers: Mapping[str, str], name: str) -> None:
    """Two copies of a credential header are ambiguous, and the tell-tale of a mesh that
    appends its claims header instead of replacing the client's: refuse, never pick one."""
    getlist = getattr(headers, "getlist", None)  # Starlette's Headers keep repeated fields
    if getlist is not None and len(getlist(name)) > 1:
        raise AuthenticationError(f"more than one {name} header")


def _token(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    authorization = _header(headers, "authorization")
    if authorization is not None:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise AuthenticationError(
                "unsupported Authorization scheme: send 'Authorization: Bearer <token>'"
            )
        if not credentials.strip():
            raise AuthenticationError("empty bearer token")
        return credentials.strip()
    cookie = cookies.get(EVAL_TOKEN_COOKIE)
    if cookie is not None:
        if not cookie.strip():
            raise AuthenticationError(f"empty {EVAL_TOKEN_COOKIE} cookie")
        return cookie.strip()
    return None


def _missing_message(settings: Settings) -> str:
    message = f"authentication required: send the {CLAIMS_HEADER} header"
    if secret_value(settings.auth.eval_jwt_secret):
        message += f", or an eval token as a Bearer token or the {EVAL_TOKEN_COOKIE} cookie"
    return message
