"""``CedarAuthorizer``: the service's authorization decisions, made by Cedar.

Policies live in ``policies/*.cedar`` beside a Cedar schema (``schema.cedarschema``). Both
are parsed and validated once at startup (``load_authorizer``); a file that does not parse or
does not validate against the schema fails startup with a message naming the file. Decisions
reuse the parsed ``PolicySet`` and ``Schema`` handles, and a request needing several decisions
(e.g. which of these domains may the caller see) asks for them in one
``is_authorized_batch`` call.

Entities per decision: every ``Role`` (static), and the caller as a ``User`` that is a member
of each role at or below its highest weight, with its ``role_weight`` and ``domains``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import cedarpy

from foundation.acl import normalize_domain
from foundation.identity import AuthUser
from foundation.roles import ROLE_WEIGHTS

log = logging.getLogger(__name__)

LimitTier = Literal["exempt", "elevated", "standard"]

POLICY_DIR = Path(__file__).with_name("policies")
SCHEMA_FILE = "schema.cedarschema"
KNOWLEDGE_BASE_ID = "documentation"

INGEST_DOCUMENTS = "IngestDocuments"
ACCESS_DOMAIN = "AccessDomain"
OVERRIDE_MODEL = "OverrideModel"
USE_LIMIT_TIER = "UseLimitTier"
# Asked in this order; the first permitted is the caller's tier (none: "standard").
LIMIT_TIERS: tuple[LimitTier, ...] = ("exempt", "elevated")


class AuthzConfigError(RuntimeError):
    """The Cedar schema or a policy file is missing, does not parse, or does not validate."""


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _uid(entity_type: str, entity_id: str) -> dict[str, str]:
    return {"type": entity_type, "id": entity_id}


def _role_entities() -> list[dict[str, Any]]:
    return [{"uid": _uid("Role", name), "attrs": {}, "parents": []} for name in ROLE_WEIGHTS]


def _user_entity(user: AuthUser) -> dict[str, Any]:
    weight = user.role_weight
    return {
        "uid": _uid("User", user.sub),
        "attrs": {
            "role_weight": weight,
            "domains": [{"__entity": _uid("Domain", d)} for d in user.domains],
        },
        "parents": [_uid("Role", name) for name, w in ROLE_WEIGHTS.items() if w <= weight],
    }


class CedarAuthorizer:
    """Parsed, validated Cedar policies and the decisions the service needs."""

    def __init__(self, policies: dict[str, str], schema_text: str) -> None:
        """``policies``: file name -> Cedar text. Raises ``AuthzConfigError``."""
        if not policies:
            raise AuthzConfigError("no Cedar policy files (*.cedar) found")
        try:
            self._schema = cedarpy.Schema.from_str(schema_text)
        except ValueError as exc:
            raise AuthzConfigError(f"Cedar schema {SCHEMA_FILE} is invalid: {exc}") from exc
        problems: list[str] = []
        for name, text in sorted(policies.items()):
            try:
                cedarpy.PolicySet.from_str(text)
            except ValueError as exc:
                problems.append(f"{name}: does not parse: {exc}")
                continue
            result = cedarpy.validate_policies(text, self._schema)
            if not result.validation_passed:
                details = "; ".join(str(error) for error in result.errors)
                problems.append(f"{name}: does not validate against {SCHEMA_FILE}: {details}")
        if problems:
            raise AuthzConfigError("invalid Cedar policies:\n  " + "\n  ".join(problems))
        combined = "\n\n".join(text for _, text in sorted(policies.items()))
        self._policies = cedarpy.PolicySet.from_str(combined)
        self._roles = cedarpy.Entities.from_json_str(json.dumps(_role_entities()), self._schema)
        self.policy_files = tuple(sorted(policies))

    @classmethod
    def from_directory(cls, directory: Path = POLICY_DIR) -> CedarAuthorizer:
        schema_path = directory / SCHEMA_FILE
        if not schema_path.is_file():
            raise AuthzConfigError(f"Cedar schema not found: {schema_path}")
        policies = {
            path.name: path.read_text(encoding="utf-8")
            for path in sorted(directory.glob("*.cedar"))
        }
        return cls(policies, schema_path.read_text(encoding="utf-8"))

    # --- decisions ----------------------------------------------------------------------------

    def _decide(self, user: AuthUser, requests: Sequence[dict[str, Any]]) -> list[bool]:
        if not requests:
            return []
        entities = self._roles.with_added_json_str(json.dumps([_user_entity(user)]))
        results = cedarpy.is_authorized_batch(list(requests), self._policies, entities)
        decisions: list[bool] = []
        for result in results:
            if result.diagnostics.errors:
                log.warning("cedar evaluation errors: %s", result.diagnostics.errors)
            decisions.append(bool(result.allowed))
        return decisions

    @staticmethod
    def _request(
        user: AuthUser,
        action: str,
        resource: dict[str, str],
        context: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {
            "principal": _uid("User", user.sub),
            "action": _uid("Action", action),
            "resource": resource,
            "context": context or {},
        }

    def can_ingest_documents(self, user: AuthUser) -> bool:
        """``IngestDocuments``: a global gate (admin only)."""
        request = self._request(user, INGEST_DOCUMENTS, _uid("KnowledgeBase", KNOWLEDGE_BASE_ID))
        return self._decide(user, [request])[0]

    def can_access_domain(self, user: AuthUser, domain: str) -> bool:
        """``AccessDomain``: members see their domains, admins see all."""
        return domain in self.accessible_domains(user, [domain])

    def accessible_domains(self, user: AuthUser, candidates: Iterable[str]) -> frozenset[str]:
        """The subset of ``candidates`` the caller may see, decided in one batch. Candidates
        come from downstream answers (untrusted): one that is not valid Unicode (a lone
        surrogate from a JSON escape) names no real domain and is denied without asking Cedar,
        whose entity parser would otherwise fail the whole batch. Names are compared after
        ``normalize_domain`` (``Acme`` is ``acme``); the result holds them as given."""
        domains = [d for d in dict.fromkeys(candidates) if _is_unicode(d)]
        requests = [
            self._request(user, ACCESS_DOMAIN, _uid("Domain", normalize_domain(d))) for d in domains
        ]
        allowed = self._decide(user, requests)
        return frozenset(d for d, ok in zip(domains, allowed, strict=True) if ok)

    def can_override_model(self, user: AuthUser, model: str, *, min_role_weight: int) -> bool:
        """``OverrideModel``: role weight at least ``min_role_weight``."""
        request = self._request(
            user, OVERRIDE_MODEL, _uid("Model", model), {"min_role_weight": min_role_weight}
        )
        return self._decide(user, [request])[0]

    def limit_tier(self, user: AuthUser) -> LimitTier:
        """``UseLimitTier``: the usage-limit tier of the caller (policies/limits.cedar), the
        first of ``LIMIT_TIERS`` Cedar permits, else ``standard``; one batch."""
        requests = [
            self._request(user, USE_LIMIT_TIER, _uid("LimitTier", tier)) for tier in LIMIT_TIERS
        ]
        for tier, allowed in zip(LIMIT_TIERS, self._decide(user, requests), strict=True):
            if allowed:
                return tier
        return "standard"


def load_authorizer(directory: Path = POLICY_DIR) -> CedarAuthorizer:
    """Load and validate the policies; call at startup (raises ``AuthzConfigError``)."""
    authorizer = CedarAuthorizer.from_directory(directory)
    log.info("cedar: loaded %s", ", ".join(authorizer.policy_files))
    return authorizer
