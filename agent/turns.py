"""Earlier turns of a conversation as the agent reads them (``PriorTurn``): the caller's
question, the answer, and the entities its successful tool calls used, each with the kind
the tool's schema declares (``EntityRefOut``: stored with the turn's tool calls). The
conversation layer builds them from stored turns (``prior_turn``) and hands them to the
agent once (``AgentRequest.earlier``); the agent derives both what the model is shown
(``history_messages``, fitted to ``HISTORY_MAX_TOKENS``) and what a strategy reads (the
newest ``MAX_EARLIER``) from that one list.

The model's history: the newest turns first, each whole (its question as a ``user`` message,
its answer as an ``assistant`` message), for as long as the next older turn still fits in the
budget; the first that does not fit ends the history (no gaps, nothing cut in half). The
messages go oldest first, between the system prompt and the question. The current question is
never part of the budget and never shortened. Tool results of earlier turns are not kept in a
turn at all, so none is sent; citation markers (``[^chunk]``) are taken out of earlier answers
(their chunks belong to another run: the model could only repeat them as invented citations).

Counting: no answer model's tokenizer runs in the service (the providers' are not installed,
and the local Qwen's lives in the llama.cpp server, which offers no tokenizer route through
the local LLM app), so tokens are estimated, on the high side for the byte-pair tokenizers in
use (Qwen2.5's, OpenAI's o200k): a digit is one token (Qwen splits numbers into digits), other
ASCII text one token per 3 characters (English runs about 4), other text one token per 2
UTF-8 bytes (a CJK character is 3 bytes and 1-2 tokens), and ``MESSAGE_OVERHEAD_TOKENS`` per
message for the chat template's role markers. An overestimate sends a turn fewer, never a
prompt over the budget."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from agent.citations import MARKER
from agent.llm.base import Message
from foundation.records import ToolCallTrace

__all__ = [
    "MAX_EARLIER",
    "MESSAGE_OVERHEAD_TOKENS",
    "PriorTurn",
    "TokenCounter",
    "estimate_tokens",
    "history_messages",
    "prior_turn",
    "without_markers",
]

MAX_EARLIER = 4  # earlier turns a follow-up may draw on (newest first)
MESSAGE_OVERHEAD_TOKENS = 5  # Qwen's "<|im_start|>user\n" ... "<|im_end|>\n"
_MARKER_WITH_SPACE = re.compile(r"\s*" + MARKER.pattern)

TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class PriorTurn:
    """One earlier turn of the caller's conversation, as the rewriter reads it: its question,
    its answer, and the entities its successful tool calls used, as (kind, id), first used
    first (all produced as the caller)."""

    question: str
    answer: str = ""
    entities: tuple[tuple[str, str], ...] = ()

    @property
    def entity_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(entity_id for _, entity_id in self.entities))

    def ids_of(self, kind: str) -> tuple[str, ...]:
        """The ids of ``kind`` ("building", "room") its tool calls used."""
        return tuple(entity_id for k, entity_id in self.entities if k == kind)


def prior_turn(question: str, answer: str, calls: Iterable[ToolCallTrace]) -> PriorTurn:
    """A finished turn as the rewriter reads it: the entities its successful tool calls used
    (a failed call's, such as a not-found id, are not carried)."""
    entities = ((entity.kind, entity.id) for call in calls if call.ok for entity in call.entities)
    return PriorTurn(question, answer, tuple(dict.fromkeys(entities)))


def estimate_tokens(text: str) -> int:
    """An estimate of ``text``'s tokens, on the high side (see the module docstring)."""
    digits = ascii_other = other_bytes = 0
    for char in text:
        if char.isascii():
            if char.isdigit():
                digits += 1
            else:
                ascii_other += 1
        else:
            other_bytes += len(char.encode("utf-8", "surrogatepass"))
    return digits + math.ceil(ascii_other / 3) + math.ceil(other_bytes / 2)


def without_markers(answer: str) -> str:
    return _MARKER_WITH_SPACE.sub("", answer)


def history_messages(
    turns: Sequence[PriorTurn], *, max_tokens: int | None, count: TokenCounter = estimate_tokens
) -> tuple[Message, ...]:
    """The newest whole turns of ``turns`` (oldest first) that fit in ``max_tokens``, as
    messages, oldest first. ``max_tokens`` 0: none; None: all."""
    picked: list[tuple[Message, Message]] = []
    used = 0
    for turn in reversed(turns):
        question = Message("user", turn.question)
        answer = Message("assistant", without_markers(turn.answer))
        cost = count(question.content or "") + count(answer.content or "")
        cost += 2 * MESSAGE_OVERHEAD_TOKENS
        if max_tokens is not None and used + cost > max_tokens:
            break
        used += cost
        picked.append((question, answer))
    return tuple(message for pair in reversed(picked) for message in pair)
