"""The ``x-gateway-claims`` header, parsed exactly as the mesh sets it.

The mesh (Istio's RequestAuthentication, or Caddy's ``forward_auth`` against claims-gateway in
docker-compose) verifies the gateway JWT once at the edge and injects the validated payload as
base64 JSON. Two payload shapes exist:

* claims-gateway: ``{"sub": str, "memberships": [{"domain": str, "role": str}, ...]}``
* the eval tool's flat shape: ``{"sub": str, "roles": [str, ...], "domains": [str, ...]}``

Both flatten to the same :class:`Claims` (``sub``, ``roles``, ``domains``). Visibility follows
the fleet's weighted role hierarchy (``foundation/roles.json``): a caller holding a role of
weight 100 (``admin``) sees every domain; everyone else sees only the domains they are a
member of.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from foundation.acl import normalize_domain
from foundation.roles import ROLE_WEIGHTS

HEADER = "x-gateway-claims"
MAX_HEADER_CHARS = 16 * 1024
ADMIN_WEIGHT = 100


class ClaimsError(ValueError):
    """The header is missing, not base64, not JSON, or not one of the two claim shapes."""


@dataclass(frozen=True, slots=True)
class Claims:
    sub: str
    roles: tuple[str, ...]
    domains: tuple[str, ...]

    @property
    def role_weight(self) -> int:
        """The highest weight among the caller's roles (0 when none is known)."""
        # Role names fold case as the service's do (``AuthUser.role_weight``).
        return max((ROLE_WEIGHTS.get(role.strip().lower(), 0) for role in self.roles), default=0)

    @property
    def is_admin(self) -> bool:
        return self.role_weight >= ADMIN_WEIGHT

    def __post_init__(self) -> None:
        # The service's rule for domain names (``normalize_domain``): ``Acme`` is ``acme``.
        names = (d for d in map(normalize_domain, self.domains) if d)
        object.__setattr__(self, "domains", _dedupe(names))

    def can_see_domain(self, domain: str) -> bool:
        return self.is_admin or normalize_domain(domain) in self.domains


def _dedupe(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _b64decode(value: str) -> bytes:
    text = "".join(value.split())
    if not text:
        raise ClaimsError("empty header")
    text = text.rstrip("=").replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ClaimsError("header is not base64") from exc


def _string_list(payload: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = payload.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ClaimsError(f"'{key}' must be a list of non-empty strings")
    return _dedupe(value)


def claims_from_payload(payload: object) -> Claims:
    """Normalise a decoded claims payload (either shape) to :class:`Claims`."""
    if not isinstance(payload, dict):
        raise ClaimsError("claims must be a JSON object")
    sub = payload.get("sub")
    if not isinstance(sub, str) or not sub.strip():
        raise ClaimsError("claims lack a non-empty 'sub'")
    if "memberships" in payload:
        memberships = payload["memberships"]
        if not isinstance(memberships, list):
            raise ClaimsError("'memberships' must be a list")
        roles: list[str] = []
        domains: list[str] = []
        for entry in memberships:
            if not isinstance(entry, dict):
                raise ClaimsError("each membership must be an object")
            domain, role = entry.get("domain"), entry.get("role")
            if not isinstance(domain, str) or not domain or not isinstance(role, str) or not role:
                raise ClaimsError("each membership needs non-empty 'domain' and 'role' strings")
            domains.append(domain)
            roles.append(role)
        return Claims(sub=sub, roles=_dedupe(roles), domains=_dedupe(domains))
    if "roles" in payload or "domains" in payload:
        return Claims(
            sub=sub, roles=_string_list(payload, "roles"), domains=_string_list(payload, "domains")
        )
    raise ClaimsError("claims carry neither 'memberships' nor 'roles'/'domains'")


def parse_claims(header: str | None) -> Claims:
    """Decode an ``x-gateway-claims`` value; raise :class:`ClaimsError` on anything else."""
    if header is None:
        raise ClaimsError(f"missing {HEADER} header")
    if len(header) > MAX_HEADER_CHARS:
        raise ClaimsError("header too large")
    raw = _b64decode(header)
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ClaimsError("header is not base64 of UTF-8 JSON") from exc
    return claims_from_payload(payload)


Membership = tuple[str, str] | Mapping[str, str]


def _encode(payload: Mapping[str, Any], *, urlsafe: bool, padded: bool) -> str:
    raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    text = (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode("ascii")
    return text if padded else text.rstrip("=")


def encode_claims(
    sub: str,
    memberships: Iterable[Membership],
    *,
    urlsafe: bool = False,
    padded: bool = True,
) -> str:
    """Build a header value in the claims-gateway shape.

    ``memberships`` holds ``(domain, role)`` pairs or ``{"domain", "role"}`` mappings.
    """
    entries: list[dict[str, str]] = []
    for item in memberships:
        if isinstance(item, tuple):
            domain, role = item
        else:
            domain, role = item["domain"], item["role"]
        entries.append({"domain": domain, "role": role})
    return _encode({"sub": sub, "memberships": entries}, urlsafe=urlsafe, padded=padded)


def encode_flat_claims(
    sub: str,
    roles: Iterable[str],
    domains: Iterable[str],
    *,
    urlsafe: bool = False,
    padded: bool = True,
) -> str:
    """Build a header value in the eval tool's flat shape."""
    payload = {"sub": sub, "roles": list(roles), "domains": list(domains)}
    return _encode(payload, urlsafe=urlsafe, padded=padded)


def claims_headers(sub: str, memberships: Iterable[Membership]) -> dict[str, str]:
    """``{"x-gateway-claims": ...}`` for an httpx client."""
    return {HEADER: encode_claims(sub, memberships)}
