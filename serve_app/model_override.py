"""The per-request answer-model override (``POST /ask`` ``model``).

It spends the shared provider balance, so it is gated twice: Cedar's ``OverrideModel``
(role weight at least ``MODEL_OVERRIDE_MIN_ROLE``; ``OverrideForbidden`` -> 403), then the
``ALLOWED_MODELS`` allowlist when it is non-empty (``OverrideNotAllowed`` -> 400). Asking for
the configured ``ANSWER_MODEL`` is not an override. Only the answer model ever changes: the
embedding model is fixed by the indexed vectors.
"""

from __future__ import annotations

from typing import Protocol

from foundation.identity import AuthUser
from foundation.settings import Settings


class OverrideAuthorizer(Protocol):
    def can_override_model(self, user: AuthUser, model: str, *, min_role_weight: int) -> bool: ...


class ModelOverrideError(Exception):
    """Base of the override refusals; ``status`` is the HTTP status the ingress returns."""

    status: int = 400
    code: str = "model_override_rejected"


class OverrideForbidden(ModelOverrideError):
    status = 403
    code = "model_override_forbidden"


class OverrideNotAllowed(ModelOverrideError):
    status = 400
    code = "model_not_allowed"


def check_model_override(
    user: AuthUser,
    requested_model: str | None,
    settings: Settings,
    authorizer: OverrideAuthorizer,
) -> str:
    """The answer model to use for this request; raises a ``ModelOverrideError``."""
    requested = (requested_model or "").strip()
    if not requested or requested == settings.llm.answer_model:
        return settings.llm.answer_model
    if not authorizer.can_override_model(
        user, requested, min_role_weight=settings.role_weight_min_override
    ):
        raise OverrideForbidden(
            f"overriding the answer model requires the {settings.llm.model_override_min_role} "
            "role or above"
        )
    if requested == settings.embedding.model:
        raise OverrideNotAllowed(
            f"{requested!r} is the embedding model; only the answer model can be overridden"
        )
    if settings.llm.allowed_models and requested not in settings.llm.allowed_models:
        raise OverrideNotAllowed(
            f"model {requested!r} is not allowed; allowed: {', '.join(settings.llm.allowed_models)}"
        )
    return requested
