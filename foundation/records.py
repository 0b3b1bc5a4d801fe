"""What an answer cites and which tools it called, as one type from the agent's answer to
the ``/ask`` response to the stored turn (``conversations``) and back out of
``GET /conversations``: each layer keeps these, never a copy of its own shape. Pydantic, so
they serialise as they are and cross a Ray Serve handle unchanged."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["CitationOut", "ToolCallTrace"]


class CitationOut(BaseModel):
    """A chunk the answer cited, by its id, with what the caller was shown of it."""

    model_config = ConfigDict(frozen=True)

    chunk_id: str
    source: str
    section: str | None
    snippet: str


class ToolCallTrace(BaseModel):
    """One tool call of a run's trace: the call and how it ended, not its result."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: dict[str, Any]
    ok: bool
    error: str | None = None
    duration_ms: float
