"""AuthUser: both claim shapes, ACL entries, role weight, and acting as the user downstream."""

from __future__ import annotations

import base64
import json

import pytest

from foundation.identity import CLAIMS_HEADER, AuthUser, IdentityError
from local_world.claims import encode_claims, parse_claims


def test_mesh_header_is_flattened_and_forwarded_verbatim() -> None:
    header = encode_claims("nina", [("northwind", "business_staff"), ("acme", "standard_customer")])
    user = AuthUser.from_claims_header(header)
    assert user.sub == "nina"
    assert user.roles == ("business_staff", "standard_customer")
    assert user.domains == ("northwind", "acme")
    assert user.role_weight == 60 and not user.is_admin and not user.anonymous
    assert user.downstream_headers() == {CLAIMS_HEADER: header}
    assert user.permissions == ("business_staff", "standard_customer", "northwind", "acme")


@pytest.mark.parametrize(("urlsafe", "padded"), [(False, True), (True, False), (False, False)])
def test_header_encodings(urlsafe: bool, padded: bool) -> None:
    header = encode_claims("a" * 7, [("dom?~", "admin")], urlsafe=urlsafe, padded=padded)
    user = AuthUser.from_claims_header(header)
    assert user.domains == ("dom?~",) and user.is_admin
    assert user.downstream_headers()[CLAIMS_HEADER] == header


def test_eval_token_user_gets_an_equivalent_flat_header() -> None:
    user = AuthUser.from_claims(
        {"sub": "eve", "roles": ["business_admin"], "domains": ["acme", "civic"], "exp": 1}
    )
    assert user.claims_header is None
    claims = parse_claims(user.downstream_headers()[CLAIMS_HEADER])
    assert (claims.sub, claims.roles, claims.domains) == (
        "eve",
        ("business_admin",),
        ("acme", "civic"),
    )


def test_acl_entries_follow_the_role_hierarchy() -> None:
    user = AuthUser.from_claims({"sub": "x", "roles": ["business_staff"], "domains": ["Acme"]})
    assert user.acl_entries == [
        "domain:acme",
        "role:business_staff",
        "role:standard_customer",
    ]
    assert AuthUser.from_claims({"sub": "x", "roles": ["wizard"]}).acl_entries == []
    assert AuthUser.from_claims({"sub": "x", "roles": ["wizard"]}).role_weight == 0


def test_anonymous_user_holds_nothing() -> None:
    user = AuthUser.anonymous_user()
    assert user.anonymous and user.roles == () and user.domains == ()
    assert user.acl_entries == [] and user.role_weight == 0
    payload = json.loads(base64.b64decode(user.downstream_headers()[CLAIMS_HEADER]))
    assert payload == {"sub": "anonymous", "roles": [], "domains": []}


@pytest.mark.parametrize(
    "header",
    [
        "",
        "%%%",
        base64.b64encode(b"not json").decode(),
        base64.b64encode(b"[1]").decode(),
        base64.b64encode(b'{"memberships": []}').decode(),
        base64.b64encode(b'{"sub": "x"}').decode(),
        base64.b64encode(b'{"sub": "x", "memberships": [{"domain": 1, "role": "a"}]}').decode(),
        base64.b64encode(b'{"sub": "x", "roles": "admin"}').decode(),
        "A" * 20_000,
    ],
)
def test_bad_claims_are_rejected(header: str) -> None:
    with pytest.raises(IdentityError):
        AuthUser.from_claims_header(header)


def test_user_is_immutable_and_hashable() -> None:
    user = AuthUser.from_claims({"sub": "x", "roles": ["admin"]})
    with pytest.raises(AttributeError):
        user.sub = "y"  # type: ignore[misc]
    assert {user: 1}[user] == 1
