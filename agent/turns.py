"""Earlier turns of a conversation as the agent reads them (``PriorTurn``): the caller's
question, the answer, and the building and room ids its successful tool calls used. The
conversation layer builds them from stored turns (``prior_turn``); a caller that has only
the model's history gets them read back from it (``prior_turns_from_history``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.llm.base import Message

__all__ = [
    "ENTITY_ARGUMENTS",
    "MAX_EARLIER",
    "PriorTurn",
    "ToolCallLike",
    "prior_turn",
    "prior_turns_from_history",
]

MAX_EARLIER = 4  # earlier turns a follow-up may draw on (newest first)
ENTITY_ARGUMENTS = ("building_id", "room_id", "room_ids")  # tool arguments naming entities


@dataclass(frozen=True)
class PriorTurn:
    """One earlier turn of the caller's conversation, as the rewriter reads it: its question,
    its answer, and the building and room ids its successful tool calls used (all produced
    as the caller)."""

    question: str
    answer: str = ""
    entity_ids: tuple[str, ...] = ()


class ToolCallLike(Protocol):
    """A tool call of a finished turn (``agent.answer.ToolCallTrace``, a stored turn's)."""

    @property
    def arguments(self) -> Mapping[str, Any]: ...

    @property
    def ok(self) -> bool: ...


def prior_turn(question: str, answer: str, calls: Iterable[ToolCallLike]) -> PriorTurn:
    """A finished turn as the rewriter reads it: the building and room ids its successful
    tool calls used (a failed call's ids, such as a not-found one, are not carried)."""
    ids: list[str] = []
    for call in calls:
        if not call.ok:
            continue
        for key in ENTITY_ARGUMENTS:
            value = call.arguments.get(key)
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item:
                    ids.append(item)
    return PriorTurn(question, answer, tuple(dict.fromkeys(ids)))


def prior_turns_from_history(history: Sequence[Message]) -> tuple[PriorTurn, ...]:
    """Earlier turns read back from history messages (each ``user`` question and the
    ``assistant`` answer after it), for callers that pass only the model's history."""
    turns: list[PriorTurn] = []
    question: str | None = None
    for message in history:
        if message.role == "user":
            if question is not None:
                turns.append(PriorTurn(question))
            question = message.content or ""
        elif message.role == "assistant" and question is not None:
            turns.append(PriorTurn(question, message.content or ""))
            question = None
    if question is not None:
        turns.append(PriorTurn(question))
    return tuple(turns)
