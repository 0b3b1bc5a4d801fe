"""Shared helpers for the local-world tests (a uniquely named module, so it never clashes
with another directory's conftest)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from local_world._service import ServiceControl, get_control
from local_world.claims import HEADER, Membership, encode_claims

PINNED = "2025-03-04T10:30:00Z"  # a Tuesday, mid-morning (UTC)


def claims(sub: str, *memberships: Membership) -> dict[str, str]:
    """Request headers carrying an ``x-gateway-claims`` value for these memberships."""
    return {HEADER: encode_claims(sub, memberships)}


ADMIN = claims("root", ("acme", "admin"))
ACME_STAFF = claims("alice", ("acme", "business_staff"))
NORTHWIND_ADMIN = claims("nora", ("northwind", "business_admin"))
CUSTOMER = claims("carl", ("civic", "standard_customer"))


@dataclass
class Running:
    url: str
    app: FastAPI

    @property
    def control(self) -> ServiceControl:
        return get_control(self.app)
