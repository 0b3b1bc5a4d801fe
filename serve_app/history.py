"""Earlier turns of a conversation, fitted to the model's budget (``HISTORY_MAX_TOKENS``).

What goes to the model: the newest turns first, each whole (its question as a ``user``
message, its answer as an ``assistant`` message), for as long as the next older turn still
fits in the budget; the first that does not fit ends the history (no gaps, nothing cut in
half). The messages go oldest first, between the system prompt and the question
(``Agent.answer(history=...)``). The current question is never part of the budget and never
shortened. Tool results of earlier turns are not kept in a turn at all, so none is sent;
citation markers (``[^chunk]``) are taken out of earlier answers (their chunks belong to
another run: the model could only repeat them as invented citations).

Counting: no answer model's tokenizer runs in this process (the providers' are not installed,
and the local Qwen's lives in the llama.cpp server, which offers no tokenizer route through
the local LLM app), so tokens are estimated, on the high side for the byte-pair tokenizers in
use (Qwen2.5's, OpenAI's o200k): a digit is one token (Qwen splits numbers into digits), other
ASCII text one token per 3 characters (English runs about 4), other text one token per 2
UTF-8 bytes (a CJK character is 3 bytes and 1-2 tokens), and ``MESSAGE_OVERHEAD_TOKENS`` per
message for the chat template's role markers. An overestimate sends a turn fewer, never a
prompt over the budget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from agent.citations import MARKER
from agent.llm.base import Message
from agent.turns import MAX_EARLIER, PriorTurn, prior_turn
from conversations.store import Turn

MESSAGE_OVERHEAD_TOKENS = 5  # Qwen's "<|im_start|>user\n" ... "<|im_end|>\n"
_MARKER_WITH_SPACE = re.compile(r"\s*" + MARKER.pattern)

TokenCounter = Callable[[str], int]


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
    turns: Sequence[Turn], *, max_tokens: int, count: TokenCounter = estimate_tokens
) -> tuple[Message, ...]:
    """The newest whole turns of ``turns`` (oldest first) that fit in ``max_tokens``, as
    messages, oldest first. ``max_tokens`` 0: none."""
    picked: list[tuple[Message, Message]] = []
    used = 0
    for turn in sorted(turns, key=lambda t: t.number, reverse=True):
        question = Message("user", turn.record.question)
        answer = Message("assistant", without_markers(turn.record.answer))
        cost = count(question.content or "") + count(answer.content or "")
        cost += 2 * MESSAGE_OVERHEAD_TOKENS
        if used + cost > max_tokens:
            break
        used += cost
        picked.append((question, answer))
    return tuple(message for pair in reversed(picked) for message in pair)


def prior_turns(turns: Sequence[Turn], *, limit: int = MAX_EARLIER) -> tuple[PriorTurn, ...]:
    """The newest ``limit`` turns, oldest first, as the follow-up rewriter reads them
    (``agent.small_model.followups``): the question, the answer without citation markers, and the
    building and room ids of the turn's successful tool calls. Not sent to the model, so
    not counted against ``HISTORY_MAX_TOKENS``: a follow-up is rewritten from the turns
    before it even where the model's budget holds fewer of them."""
    newest = sorted(turns, key=lambda t: t.number)[-limit:] if limit > 0 else []
    return tuple(
        prior_turn(t.record.question, without_markers(t.record.answer), t.record.tool_calls)
        for t in newest
    )
