"""Domain access for live data: which buildings' domains a caller may see.

The tools ask here, never the downstream service's say-so alone: twin-service and
sensor-service answers are untrusted, so every building they return is checked again.
``DomainAuthorizer`` is the port; ``serve_app.authz.CedarAuthorizer`` implements it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from foundation.identity import AuthUser


class DomainAuthorizer(Protocol):
    def accessible_domains(self, user: AuthUser, candidates: Iterable[str]) -> frozenset[str]: ...


def accessible_domains(
    authorizer: DomainAuthorizer, user: AuthUser, candidates: Iterable[str]
) -> frozenset[str]:
    """The subset of ``candidates`` the caller may see (one batched decision)."""
    return authorizer.accessible_domains(user, candidates)


def can_access_domain(authorizer: DomainAuthorizer, user: AuthUser, domain: str) -> bool:
    return domain in authorizer.accessible_domains(user, [domain])
