"""``AgentRequest``: one question to the agent, the one object that carries it from the HTTP
route across the Ray handle into the loop (JSON and streaming alike)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

from agent.turns import PriorTurn
from foundation.identity import AuthUser

__all__ = ["AgentRequest", "RequestFields"]


@dataclass(frozen=True)
class AgentRequest:
    """``question`` asked by ``user``. ``model``: an override already checked against the
    override policy (None: the client's default). ``top_k``: chunks per search (None:
    TOP_K_FINAL). ``earlier``: the caller's earlier turns of this conversation as the caller
    may be shown them now, oldest first; the agent derives the model's history (fitted to its
    budget) and what its strategy reads from them (``agent.turns``). ``trace_context``: the
    caller's W3C trace carrier, attached by whoever runs the agent in another process."""

    question: str
    user: AuthUser
    model: str | None = None
    top_k: int | None = None
    earlier: tuple[PriorTurn, ...] = ()
    trace_context: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, question: str, user: AuthUser, **fields: Unpack[RequestFields]) -> AgentRequest:
        """The request with ``fields`` (sequences taken as tuples)."""
        return cls(
            question,
            user,
            model=fields.get("model"),
            top_k=fields.get("top_k"),
            earlier=tuple(fields.get("earlier", ())),
        )


class RequestFields(TypedDict, total=False):
    """The optional fields of an ``AgentRequest`` as keywords (``Agent.answer``/``stream``)."""

    model: str | None
    top_k: int | None
    earlier: Sequence[PriorTurn]
