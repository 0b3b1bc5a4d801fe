"""Typed ACL entries and the caller's permission set.

Chunk permissions are typed entries, ``role:<name>`` or ``domain:<name>``, so that a domain
named like a role (a domain called ``admin``) can never unlock that role's documents. A chunk
is visible when its ACL is empty or overlaps the caller's entries; the overlap test runs in SQL.
"""

from __future__ import annotations

from collections.abc import Iterable

from foundation.roles import ROLE_WEIGHTS

ROLE_PREFIX = "role:"
DOMAIN_PREFIX = "domain:"

# DOC_ROOTS' default: the folders ingestion reads, each with the ACL of pages without
# front-matter permissions (``DIR=ACL``).
DEFAULT_DOC_ROOTS = (
    "documentation/user=",
    "documentation/developer=role:business_staff",
)


class AclError(ValueError):
    """An ACL entry that is not ``role:<known role>`` or ``domain:<name>``."""


def _clean(name: str) -> str:
    return name.strip().lower()


def normalize_domain(name: str) -> str:
    """The service's one rule for domain (tenant) names: surrounding space and letter case do
    not matter, so ``Acme``, `` acme `` and ``ACME`` are one tenant. Applied wherever a name
    enters: claims (``AuthUser``), ACL entries, Cedar's domain entities and the domains of
    buildings the twin service returns (and by the local simulators). Names compare equal
    only after it; two tenants the mesh told apart by case alone would be merged, so the mesh
    must not issue such names (docs/security.md)."""
    return name.strip().lower()


def parse_acl(entries: Iterable[str]) -> list[str]:
    """Validate and normalise ACL entries (lower-case, de-duplicated, sorted)."""
    out: set[str] = set()
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        if "\x00" in entry:  # the store could not hold it (PostgreSQL text)
            raise AclError(f"ACL entry {raw!r} contains a NUL character")
        kind, sep, name = entry.partition(":")
        name = _clean(name)
        kind = kind.strip().lower()
        if not sep or not name:
            raise AclError(f"ACL entry {raw!r} must be 'role:<name>' or 'domain:<name>'")
        if kind == "role":
            if name not in ROLE_WEIGHTS:
                raise AclError(
                    f"ACL entry {raw!r} names an unknown role; known: {sorted(ROLE_WEIGHTS)}"
                )
            out.add(ROLE_PREFIX + name)
        elif kind == "domain":
            out.add(DOMAIN_PREFIX + normalize_domain(name))
        else:
            raise AclError(f"ACL entry {raw!r} must start with 'role:' or 'domain:'")
    return sorted(out)


def caller_entries(roles: Iterable[str], domains: Iterable[str]) -> list[str]:
    """The ACL entries a caller holds: ``role:`` for each of its roles and every role of a
    lower or equal weight, ``domain:`` for each membership. Unknown roles grant nothing."""
    weights = [ROLE_WEIGHTS[r] for r in {_clean(r) for r in roles} if r in ROLE_WEIGHTS]
    top = max(weights, default=None)
    held: set[str] = set()
    if top is not None:
        held.update(ROLE_PREFIX + name for name, weight in ROLE_WEIGHTS.items() if weight <= top)
    held.update(DOMAIN_PREFIX + d for d in {normalize_domain(d) for d in domains} if d)
    return sorted(held)


def is_visible(chunk_acl: Iterable[str], held: Iterable[str]) -> bool:
    """Python twin of the SQL predicate, for tests and post-hoc checks."""
    acl = set(chunk_acl)
    return not acl or bool(acl & set(held))
