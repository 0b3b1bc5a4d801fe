from __future__ import annotations

import pytest

from foundation.acl import AclError, caller_entries, is_visible, parse_acl


def test_higher_role_holds_every_lower_role() -> None:
    assert caller_entries(["business_admin"], []) == [
        "role:business_admin",
        "role:business_staff",
        "role:standard_customer",
    ]
    assert "role:admin" not in caller_entries(["business_admin"], [])
    assert "role:admin" in caller_entries(["admin"], [])


def test_domains_are_typed_so_a_domain_named_admin_is_not_the_admin_role() -> None:
    held = caller_entries(["standard_customer"], ["admin"])
    assert "domain:admin" in held
    assert not is_visible(["role:admin"], held)
    assert is_visible(["domain:admin"], held)


def test_unknown_roles_grant_nothing_and_entries_are_normalised() -> None:
    assert caller_entries(["wizard"], []) == []
    assert caller_entries(["ADMIN", "admin "], ["Acme", "acme", ""]) == [
        "domain:acme",
        "role:admin",
        "role:business_admin",
        "role:business_staff",
        "role:standard_customer",
    ]


def test_empty_acl_visible_to_everyone_including_no_memberships() -> None:
    assert is_visible([], [])
    assert not is_visible(["domain:acme"], [])


@pytest.mark.parametrize("bad", ["admin", "role:root", "group:ops", "role:", "domain: "])
def test_parse_acl_rejects_untyped_or_unknown(bad: str) -> None:
    with pytest.raises(AclError):
        parse_acl([bad])


def test_parse_acl_normalises() -> None:
    assert parse_acl(["Role:Admin", "domain:Acme", "domain:acme", " "]) == [
        "domain:acme",
        "role:admin",
    ]
