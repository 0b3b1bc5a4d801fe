"""The development sign-in's users: one per role of ``foundation/roles.json``, in the local
world's domains (``local_world``: northwind, acme, civic; ``crowdvision-ops`` for the fleet
admin), so a person running ``make run`` can see what each role and domain may see.

Offered only where the server is in a development mode (``dev_sign_in_enabled``):
``REQUIRE_AUTH=false`` or ``EVAL_JWT_SECRET`` set. With the secret, signing in sets the
``authentication_token`` cookie to an eval token minted here (the secret never leaves the
server); with ``REQUIRE_AUTH=false`` alone, the page sends the user's ``x-gateway-claims``
itself, as the CLI's ``ask --sub/--roles/--domains`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundation.eval_tokens import secret_value
from foundation.settings import Settings


@dataclass(frozen=True, slots=True)
class DevUser:
    id: str
    label: str
    roles: tuple[str, ...]
    domains: tuple[str, ...]


DEV_USERS: tuple[DevUser, ...] = (
    DevUser("nina", "Nina: Northwind business staff", ("business_staff",), ("northwind",)),
    DevUser("bram", "Bram: Northwind business admin", ("business_admin",), ("northwind",)),
    DevUser("carla", "Carla: Acme customer", ("standard_customer",), ("acme",)),
    DevUser("lee", "Lee: Civic business staff", ("business_staff",), ("civic",)),
    DevUser("eve", "Eve: CrowdVision admin (every domain)", ("admin",), ("crowdvision-ops",)),
)
DEV_TOKEN_TTL_SECONDS = 8 * 3600


def dev_user(user_id: str) -> DevUser | None:
    return next((u for u in DEV_USERS if u.id == user_id), None)


def dev_sign_in_enabled(settings: Settings) -> bool:
    """Development sign-in exists only with ``REQUIRE_AUTH=false`` or ``EVAL_JWT_SECRET``."""
    return (not settings.auth.require_auth) or bool(secret_value(settings.auth.eval_jwt_secret))
