"""The development sign-in's users: the ``users`` of the local world the simulators serve
(``LOCAL_WORLD_FILE``, else the sample world's ``local_world/worlds/sample.yaml``: one per role
of ``foundation/roles.json`` in the sample's domains, northwind, acme and civic, and
``crowdvision-ops`` for the fleet admin), so a person running ``make run`` can see what each
role and domain may see, in whichever world they run.

Offered only where the server is in a development mode (``dev_sign_in_enabled``):
``REQUIRE_AUTH=false`` or ``EVAL_JWT_SECRET`` set. With the secret, signing in sets the
``authentication_token`` cookie to an eval token minted here (the secret never leaves the
server); with ``REQUIRE_AUTH=false`` alone, the page sends the user's ``x-gateway-claims``
itself, as the CLI's ``ask --as/--sub/--roles/--domains`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundation.eval_tokens import secret_value
from foundation.settings import Settings
from local_world.world_file import WorldSpec, load_world_file


@dataclass(frozen=True, slots=True)
class DevUser:
    id: str
    label: str
    roles: tuple[str, ...]
    domains: tuple[str, ...]


def world_users(world: WorldSpec) -> tuple[DevUser, ...]:
    """A world file's users as development users."""
    return tuple(DevUser(u.id, u.label, tuple(u.roles), tuple(u.domains)) for u in world.users)


# The sample world's users (what the page offers when LOCAL_WORLD_FILE is unset).
DEV_USERS: tuple[DevUser, ...] = world_users(load_world_file(None))
DEV_TOKEN_TTL_SECONDS = 8 * 3600


def dev_users(settings: Settings) -> tuple[DevUser, ...]:
    """The users of the world ``LOCAL_WORLD_FILE`` names (read once per file version); a
    file that is not a valid world raises ``WorldFileError`` naming the file and field."""
    return world_users(load_world_file(settings.serve.local_world_file))


def dev_user(user_id: str, users: tuple[DevUser, ...] = DEV_USERS) -> DevUser | None:
    return next((u for u in users if u.id == user_id), None)


def dev_sign_in_enabled(settings: Settings) -> bool:
    """Development sign-in exists only with ``REQUIRE_AUTH=false`` or ``EVAL_JWT_SECRET``."""
    return (not settings.auth.require_auth) or bool(secret_value(settings.auth.eval_jwt_secret))
