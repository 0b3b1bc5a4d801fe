"""The errors a backend may raise (additive), re-exported by ``serve_app.backend``.

A module of their own, below the port: the usage limits the port hands the routes
(``serve_app.limits``) refuse a request with a ``BackendError``, so ``serve_app.backend``
imports them without an import circle."""

from __future__ import annotations

from typing import Any


class BackendError(Exception):
    """A failure of the backend itself (not of the agent's run, which ends in an answer with
    ``decision="provider_error"``). The routes turn it into the error envelope with
    ``status``; ``message`` is shown to the caller, so it must hold no secrets."""

    status: int = 503
    code: str = "backend_unavailable"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        # Extra members of the error envelope (e.g. a 429's ``exceeded``) and response headers.
        self.details = dict(details or {})
        self.headers = dict(headers or {})


class BackendOverloaded(BackendError):
    """Too many requests in flight (e.g. Serve's back-pressure): try again shortly -> 429."""

    status = 429
    code = "overloaded"


class BackendTimeout(BackendError):
    """The work did not finish in time (e.g. Serve's request timeout) -> 504."""

    status = 504
    code = "timeout"


class IngestConflict(BackendError):
    """An ingestion run is already running -> 409."""

    status = 409
    code = "ingest_in_progress"


class ConversationNotFound(BackendError):
    """No conversation with this id belongs to the caller -> 404, one message whether it
    never existed or is another caller's (no existence oracle)."""

    status = 404
    code = "not_found"


class ConversationFullError(BackendError):
    """The conversation holds ``CONVERSATION_MAX_TURNS`` turns -> 409: start a new one."""

    status = 409
    code = "conversation_full"


class ConversationDeleted(BackendError):
    """The conversation was deleted while its question was being answered -> 409; the
    answer was not stored."""

    status = 409
    code = "conversation_deleted"


class ConversationsUnavailable(BackendError):
    """The conversation store (the database) cannot be reached -> 503."""

    code = "conversations_unavailable"
