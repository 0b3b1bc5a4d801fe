"""Who is asking: ``AuthUser``, the one identity every layer below the ingress works with.

Both token shapes normalise to the same flat ``roles``/``domains`` lists:

* the mesh's ``x-gateway-claims`` header (claims-gateway shape,
  ``{"sub", "memberships": [{"domain", "role"}]}``), kept verbatim in ``claims_header`` so
  downstream calls forward exactly what the mesh verified;
* the eval tool's HS256 token (flat ``{"sub", "roles", "domains"}``), which never passed the
  mesh: downstream calls then carry a claims header built from the same flat lists, so the
  tools still act as that user and never as a service account.

This module only decodes and normalises; verifying tokens is the ingress's job.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeGuard

from foundation.acl import caller_entries, normalize_domain
from foundation.roles import ROLE_WEIGHTS

CLAIMS_HEADER = "x-gateway-claims"
ANONYMOUS_SUB = "anonymous"
MAX_CLAIMS_HEADER_CHARS = 16 * 1024
ADMIN_ROLE = "admin"


class IdentityError(ValueError):
    """Claims that are not base64 JSON in one of the two known shapes."""


def _dedupe(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item.strip() for item in items if item.strip()))


def _is_text(value: object) -> TypeGuard[str]:
    """A string that is valid Unicode. JSON may smuggle in lone surrogates (``"\\ud800"``),
    which no UTF-8 encoder accepts: Cedar (and every downstream) would fail on them later."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class AuthUser:
    """An authenticated caller (or the anonymous local-use user)."""

    sub: str
    roles: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    claims_header: str | None = field(default=None, repr=False)
    anonymous: bool = False

    def __post_init__(self) -> None:
        # One rule for domain names everywhere (``normalize_domain``): folded here, once,
        # so Cedar, retrieval and the tools all see the same names whoever built the user.
        object.__setattr__(self, "domains", _dedupe(map(normalize_domain, self.domains)))

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def from_claims(cls, payload: object, *, claims_header: str | None = None) -> AuthUser:
        """Normalise a decoded claims payload of either shape.

        ``claims_header`` is the raw ``x-gateway-claims`` value when the payload came from the
        mesh (forwarded as received); leave it ``None`` for the eval token path."""
        if not isinstance(payload, Mapping):
            raise IdentityError("claims must be a JSON object")
        sub = payload.get("sub")
        if not _is_text(sub) or not sub.strip():
            raise IdentityError("claims lack a non-empty 'sub'")
        if "memberships" in payload:
            memberships = payload["memberships"]
            if not isinstance(memberships, list):
                raise IdentityError("'memberships' must be a list")
            roles: list[str] = []
            domains: list[str] = []
            for entry in memberships:
                if not isinstance(entry, Mapping):
                    raise IdentityError("each membership must be an object")
                domain, role = entry.get("domain"), entry.get("role")
                if not isinstance(domain, str) or not isinstance(role, str):
                    raise IdentityError("each membership needs 'domain' and 'role' strings")
                if not _is_text(domain) or not _is_text(role):
                    raise IdentityError("membership 'domain' and 'role' must be valid Unicode")
                domains.append(domain)
                roles.append(role)
            return cls(sub.strip(), _dedupe(roles), _dedupe(domains), claims_header)
        if "roles" in payload or "domains" in payload:
            return cls(
                sub.strip(),
                _string_list(payload, "roles"),
                _string_list(payload, "domains"),
                claims_header,
            )
        raise IdentityError("claims carry neither 'memberships' nor 'roles'/'domains'")

    @classmethod
    def from_claims_header(cls, header: str) -> AuthUser:
        """Decode an ``x-gateway-claims`` value (base64, standard or url-safe, padded or not)
        and keep it verbatim for forwarding."""
        if len(header) > MAX_CLAIMS_HEADER_CHARS:
            raise IdentityError("claims header too large")
        text = "".join(header.split()).rstrip("=").replace("-", "+").replace("_", "/")
        if not text:
            raise IdentityError("empty claims header")
        text += "=" * (-len(text) % 4)
        try:
            payload = json.loads(base64.b64decode(text, validate=True).decode("utf-8"))
        except (binascii.Error, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError too
            raise IdentityError("claims header is not base64 of UTF-8 JSON") from exc
        except RecursionError:  # "[[[[..." nested past the parser's depth limit
            raise IdentityError("claims header JSON is nested too deeply") from None
        return cls.from_claims(payload, claims_header=header)

    @classmethod
    def anonymous_user(cls) -> AuthUser:
        """``REQUIRE_AUTH=false``: no roles, no domains; sees only public chunks."""
        return cls(ANONYMOUS_SUB, (), (), None, anonymous=True)

    # --- derived views --------------------------------------------------------------------------

    @cached_property
    def acl_entries(self) -> list[str]:
        """Typed ACL entries for retrieval (``role:`` up the hierarchy, ``domain:``)."""
        return caller_entries(self.roles, self.domains)

    @property
    def role_weight(self) -> int:
        """The highest weight among the caller's roles (0 when none is known)."""
        return max((ROLE_WEIGHTS.get(role.lower(), 0) for role in self.roles), default=0)

    @property
    def is_admin(self) -> bool:
        return self.role_weight >= ROLE_WEIGHTS[ADMIN_ROLE]

    @property
    def permissions(self) -> tuple[str, ...]:
        """Roles and domains combined (the spec's ``AuthUser.permissions``)."""
        return _dedupe((*self.roles, *self.domains))

    def downstream_headers(self) -> dict[str, str]:
        """Headers that make a twin/sensor call act as this user.

        The mesh's header is forwarded byte for byte; a user from the eval token gets the
        equivalent flat claims, encoded the way the mesh would."""
        if self.claims_header is not None:
            return {CLAIMS_HEADER: self.claims_header}
        payload = {"sub": self.sub, "roles": list(self.roles), "domains": list(self.domains)}
        raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return {CLAIMS_HEADER: base64.b64encode(raw).decode("ascii")}


def _string_list(payload: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = payload.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise IdentityError(f"'{key}' must be a list of strings")
    if not all(_is_text(item) for item in value):
        raise IdentityError(f"'{key}' must hold valid Unicode strings")
    return _dedupe(value)
