"""Roles and their weights, from the fleet's shared ``roles.json``."""

from __future__ import annotations

import json
from pathlib import Path

ROLES_FILE = Path(__file__).with_name("roles.json")


def load_role_weights() -> dict[str, int]:
    """Role name -> weight, from the fleet's shared ``roles.json``."""
    data: dict[str, int] = json.loads(ROLES_FILE.read_text(encoding="utf-8"))["roles"]
    return data


ROLE_WEIGHTS: dict[str, int] = load_role_weights()
