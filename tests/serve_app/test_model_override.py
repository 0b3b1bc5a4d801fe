"""The per-request answer-model override: 403 below the role, 400 off the allowlist."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundation.identity import AuthUser
from foundation.settings import Settings
from serve_app.authz import CedarAuthorizer, load_authorizer
from serve_app.model_override import (
    OverrideForbidden,
    OverrideNotAllowed,
    check_model_override,
)


@pytest.fixture(scope="module")
def authz() -> CedarAuthorizer:
    return load_authorizer()


def settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path,
        answer_model="openai/gpt-4o-mini",
        **values,  # type: ignore[arg-type]
    )


def user(role: str) -> AuthUser:
    return AuthUser.from_claims({"sub": "u", "roles": [role], "domains": ["acme"]})


def test_no_override_is_the_default_model(tmp_path: Path, authz: CedarAuthorizer) -> None:
    s = settings(tmp_path)
    customer = user("standard_customer")
    assert check_model_override(customer, None, s, authz) == "openai/gpt-4o-mini"
    assert check_model_override(customer, "  ", s, authz) == "openai/gpt-4o-mini"
    # naming the configured model is not an override
    assert check_model_override(customer, "openai/gpt-4o-mini", s, authz) == "openai/gpt-4o-mini"


def test_below_the_role_is_forbidden(tmp_path: Path, authz: CedarAuthorizer) -> None:
    s = settings(tmp_path)  # MODEL_OVERRIDE_MIN_ROLE=business_admin
    with pytest.raises(OverrideForbidden) as caught:
        check_model_override(user("business_staff"), "google/gemini-2.5-flash", s, authz)
    assert caught.value.status == 403
    assert "business_admin" in str(caught.value)


def test_allowlist(tmp_path: Path, authz: CedarAuthorizer) -> None:
    s = settings(tmp_path, allowed_models="openai/gpt-4o-mini,google/gemini-2.5-flash")
    admin = user("business_admin")
    assert check_model_override(admin, "google/gemini-2.5-flash", s, authz) == (
        "google/gemini-2.5-flash"
    )
    with pytest.raises(OverrideNotAllowed) as caught:
        check_model_override(admin, "openai/gpt-4o", s, authz)
    assert caught.value.status == 400
    # the role gate comes first: a customer asking for an unlisted model gets 403
    with pytest.raises(OverrideForbidden):
        check_model_override(user("standard_customer"), "openai/gpt-4o", s, authz)


def test_empty_allowlist_allows_any_model(tmp_path: Path, authz: CedarAuthorizer) -> None:
    s = settings(tmp_path)
    assert check_model_override(user("admin"), "vendor/anything", s, authz) == "vendor/anything"


def test_min_role_is_configurable(tmp_path: Path, authz: CedarAuthorizer) -> None:
    s = settings(tmp_path, model_override_min_role="standard_customer")
    assert check_model_override(user("standard_customer"), "x/y", s, authz) == "x/y"
    s = settings(tmp_path, model_override_min_role="admin")
    with pytest.raises(OverrideForbidden):
        check_model_override(user("business_admin"), "x/y", s, authz)


def test_the_embedding_model_is_never_an_answer_model(
    tmp_path: Path, authz: CedarAuthorizer
) -> None:
    s = settings(tmp_path, embedding_model="all-MiniLM-L6-v2")
    with pytest.raises(OverrideNotAllowed, match="embedding model"):
        check_model_override(user("admin"), "all-MiniLM-L6-v2", s, authz)
    assert s.embedding_model == "all-MiniLM-L6-v2"
