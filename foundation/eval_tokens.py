"""Eval tokens: HS256 JWTs signed with ``EVAL_JWT_SECRET``, minted for evals and tests.

The HTTP layer (``serve_app.auth``) verifies them; evals, tests and the CLI mint them here,
without carrying the web stack."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import jwt
from pydantic import SecretStr

EVAL_JWT_ALGORITHM = "HS256"


def secret_value(secret: SecretStr | str | None) -> str:
    """The secret's text, stripped ("" for none)."""
    if secret is None:
        return ""
    value = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    return value.strip()


def mint_eval_token(
    secret: SecretStr | str,
    sub: str,
    roles: Sequence[str] = (),
    domains: Sequence[str] = (),
    ttl: float | timedelta = 3600,
    *,
    now: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """An eval token for evals and tests: HS256, flat ``roles``/``domains``, ``iat``/``exp``
    (``ttl`` seconds from ``now``). ``extra`` claims are merged last (e.g. ``nbf``)."""
    key = secret_value(secret)
    if not key:
        raise ValueError("mint_eval_token needs a non-empty secret")
    issued = time.time() if now is None else now
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    payload: dict[str, Any] = {
        "sub": sub,
        "roles": list(roles),
        "domains": list(domains),
        "iat": int(issued),
        "exp": int(issued + seconds),
    }
    payload.update(extra or {})
    return jwt.encode(payload, key, algorithm=EVAL_JWT_ALGORITHM)
