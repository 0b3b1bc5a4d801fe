"""What an answer cites, which tools it called and what it used (tokens, cost), as one type
from the agent's answer to the ``/ask`` response to the stored turn (``conversations``) and
back out of ``GET /conversations``: each layer keeps these, never a copy of its own shape.
Pydantic, so they serialise as they are and cross a Ray Serve handle unchanged."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CitationOut", "CostOut", "EntityRefOut", "HopUsageOut", "ToolCallTrace", "UsageOut"]


class CitationOut(BaseModel):
    """A chunk the answer cited, by its id, with what the caller was shown of it."""

    model_config = ConfigDict(frozen=True)

    chunk_id: str
    source: str
    section: str | None
    snippet: str


class EntityRefOut(BaseModel):
    """An entity id a tool call was given, with the kind its argument's schema declares."""

    model_config = ConfigDict(frozen=True)

    kind: str = Field(description="What the id names, as the tool's schema declares it.")
    id: str


class ToolCallTrace(BaseModel):
    """One tool call of a run's trace: the call and how it ended, not its result."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: dict[str, Any]
    ok: bool
    error: str | None = None
    duration_ms: float
    entities: tuple[EntityRefOut, ...] = Field(
        default=(),
        description="The entity ids among the arguments, each with its kind (building, room, "
        "...): what a follow-up in the same conversation may refer back to.",
    )


class HopUsageOut(BaseModel):
    hop: int
    input_tokens: int
    output_tokens: int


class UsageOut(BaseModel):
    """Tokens a run used, in all and per model call (``hops``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    hops: list[HopUsageOut] = Field(default_factory=list)


class CostOut(BaseModel):
    """What a run cost: the list-price estimate, and the provider's own figure when it
    reports one."""

    estimated_usd: float | None = None
    provider_usd: float | None = None
