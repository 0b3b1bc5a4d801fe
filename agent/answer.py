"""The shapes the agent hands back: ``AgentAnswer`` (the ``/ask`` response body) and the
stream events (``progress``, ``tool``, ``token``, ``citation``, ``done``).

Pydantic models, so the ingress serialises them as they are (``model_dump(mode="json")``) and
they cross a Ray Serve handle boundary unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from foundation.records import CitationOut, CostOut, HopUsageOut, ToolCallTrace, UsageOut

__all__ = [
    "AgentAnswer",
    "AgentError",
    "AgentEvent",
    "AnsweredBy",
    "CitationEvent",
    "CitationOut",
    "CostOut",
    "Decision",
    "DoneEvent",
    "HopUsageOut",
    "ProgressEvent",
    "ProgressStage",
    "RetrievalOut",
    "TokenEvent",
    "ToolCallTrace",
    "ToolEvent",
    "UsageOut",
]

Decision = Literal[
    "answered", "idk", "declined_out_of_scope", "tool_loop_exhausted", "provider_error"
]


# Who wrote an answer's text (``AgentAnswer.answered_by``; docs/agent-loop.md says exactly when).
AnsweredBy = Literal["model", "service"]

ANSWERED_BY_DESCRIPTION = (
    "Who wrote `answer`. `model`: the answering model's own reply, after the service's "
    "checks (invented citation markers stripped, markers moved to the chunk that supports "
    "their claim, figures grounded, or the reply of the one repair call); an IDK or a decline "
    "the model chose is the model's too, also where the service spells it as its fixed "
    "sentence (a json_schema `idk` or `decline` step). `service`: no model reply is the "
    "answer: the service composed it from its own tool results without calling the model "
    "(live data, a quoted reference entry, a greeting, a not-found, a routed IDK), or put its "
    "own text in place of the model's reply (the IDK answer for an ungrounded or empty reply "
    "or an exhausted tool loop or cap, the provider-error message)."
)


class RetrievalOut(BaseModel):
    hallucinated_citations: list[str] = Field(default_factory=list)
    chunks_seen: int = 0  # distinct chunks search_docs returned during the run
    chunk_ids: list[str] = Field(default_factory=list)
    # Figures, ids and names the model wrote that no tool result or chunk of this run holds
    # (agent.grounding); the answer was repaired without them, or replaced by the IDK answer.
    ungrounded: list[str] = Field(default_factory=list)


class AgentError(BaseModel):
    """Why a run ended in ``provider_error`` (safe to show: no keys, no provider bodies)."""

    code: Literal["provider_unavailable", "provider_rejected", "malformed_reply"]
    message: str
    status_code: int | None = None  # the provider's HTTP status, when there was one


class AgentAnswer(BaseModel):
    answer: str
    citations: list[CitationOut] = Field(default_factory=list)
    tool_calls: list[ToolCallTrace] = Field(default_factory=list)
    usage: UsageOut = Field(default_factory=UsageOut)
    cost: CostOut = Field(default_factory=CostOut)
    idk: bool = False
    decision: Decision
    answered_by: AnsweredBy = Field(description=ANSWERED_BY_DESCRIPTION)
    retrieval: RetrievalOut = Field(default_factory=RetrievalOut)
    model: str
    trace_id: str | None = None
    notes: list[str] = Field(default_factory=list)  # e.g. "declined after 2 tool calls"
    error: AgentError | None = None


class ToolEvent(BaseModel):
    type: Literal["tool"] = "tool"
    call: ToolCallTrace


ProgressStage = Literal["started", "route", "model", "waiting", "tool_started"]


class ProgressEvent(BaseModel):
    """What the run is doing, so a person sees it move before the first token (which a small
    local model may take many seconds to produce, longer when queued behind other requests).

    Stages, and the fields each carries (the others stay ``None``):

    - ``started``: the run began (the first event of every run); ``model``: who answers.
    - ``route``: which way the planner routed the question (``agent.small_model.planning``,
      json_schema mode by default); ``route``: ``documentation``, ``live_data``, ``both``,
      ``greeting`` or ``open`` (no signal: the model chooses, and may decline).
    - ``model``: a model call begins; ``hop`` (1-based) and ``model``.
    - ``waiting``: the model call has produced nothing yet (queued for a slot, or still
      reading the prompt); ``hop`` and ``elapsed_s`` since the call began, every few seconds.
    - ``tool_started``: a tool is about to run; ``tool`` and ``arguments`` as the model sent
      them. Its end is the ``tool`` event, unchanged.

    Informational only: ``done`` stays the authoritative answer, and a client may ignore it.
    """

    type: Literal["progress"] = "progress"
    stage: ProgressStage
    model: str | None = None
    route: str | None = None
    hop: int | None = None
    elapsed_s: float | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None


class TokenEvent(BaseModel):
    type: Literal["token"] = "token"
    text: str


class CitationEvent(BaseModel):
    type: Literal["citation"] = "citation"
    citation: CitationOut


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    response: AgentAnswer


AgentEvent = ProgressEvent | ToolEvent | TokenEvent | CitationEvent | DoneEvent
