"""Parsing ``x-gateway-claims`` as the mesh sets it."""

from __future__ import annotations

import base64
import json

import pytest

from foundation.roles import ROLE_WEIGHTS
from local_world.claims import (
    Claims,
    ClaimsError,
    encode_claims,
    encode_flat_claims,
    parse_claims,
)


def test_claims_gateway_shape_is_flattened() -> None:
    header = encode_claims(
        "u-1", [("acme", "business_staff"), {"domain": "civic", "role": "standard_customer"}]
    )
    parsed = parse_claims(header)
    assert parsed == Claims(
        sub="u-1", roles=("business_staff", "standard_customer"), domains=("acme", "civic")
    )


@pytest.mark.parametrize("urlsafe", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_standard_and_url_safe_padded_or_not(urlsafe: bool, padded: bool) -> None:
    # "~~~" and "???" force '+', '/' (or '-', '_') into the encoding; the length forces padding.
    sub = "user~~~???>>>x"
    header = encode_claims(sub, [("acme", "admin")], urlsafe=urlsafe, padded=padded)
    assert ("=" in header) is padded
    assert any(ch in header for ch in "-_+/")
    assert parse_claims(header).sub == sub


def test_flat_eval_shape_passes_through() -> None:
    parsed = parse_claims(encode_flat_claims("eval", ["business_admin"], ["northwind"]))
    assert parsed.roles == ("business_admin",)
    assert parsed.domains == ("northwind",)
    assert parsed.role_weight == ROLE_WEIGHTS["business_admin"] == 80


def test_whitespace_around_the_header_is_ignored() -> None:
    header = encode_claims("u", [("acme", "admin")])
    assert parse_claims(f"  {header}\n").sub == "u"


def _b64(payload: object) -> str:
    return base64.b64encode(json.dumps(payload).encode()).decode()


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "not base64 at all!",
        base64.b64encode(b"\xff\xfe not utf-8").decode(),
        base64.b64encode(b"{not json").decode(),
        _b64(["a", "list"]),
        _b64({"memberships": [{"domain": "acme", "role": "admin"}]}),
        _b64({"sub": "", "memberships": []}),
        _b64({"sub": "u", "memberships": {"domain": "acme"}}),
        _b64({"sub": "u", "memberships": [{"domain": "acme"}]}),
        _b64({"sub": "u", "roles": "admin", "domains": []}),
        _b64({"sub": "u"}),
        "A" * 20_000,
    ],
)
def test_invalid_headers_are_rejected(header: str | None) -> None:
    with pytest.raises(ClaimsError):
        parse_claims(header)


def test_role_weights_come_from_the_fleet_file() -> None:
    assert ROLE_WEIGHTS == {
        "standard_customer": 10,
        "business_staff": 60,
        "business_admin": 80,
        "admin": 100,
    }


def test_role_and_domain_names_fold_case_as_the_service_does() -> None:
    from foundation.identity import AuthUser

    header = encode_claims("root", [("Acme", "ADMIN")])
    claims, user = parse_claims(header), AuthUser.from_claims_header(header)
    assert claims.role_weight == user.role_weight == ROLE_WEIGHTS["admin"]
    assert claims.is_admin and user.is_admin
    assert claims.domains == user.domains == ("acme",)


def test_admin_sees_every_domain_others_only_their_own() -> None:
    admin = parse_claims(encode_claims("root", [("acme", "admin")]))
    assert admin.is_admin
    assert admin.can_see_domain("northwind") and admin.can_see_domain("anything")

    boss = parse_claims(encode_claims("b", [("acme", "business_admin")]))
    assert not boss.is_admin
    assert boss.can_see_domain("acme")
    assert not boss.can_see_domain("northwind")

    nobody = parse_claims(encode_claims("n", []))
    assert nobody.role_weight == 0
    assert not nobody.can_see_domain("acme")


def test_unknown_roles_weigh_nothing() -> None:
    parsed = parse_claims(encode_flat_claims("u", ["superuser"], ["acme"]))
    assert parsed.role_weight == 0
    assert not parsed.is_admin
