"""The ``ConversationStore`` port and its PostgreSQL adapter.

A conversation belongs to one owner (the caller's ``sub``): every read and write names the
owner, and a conversation of another owner is exactly as absent as one that never existed
(the same statement, the same ``None``), so no caller can tell them apart.

Writes are whole turns: ``start`` creates a conversation with its first turn, ``append``
locks the conversation's row, checks its owner and its turn limit, and writes the next turn,
each in one transaction. A failure or a cancellation anywhere in it (the connection lost,
the task cancelled) rolls all of it back: a turn is stored whole or not at all, and the
conversation's turn count always equals its turns.

Pages of a caller's conversations run newest activity first (``updated_at``, then ``id``)
and are keyset-paginated: ``PageCursor`` is the last row of a page.

Retention: ``delete_all`` removes every conversation of one owner; ``PgConversationStore.
prune`` removes, in batches of their own transactions, every conversation whose latest turn
(``updated_at``) is older than a time to live (``CONVERSATION_TTL_DAYS``,
``agent-service conversations prune``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import asyncpg

from foundation.database import open_pool_at_head
from foundation.records import CitationOut, CostOut, ToolCallTrace, UsageOut

JsonObject = dict[str, Any]

TITLE_CHARS = 120  # a conversation's title: the start of its first question


class ConversationStoreError(Exception):
    """A conversation write refused by the store's rules (not a database failure)."""


class NoSuchConversation(ConversationStoreError, LookupError):
    """No conversation with this id belongs to this owner (none exists, another owner's, or
    it was deleted)."""


class ConversationFull(ConversationStoreError):
    """The conversation already holds ``max_turns`` turns."""

    def __init__(self, conversation_id: uuid.UUID, max_turns: int) -> None:
        super().__init__(f"conversation {conversation_id} already holds {max_turns} turns")
        self.conversation_id = conversation_id
        self.max_turns = max_turns


@dataclass(frozen=True)
class TurnRecord:
    """One question and what answered it: what ``start`` and ``append`` write."""

    question: str
    answer: str
    decision: str
    idk: bool
    model: str
    trace_id: str | None = None
    citations: tuple[CitationOut, ...] = ()
    tool_calls: tuple[ToolCallTrace, ...] = ()
    usage: UsageOut = field(default_factory=UsageOut)
    cost: CostOut = field(default_factory=CostOut)
    # Who wrote the answer: "model" or "service" (the agent's ``answered_by``); None for a
    # turn stored before it was recorded (migration 0005).
    answered_by: str | None = None


@dataclass(frozen=True)
class Turn:
    """A stored turn: its number in the conversation (from 1) and when it was written.
    ``answer_withheld``: read with a citation the reader can no longer see, so its answer is
    not the stored one (``conversations.recheck``)."""

    number: int
    created_at: datetime
    record: TurnRecord
    answer_withheld: bool = False


@dataclass(frozen=True)
class Conversation:
    id: uuid.UUID
    owner: str
    title: str
    turn_count: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class PageCursor:
    """Where the next page starts: the last conversation of the page before."""

    updated_at: datetime
    id: uuid.UUID


@dataclass(frozen=True)
class ConversationPage:
    conversations: list[Conversation]
    next_cursor: PageCursor | None  # None: this was the last page


@dataclass(frozen=True)
class PruneReport:
    """What ``prune`` deleted (or, in a dry run, would delete): conversations last active
    before ``cutoff``, with their turns."""

    cutoff: datetime
    conversations: int
    turns: int
    batches: int
    dry_run: bool = False


class ConversationStore(Protocol):
    async def get(self, owner: str, conversation_id: uuid.UUID) -> Conversation | None:
        """The conversation, if it belongs to ``owner``."""
        ...

    async def read(
        self, owner: str, conversation_id: uuid.UUID
    ) -> tuple[Conversation, list[Turn]] | None:
        """The conversation and its turns in order, if it belongs to ``owner``."""
        ...

    async def recent(
        self, owner: str, *, limit: int, after: PageCursor | None = None
    ) -> ConversationPage:
        """``owner``'s conversations, most recently active first, ``limit`` at a time."""
        ...

    async def start(self, owner: str, record: TurnRecord) -> tuple[Conversation, Turn]:
        """A new conversation of ``owner`` holding ``record`` as its turn 1."""
        ...

    async def append(
        self, owner: str, conversation_id: uuid.UUID, record: TurnRecord, *, max_turns: int
    ) -> tuple[Conversation, Turn]:
        """``record`` as the conversation's next turn. Raises ``NoSuchConversation`` (not
        ``owner``'s, or gone) or ``ConversationFull`` (it holds ``max_turns``)."""
        ...

    async def delete(self, owner: str, conversation_id: uuid.UUID) -> bool:
        """Delete the conversation and its turns; False when ``owner`` has no such one."""
        ...

    async def delete_all(self, owner: str) -> int:
        """Delete every conversation of ``owner`` (with their turns); how many there were."""
        ...

    async def close(self) -> None: ...


def title_of(question: str) -> str:
    """A conversation's title: its first question's first line, at most ``TITLE_CHARS``."""
    line = " ".join(question.split("\n", 1)[0].split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


# --- PostgreSQL ----------------------------------------------------------------------------------

CONVERSATION_COLUMNS = "id, owner_sub, title, turn_count, created_at, updated_at"
TURN_COLUMNS = (
    "turn, question, answer, decision, idk, citations, tool_calls, usage, cost, model, "
    "trace_id, answered_by, created_at"
)
PRUNE_BATCH = 1000
# One batch of a prune, in a transaction of its own. No index leads with updated_at (the one
# there leads with the owner), so each batch scans the table: LIMIT without ORDER BY stops at
# the first batch_size matches. SKIP LOCKED passes over a conversation whose turn is being
# written; FOR UPDATE re-checks updated_at on the row it locked.
PRUNE_BATCH_SQL = """
WITH doomed AS (
    SELECT id FROM conversations WHERE updated_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED
)
DELETE FROM conversations c USING doomed d WHERE c.id = d.id RETURNING c.turn_count
"""
INSERT_TURN_SQL = f"""
INSERT INTO conversation_turns (conversation_id, {TURN_COLUMNS})
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb, $11, $12, $13, $14)
RETURNING created_at
"""


def _clean(value: Any) -> Any:
    """PostgreSQL text and jsonb cannot hold U+0000: it becomes U+FFFD (a question may hold
    one; the statement would fail and lose the turn)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(_clean(value), ensure_ascii=False, separators=(",", ":"))


def _conversation(row: asyncpg.Record) -> Conversation:
    return Conversation(
        id=uuid.UUID(str(row["id"])),
        owner=row["owner_sub"],
        title=row["title"],
        turn_count=row["turn_count"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _turn(row: asyncpg.Record) -> Turn:
    citations = tuple(CitationOut(**item) for item in json.loads(row["citations"]))
    tool_calls = tuple(ToolCallTrace(**item) for item in json.loads(row["tool_calls"]))
    return Turn(
        number=row["turn"],
        created_at=row["created_at"],
        record=TurnRecord(
            question=row["question"],
            answer=row["answer"],
            decision=row["decision"],
            idk=row["idk"],
            model=row["model"],
            trace_id=row["trace_id"],
            citations=citations,
            tool_calls=tool_calls,
            usage=UsageOut.model_validate(json.loads(row["usage"])),
            cost=CostOut.model_validate(json.loads(row["cost"])),
            answered_by=row["answered_by"],
        ),
    )


def _turn_args(conversation_id: uuid.UUID, number: int, record: TurnRecord) -> Sequence[Any]:
    return (
        conversation_id,
        number,
        _clean(record.question),
        _clean(record.answer),
        record.decision,
        record.idk,
        _json([c.model_dump(mode="json") for c in record.citations]),
        _json([t.model_dump(mode="json") for t in record.tool_calls]),
        _json(record.usage.model_dump(mode="json")),
        _json(record.cost.model_dump(mode="json")),
        _clean(record.model),
        None if record.trace_id is None else _clean(record.trace_id),
        record.answered_by,
        # created_at: the transaction's time, as the conversation's updated_at
    )


@dataclass(frozen=True)
class ConversationsConfig:
    """How the conversation store is opened and kept (``serve_app.wiring.conversations_config``):
    its pool (DB_POOL_*) and how long an inactive conversation is kept (CONVERSATION_TTL_DAYS;
    0: for ever, there is nothing to prune)."""

    ttl_days: int = 0
    min_size: int = 1
    max_size: int = 10

    @property
    def ttl(self) -> timedelta | None:
        return timedelta(days=self.ttl_days) if self.ttl_days > 0 else None


class PgConversationStore:
    """The ``ConversationStore`` port on PostgreSQL (tables of migration 0002)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def connect(
        cls, url: str, *, min_size: int = 1, max_size: int = 10
    ) -> PgConversationStore:
        """Open a pool, refusing a database whose schema is missing or not at head."""
        return cls(await open_pool_at_head(url, min_size=min_size, max_size=max_size))

    @classmethod
    async def open(cls, url: str, config: ConversationsConfig) -> PgConversationStore:
        """``connect`` with ``config``'s pool."""
        return await cls.connect(url, min_size=config.min_size, max_size=config.max_size)

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    async def close(self) -> None:
        await self._pool.close()

    async def get(self, owner: str, conversation_id: uuid.UUID) -> Conversation | None:
        row = await self._pool.fetchrow(
            f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = $1 AND owner_sub = $2",
            conversation_id,
            owner,
        )
        return None if row is None else _conversation(row)

    async def read(
        self, owner: str, conversation_id: uuid.UUID
    ) -> tuple[Conversation, list[Turn]] | None:
        # One transaction, so the turns are those the conversation row counts.
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            row = await conn.fetchrow(
                f"SELECT {CONVERSATION_COLUMNS} FROM conversations "
                "WHERE id = $1 AND owner_sub = $2",
                conversation_id,
                owner,
            )
            if row is None:
                return None
            turns = await conn.fetch(
                f"SELECT {TURN_COLUMNS} FROM conversation_turns "
                "WHERE conversation_id = $1 ORDER BY turn",
                conversation_id,
            )
        return _conversation(row), [_turn(t) for t in turns]

    async def recent(
        self, owner: str, *, limit: int, after: PageCursor | None = None
    ) -> ConversationPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if after is None:
            rows = await self._pool.fetch(
                f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE owner_sub = $1 "
                "ORDER BY updated_at DESC, id DESC LIMIT $2",
                owner,
                limit + 1,
            )
        else:
            rows = await self._pool.fetch(
                f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE owner_sub = $1 "
                "AND (updated_at, id) < ($2, $3) "
                "ORDER BY updated_at DESC, id DESC LIMIT $4",
                owner,
                after.updated_at,
                after.id,
                limit + 1,
            )
        conversations = [_conversation(r) for r in rows[:limit]]
        more = len(rows) > limit
        last = conversations[-1] if more else None
        return ConversationPage(
            conversations=conversations,
            next_cursor=None if last is None else PageCursor(last.updated_at, last.id),
        )

    async def start(self, owner: str, record: TurnRecord) -> tuple[Conversation, Turn]:
        conversation_id = uuid.uuid4()
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "INSERT INTO conversations (id, owner_sub, title, turn_count) "
                f"VALUES ($1, $2, $3, 1) RETURNING {CONVERSATION_COLUMNS}",
                conversation_id,
                owner,
                _clean(title_of(record.question)),
            )
            assert row is not None
            conversation = _conversation(row)
            created_at = await conn.fetchval(
                INSERT_TURN_SQL, *_turn_args(conversation_id, 1, record), conversation.updated_at
            )
        return conversation, Turn(number=1, created_at=created_at, record=record)

    async def append(
        self, owner: str, conversation_id: uuid.UUID, record: TurnRecord, *, max_turns: int
    ) -> tuple[Conversation, Turn]:
        async with self._pool.acquire() as conn, conn.transaction():
            # The row lock orders concurrent appends to one conversation (turn numbers stay
            # dense, the limit holds) and waits out a concurrent delete.
            count = await conn.fetchval(
                "SELECT turn_count FROM conversations WHERE id = $1 AND owner_sub = $2 FOR UPDATE",
                conversation_id,
                owner,
            )
            if count is None:
                raise NoSuchConversation(str(conversation_id))
            if count >= max_turns:
                raise ConversationFull(conversation_id, max_turns)
            row = await conn.fetchrow(
                "UPDATE conversations SET turn_count = turn_count + 1, updated_at = now() "
                f"WHERE id = $1 RETURNING {CONVERSATION_COLUMNS}",
                conversation_id,
            )
            assert row is not None
            conversation = _conversation(row)
            number = conversation.turn_count
            created_at = await conn.fetchval(
                INSERT_TURN_SQL,
                *_turn_args(conversation_id, number, record),
                conversation.updated_at,
            )
        return conversation, Turn(number=number, created_at=created_at, record=record)

    async def delete(self, owner: str, conversation_id: uuid.UUID) -> bool:
        deleted = await self._pool.fetchval(
            "DELETE FROM conversations WHERE id = $1 AND owner_sub = $2 RETURNING id",
            conversation_id,
            owner,
        )
        return deleted is not None

    async def delete_all(self, owner: str) -> int:
        # One statement (the owner index): the turns go with them (ON DELETE CASCADE).
        count = await self._pool.fetchval(
            "WITH gone AS (DELETE FROM conversations WHERE owner_sub = $1 RETURNING 1) "
            "SELECT count(*) FROM gone",
            owner,
        )
        return int(count)

    async def prune(
        self, ttl: timedelta, *, batch_size: int = PRUNE_BATCH, dry_run: bool = False
    ) -> PruneReport:
        """Delete every conversation last active (``updated_at``) more than ``ttl`` before
        now (the database's clock, read once), ``batch_size`` per transaction, so no lock
        is held for long and a large store is pruned a batch at a time. A conversation that
        gets a turn while it runs is kept: rows are locked (a turn being written is skipped)
        and their ``updated_at`` re-checked when locked. ``dry_run``: count, delete nothing."""
        if ttl <= timedelta(0):
            raise ValueError("the time to live must be positive")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        cutoff: datetime = await self._pool.fetchval("SELECT now() - $1::interval", ttl)
        if dry_run:
            row = await self._pool.fetchrow(
                "SELECT count(*) AS c, coalesce(sum(turn_count), 0) AS t "
                "FROM conversations WHERE updated_at < $1",
                cutoff,
            )
            assert row is not None
            return PruneReport(cutoff, int(row["c"]), int(row["t"]), 0, dry_run=True)
        conversations = turns = batches = 0
        while True:
            rows = await self._pool.fetch(PRUNE_BATCH_SQL, cutoff, batch_size)
            if rows:
                batches += 1
                conversations += len(rows)
                turns += sum(r["turn_count"] for r in rows)
            if len(rows) < batch_size:
                return PruneReport(cutoff, conversations, turns, batches)
