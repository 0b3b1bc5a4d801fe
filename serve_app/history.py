"""A thread's stored turns as the agent takes them (``PriorTurn``, oldest first): the
question, the answer without citation markers, and the building and room ids of the turn's
successful tool calls. The agent fits them to the model's budget itself
(``agent.turns.history_messages``)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.turns import PriorTurn, prior_turn, without_markers
from conversations.store import Turn


def prior_turns(turns: Sequence[Turn]) -> tuple[PriorTurn, ...]:
    """Every turn of ``turns``, ordered by number (oldest first), as the agent reads it."""
    return tuple(
        prior_turn(t.record.question, without_markers(t.record.answer), t.record.tool_calls)
        for t in sorted(turns, key=lambda t: t.number)
    )
