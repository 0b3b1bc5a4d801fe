"""Feedback on turns: the ``FeedbackStore`` port, its PostgreSQL adapter (table
``turn_feedback`` of migration 0004) and an in-process one over any ``ConversationStore``.

A turn is rated by its owner only: by ``(conversation_id, turn)`` or by its trace id, which
is looked up among the owner's own turns. Another owner's conversation is exactly as absent
as an unknown one (``NoSuchConversation``, from the same statement); the owner's own
conversation without that turn is ``NoSuchTurn``; a trace id none of the owner's turns carry
is ``None``. A trace id can name more than one of the owner's turns (a caller that sends the
same ``traceparent`` with several questions): ``AmbiguousTrace``, rate it by turn instead.

One feedback per turn: rating it again replaces the rating, comment and expected answer
(``FeedbackReceipt.replaced``; ``created_at`` is the first rating's time, ``updated_at`` the
latest). No history is kept: the export wants the rater's current view of the turn.

The rater's roles and domains are stored with the feedback (a turn keeps only its owner's
``sub``): what ``agent-service eval export-feedback`` writes as the golden row's ``as``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import asyncpg

from conversations.store import ConversationStore, NoSuchConversation
from foundation.database import open_pool_at_head
from foundation.records import CitationOut, ToolCallTrace

Rating = Literal["up", "down"]
RATINGS: tuple[Rating, ...] = ("up", "down")
MAX_COMMENT_CHARS = 2000
MAX_EXPECTED_ANSWER_CHARS = 4000


class NoSuchTurn(LookupError):
    """The owner's conversation holds no turn with this number."""

    def __init__(self, conversation_id: uuid.UUID, turn: int) -> None:
        super().__init__(f"conversation {conversation_id} has no turn {turn}")
        self.conversation_id = conversation_id
        self.turn = turn


class AmbiguousTrace(Exception):
    """Several of the owner's turns carry this trace id."""

    def __init__(self, trace_id: str, turns: list[tuple[uuid.UUID, int]]) -> None:
        super().__init__(f"{len(turns)} turns carry trace id {trace_id}")
        self.trace_id = trace_id
        self.turns = turns


@dataclass(frozen=True)
class Rater:
    """Who rated the turn (its owner), as they were when they rated it."""

    sub: str
    roles: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()


@dataclass(frozen=True)
class Feedback:
    rating: Rating
    rater: Rater
    comment: str | None = None
    expected_answer: str | None = None


@dataclass(frozen=True)
class FeedbackReceipt:
    """What was stored: the turn it is on (with the turn's trace id) and when."""

    conversation_id: uuid.UUID
    turn: int
    trace_id: str | None
    rating: Rating
    replaced: bool  # the turn had feedback before; this replaced it
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class RatedTurn:
    """A rated turn with what the export needs of it (``evals.feedback_export``)."""

    conversation_id: uuid.UUID
    turn: int
    question: str
    answer: str
    decision: str
    trace_id: str | None
    citations: tuple[CitationOut, ...]
    tool_calls: tuple[ToolCallTrace, ...]
    rating: Rating
    comment: str | None
    expected_answer: str | None
    rater_sub: str
    rater_roles: tuple[str, ...]
    rater_domains: tuple[str, ...]
    rated_at: datetime

    @property
    def tools_run(self) -> tuple[str, ...]:
        """The tools whose calls succeeded, in the order they first ran."""
        return tuple(dict.fromkeys(call.name for call in self.tool_calls if call.ok))

    @property
    def cited_sources(self) -> tuple[str, ...]:
        """The sources of the cited chunks, in the order first cited."""
        return tuple(dict.fromkeys(c.source for c in self.citations))


class FeedbackStore(Protocol):
    async def rate_turn(
        self, owner: str, conversation_id: uuid.UUID, turn: int, feedback: Feedback
    ) -> FeedbackReceipt:
        """Store ``feedback`` on the turn. Raises ``NoSuchConversation`` (not ``owner``'s,
        or gone) or ``NoSuchTurn`` (``owner``'s, without that turn)."""
        ...

    async def rate_trace(
        self, owner: str, trace_id: str, feedback: Feedback
    ) -> FeedbackReceipt | None:
        """Store ``feedback`` on the one turn of ``owner``'s with this trace id (None: no
        turn of theirs has it; ``AmbiguousTrace``: several do)."""
        ...

    async def close(self) -> None: ...


def _clean(text: str | None) -> str | None:
    """PostgreSQL text cannot hold U+0000 (as ``conversations.store``)."""
    return None if text is None else text.replace("\x00", "\ufffd")


# --- PostgreSQL ----------------------------------------------------------------------------------

UPSERT_SQL = """
INSERT INTO turn_feedback (conversation_id, turn, rating, comment, expected_answer,
                           rater_sub, rater_roles, rater_domains)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (conversation_id, turn) DO UPDATE SET
    rating = EXCLUDED.rating,
    comment = EXCLUDED.comment,
    expected_answer = EXCLUDED.expected_answer,
    rater_sub = EXCLUDED.rater_sub,
    rater_roles = EXCLUDED.rater_roles,
    rater_domains = EXCLUDED.rater_domains,
    updated_at = now()
RETURNING created_at, updated_at, (xmax = 0) AS inserted
"""
# The owner's conversation (locked against a concurrent delete until the feedback is
# written) and, if it has one, the turn: one statement whether the conversation is unknown
# or another owner's.
TURN_SQL = """
SELECT t.turn, t.trace_id FROM conversations c
LEFT JOIN conversation_turns t ON t.conversation_id = c.id AND t.turn = $3
WHERE c.id = $1 AND c.owner_sub = $2
FOR SHARE OF c
"""
TRACE_SQL = """
SELECT t.conversation_id, t.turn FROM conversation_turns t
JOIN conversations c ON c.id = t.conversation_id
WHERE t.trace_id = $1 AND c.owner_sub = $2
ORDER BY t.created_at, t.conversation_id, t.turn
LIMIT 3
FOR SHARE OF c
"""
RATED_SQL = """
SELECT f.conversation_id, f.turn, f.rating, f.comment, f.expected_answer, f.rater_sub,
       f.rater_roles, f.rater_domains, f.updated_at,
       t.question, t.answer, t.decision, t.trace_id, t.citations, t.tool_calls
FROM turn_feedback f
JOIN conversation_turns t USING (conversation_id, turn)
WHERE ($1::text IS NULL OR f.rating = $1) AND ($2::timestamptz IS NULL OR f.updated_at >= $2)
ORDER BY f.updated_at, f.conversation_id, f.turn
"""


class PgFeedbackStore:
    """The ``FeedbackStore`` port on PostgreSQL, plus ``rated`` for the export."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, url: str, *, min_size: int = 1, max_size: int = 2) -> PgFeedbackStore:
        """Open a pool, refusing a database whose schema is missing or not at head."""
        return cls(await open_pool_at_head(url, min_size=min_size, max_size=max_size))

    async def close(self) -> None:
        await self._pool.close()

    async def _upsert(
        self,
        conn: asyncpg.Connection,
        conversation_id: uuid.UUID,
        turn: int,
        trace_id: str | None,
        feedback: Feedback,
    ) -> FeedbackReceipt:
        row = await conn.fetchrow(
            UPSERT_SQL,
            conversation_id,
            turn,
            feedback.rating,
            _clean(feedback.comment),
            _clean(feedback.expected_answer),
            _clean(feedback.rater.sub),
            [_clean(r) for r in feedback.rater.roles],
            [_clean(d) for d in feedback.rater.domains],
        )
        assert row is not None
        return FeedbackReceipt(
            conversation_id=conversation_id,
            turn=turn,
            trace_id=trace_id,
            rating=feedback.rating,
            replaced=not row["inserted"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    async def rate_turn(
        self, owner: str, conversation_id: uuid.UUID, turn: int, feedback: Feedback
    ) -> FeedbackReceipt:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(TURN_SQL, conversation_id, owner, turn)
            if row is None:
                raise NoSuchConversation(str(conversation_id))
            if row["turn"] is None:
                raise NoSuchTurn(conversation_id, turn)
            return await self._upsert(conn, conversation_id, turn, row["trace_id"], feedback)

    async def rate_trace(
        self, owner: str, trace_id: str, feedback: Feedback
    ) -> FeedbackReceipt | None:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(TRACE_SQL, trace_id, owner)
            if not rows:
                return None
            if len(rows) > 1:
                raise AmbiguousTrace(trace_id, [(r["conversation_id"], r["turn"]) for r in rows])
            return await self._upsert(
                conn, rows[0]["conversation_id"], rows[0]["turn"], trace_id, feedback
            )

    async def rated(
        self, *, rating: Rating | None = None, since: datetime | None = None
    ) -> list[RatedTurn]:
        """Every owner's rated turns (``rating`` only, rated at or after ``since``), the
        oldest rating first. For the export (an operator's command), not for the API."""
        rows = await self._pool.fetch(RATED_SQL, rating, since)
        return [_rated(row) for row in rows]


def _rated(row: asyncpg.Record) -> RatedTurn:
    return RatedTurn(
        conversation_id=uuid.UUID(str(row["conversation_id"])),
        turn=row["turn"],
        question=row["question"],
        answer=row["answer"],
        decision=row["decision"],
        trace_id=row["trace_id"],
        citations=tuple(CitationOut(**item) for item in _json_list(row["citations"])),
        tool_calls=tuple(ToolCallTrace(**item) for item in _json_list(row["tool_calls"])),
        rating=row["rating"],
        comment=row["comment"],
        expected_answer=row["expected_answer"],
        rater_sub=row["rater_sub"],
        rater_roles=tuple(row["rater_roles"]),
        rater_domains=tuple(row["rater_domains"]),
        rated_at=row["updated_at"],
    )


def _json_list(raw: str) -> list[dict[str, Any]]:
    value = json.loads(raw)
    return value if isinstance(value, list) else []


# --- in process ----------------------------------------------------------------------------------


@dataclass
class _Entry:
    feedback: Feedback
    created_at: datetime
    updated_at: datetime


class InMemoryFeedbackStore:
    """The ``FeedbackStore`` port in a dict, over a ``ConversationStore``'s own reads (its
    owner rule included). For tests and fakes over an in-memory conversation store."""

    def __init__(self, conversations: ConversationStore) -> None:
        self._conversations = conversations
        self.entries: dict[tuple[uuid.UUID, int], _Entry] = {}

    def _store(
        self, conversation_id: uuid.UUID, turn: int, trace_id: str | None, feedback: Feedback
    ) -> FeedbackReceipt:
        now = datetime.now(UTC)
        key = (conversation_id, turn)
        before = self.entries.get(key)
        created = before.created_at if before is not None else now
        self.entries[key] = _Entry(feedback, created, now)
        return FeedbackReceipt(
            conversation_id, turn, trace_id, feedback.rating, before is not None, created, now
        )

    async def rate_turn(
        self, owner: str, conversation_id: uuid.UUID, turn: int, feedback: Feedback
    ) -> FeedbackReceipt:
        found = await self._conversations.read(owner, conversation_id)
        if found is None:
            raise NoSuchConversation(str(conversation_id))
        for stored in found[1]:
            if stored.number == turn:
                return self._store(conversation_id, turn, stored.record.trace_id, feedback)
        raise NoSuchTurn(conversation_id, turn)

    async def rate_trace(
        self, owner: str, trace_id: str, feedback: Feedback
    ) -> FeedbackReceipt | None:
        matches: list[tuple[uuid.UUID, int]] = []
        page = await self._conversations.recent(owner, limit=100)
        while True:
            for conversation in page.conversations:
                found = await self._conversations.read(owner, conversation.id)
                for stored in found[1] if found is not None else []:
                    if stored.record.trace_id == trace_id:
                        matches.append((conversation.id, stored.number))
            if page.next_cursor is None:
                break
            page = await self._conversations.recent(owner, limit=100, after=page.next_cursor)
        if not matches:
            return None
        if len(matches) > 1:
            raise AmbiguousTrace(trace_id, matches)
        return self._store(matches[0][0], matches[0][1], trace_id, feedback)

    async def close(self) -> None:
        return None
