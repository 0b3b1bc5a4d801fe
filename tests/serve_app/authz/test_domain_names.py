"""One rule for domain (tenant) names, property-tested across every place a name is compared
(issue 19, item 4): ``normalize_domain`` - case and surrounding space do not matter, so
``Acme`` and ``acme`` are one tenant, and names that differ otherwise are never one.

For a caller holding one membership and a resource in one domain, written in random case and
padding (through either claims shape), the four decisions must agree with
``normalize_domain(a) == normalize_domain(b)``:

* documents: the retrieval ACL rule (``parse_acl`` on the page, ``AuthUser.acl_entries`` for
  the caller; the SQL twin of ``is_visible`` is property-tested in
  ``tests/retrieval/test_permission_leaks.py`` on the same entries);
* buildings, in the service: Cedar's ``AccessDomain`` (``accessible_domains``);
* buildings, downstream: the twin/sensor simulators' own check on the forwarded header.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.acl import is_visible, normalize_domain, parse_acl
from foundation.identity import AuthUser
from local_world.claims import encode_claims, encode_flat_claims, parse_claims
from serve_app.authz import CedarAuthorizer, load_authorizer

AUTHZ = load_authorizer()  # parsed once: hypothesis runs the property many times
ROLES = ("standard_customer", "business_staff", "business_admin")

base_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)


@st.composite
def spelled(draw: st.DrawFn, name: str) -> str:
    """``name`` in random letter case, with random surrounding space."""
    cased = "".join(c.upper() if draw(st.booleans()) else c for c in name)
    return draw(st.sampled_from(["", " ", "  ", "\t"])) + cased + draw(st.sampled_from(["", " "]))


@st.composite
def name_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """Two spellings of one name, or of two different names (about half each)."""
    first = draw(base_names)
    second = first if draw(st.booleans()) else draw(base_names)
    return draw(spelled(first)), draw(spelled(second))


def caller(domain: str, role: str, *, mesh: bool) -> tuple[AuthUser, str]:
    """The service's user and the header the simulators receive, for one membership."""
    if mesh:
        header = encode_claims("u", [(domain, role)])
        return AuthUser.from_claims_header(header), header
    user = AuthUser.from_claims({"sub": "u", "roles": [role], "domains": [domain]})
    return user, user.downstream_headers()["x-gateway-claims"]


def decisions(
    authz: CedarAuthorizer, member: str, resource: str, role: str, mesh: bool
) -> dict[str, bool]:
    user, header = caller(member, role, mesh=mesh)
    return {
        "documents": is_visible(parse_acl([f"domain:{resource}"]), user.acl_entries),
        "cedar": resource in authz.accessible_domains(user, [resource]),
        "simulators": parse_claims(header).can_see_domain(resource),
    }


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(pair=name_pairs(), role=st.sampled_from(ROLES), mesh=st.booleans())
def test_every_check_applies_one_rule_to_domain_names(
    pair: tuple[str, str], role: str, mesh: bool
) -> None:
    member, resource = pair
    same_tenant = normalize_domain(member) == normalize_domain(resource)
    assert decisions(AUTHZ, member, resource, role, mesh) == dict.fromkeys(
        ("documents", "cedar", "simulators"), same_tenant
    ), (member, resource)


@pytest.mark.parametrize("mesh", [True, False])
def test_acme_and_ACME_are_one_tenant_and_never_another(mesh: bool) -> None:
    for member in ("Acme", "ACME", " acme "):
        assert set(decisions(AUTHZ, member, "acme", "business_staff", mesh).values()) == {True}
        assert set(decisions(AUTHZ, member, "Acme", "business_staff", mesh).values()) == {True}
        assert set(decisions(AUTHZ, member, "acme2", "business_staff", mesh).values()) == {False}
        assert set(decisions(AUTHZ, member, "northwind", "business_staff", mesh).values()) == {
            False
        }


def test_admins_see_every_domain_whatever_its_case() -> None:
    user, header = caller("acme", "admin", mesh=True)
    assert AUTHZ.accessible_domains(user, ["NorthWind", "civic"]) == {"NorthWind", "civic"}
    assert parse_claims(header).can_see_domain("NorthWind")


def test_names_are_folded_once_at_the_identity_boundary() -> None:
    user = AuthUser.from_claims({"sub": "u", "roles": [], "domains": ["Acme", "ACME ", "civic"]})
    assert user.domains == ("acme", "civic")
    assert AuthUser("u", (), ("NorthWind",)).domains == ("northwind",)
    assert parse_claims(encode_flat_claims("u", [], ["Acme", "acme"])).domains == ("acme",)
