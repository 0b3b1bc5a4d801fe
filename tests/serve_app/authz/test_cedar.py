"""Cedar policies: loaded and validated at startup, and the service's three decisions."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from foundation.identity import AuthUser
from serve_app.authz import POLICY_DIR, AuthzConfigError, CedarAuthorizer, load_authorizer


@pytest.fixture(scope="module")
def authz() -> CedarAuthorizer:
    return load_authorizer()


def user(*roles: str, domains: tuple[str, ...] = ()) -> AuthUser:
    return AuthUser.from_claims({"sub": "u", "roles": list(roles), "domains": list(domains)})


@pytest.mark.parametrize(
    ("roles", "allowed"),
    [
        ((), False),
        (("standard_customer",), False),
        (("business_staff",), False),
        (("business_admin",), False),
        (("admin",), True),
        (("standard_customer", "admin"), True),
        (("wizard",), False),
    ],
)
def test_ingest_documents_is_admin_only(
    authz: CedarAuthorizer, roles: tuple[str, ...], allowed: bool
) -> None:
    assert authz.can_ingest_documents(user(*roles)) is allowed


def test_domain_access_members_and_admins(authz: CedarAuthorizer) -> None:
    staff = user("business_staff", domains=("acme", "civic"))
    candidates = ["acme", "northwind", "civic", "admin"]
    assert authz.accessible_domains(staff, candidates) == {"acme", "civic"}
    assert authz.can_access_domain(staff, "acme")
    assert not authz.can_access_domain(staff, "northwind")
    # a domain named like a role unlocks nothing
    assert not authz.can_access_domain(user("standard_customer", domains=("x",)), "admin")
    admin = user("admin")
    assert authz.accessible_domains(admin, candidates) == set(candidates)
    assert authz.accessible_domains(staff, []) == frozenset()
    assert authz.accessible_domains(AuthUser.anonymous_user(), candidates) == frozenset()


def test_odd_names_are_data_not_syntax(authz: CedarAuthorizer) -> None:
    weird = 'a"b\\c\nd'
    staff = AuthUser.from_claims({"sub": weird, "roles": ["business_staff"], "domains": [weird]})
    assert authz.accessible_domains(staff, [weird, "acme"]) == {weird}


@pytest.mark.parametrize(
    ("roles", "min_weight", "allowed"),
    [
        (("business_staff",), 80, False),
        (("business_admin",), 80, True),
        (("admin",), 80, True),
        (("standard_customer",), 10, True),
        ((), 10, False),
    ],
)
def test_override_model_by_role_weight(
    authz: CedarAuthorizer, roles: tuple[str, ...], min_weight: int, allowed: bool
) -> None:
    assert (
        authz.can_override_model(user(*roles), "openai/gpt-4o", min_role_weight=min_weight)
        is allowed
    )


def test_batch_decisions_are_cheap(authz: CedarAuthorizer) -> None:
    staff = user("business_staff", domains=("acme",))
    domains = [f"d{i}" for i in range(50)] + ["acme"]
    started = time.perf_counter()
    for _ in range(20):
        assert authz.accessible_domains(staff, domains) == {"acme"}
    assert (time.perf_counter() - started) / 20 < 0.05  # one batch call, parsed policies


def _copy_policies(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, target)
    return target


def test_a_policy_that_does_not_parse_fails_startup(tmp_path: Path) -> None:
    folder = _copy_policies(tmp_path)
    (folder / "broken.cedar").write_text("permit (principal, action, resource) when {")
    with pytest.raises(AuthzConfigError, match=r"broken\.cedar: does not parse"):
        load_authorizer(folder)


def test_a_policy_that_does_not_validate_fails_startup(tmp_path: Path) -> None:
    folder = _copy_policies(tmp_path)
    (folder / "typo.cedar").write_text(
        'permit (principal, action == Action::"IngestDocument", resource);'
    )
    with pytest.raises(AuthzConfigError, match=r"typo\.cedar: does not validate"):
        load_authorizer(folder)
    (folder / "typo.cedar").write_text(
        'permit (principal, action == Action::"AccessDomain", resource)'
        " when { principal.rolle_weight > 1 };"
    )
    with pytest.raises(AuthzConfigError, match="rolle_weight"):
        load_authorizer(folder)


def test_a_broken_or_missing_schema_fails_startup(tmp_path: Path) -> None:
    folder = _copy_policies(tmp_path)
    (folder / "schema.cedarschema").write_text("entity User = {")
    with pytest.raises(AuthzConfigError, match=r"schema\.cedarschema is invalid"):
        load_authorizer(folder)
    (folder / "schema.cedarschema").unlink()
    with pytest.raises(AuthzConfigError, match="schema not found"):
        load_authorizer(folder)


def test_no_policies_fails_startup(tmp_path: Path) -> None:
    folder = _copy_policies(tmp_path)
    for policy in folder.glob("*.cedar"):
        policy.unlink()
    with pytest.raises(AuthzConfigError, match="no Cedar policy files"):
        load_authorizer(folder)
