"""``InMemoryConversationStore``: the ``ConversationStore`` port in a dict, with the same
rules as the PostgreSQL adapter (owners, turn limits, whole turns, keyset pages). For unit
tests and in-process fakes; nothing is kept when the process ends."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from conversations.store import (
    Conversation,
    ConversationFull,
    ConversationPage,
    NoSuchConversation,
    PageCursor,
    Turn,
    TurnRecord,
    title_of,
)


@dataclass
class _Thread:
    conversation: Conversation
    turns: list[Turn] = field(default_factory=list)


class InMemoryConversationStore:
    def __init__(self) -> None:
        self._threads: dict[uuid.UUID, _Thread] = {}
        self._lock = threading.Lock()  # no await inside: safe across loops and threads
        self._last = datetime.now(UTC)

    def _now(self) -> datetime:
        # Strictly increasing, so "most recent first" is well defined within a test.
        now = max(datetime.now(UTC), self._last + timedelta(microseconds=1))
        self._last = now
        return now

    def _owned(self, owner: str, conversation_id: uuid.UUID) -> _Thread | None:
        thread = self._threads.get(conversation_id)
        return thread if thread is not None and thread.conversation.owner == owner else None

    async def get(self, owner: str, conversation_id: uuid.UUID) -> Conversation | None:
        thread = self._owned(owner, conversation_id)
        return None if thread is None else thread.conversation

    async def read(
        self, owner: str, conversation_id: uuid.UUID
    ) -> tuple[Conversation, list[Turn]] | None:
        thread = self._owned(owner, conversation_id)
        return None if thread is None else (thread.conversation, list(thread.turns))

    async def recent(
        self, owner: str, *, limit: int, after: PageCursor | None = None
    ) -> ConversationPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        mine = sorted(
            (t.conversation for t in self._threads.values() if t.conversation.owner == owner),
            key=lambda c: (c.updated_at, c.id),
            reverse=True,
        )
        if after is not None:
            mine = [c for c in mine if (c.updated_at, c.id) < (after.updated_at, after.id)]
        page = mine[:limit]
        more = len(mine) > limit
        return ConversationPage(
            conversations=page,
            next_cursor=PageCursor(page[-1].updated_at, page[-1].id) if more else None,
        )

    async def start(self, owner: str, record: TurnRecord) -> tuple[Conversation, Turn]:
        with self._lock:
            now = self._now()
            conversation = Conversation(
                id=uuid.uuid4(),
                owner=owner,
                title=title_of(record.question),
                turn_count=1,
                created_at=now,
                updated_at=now,
            )
            turn = Turn(number=1, created_at=now, record=record)
            self._threads[conversation.id] = _Thread(conversation, [turn])
            return conversation, turn

    async def append(
        self, owner: str, conversation_id: uuid.UUID, record: TurnRecord, *, max_turns: int
    ) -> tuple[Conversation, Turn]:
        with self._lock:
            thread = self._owned(owner, conversation_id)
            if thread is None:
                raise NoSuchConversation(str(conversation_id))
            if thread.conversation.turn_count >= max_turns:
                raise ConversationFull(conversation_id, max_turns)
            now = self._now()
            number = thread.conversation.turn_count + 1
            turn = Turn(number=number, created_at=now, record=record)
            thread.conversation = replace(thread.conversation, turn_count=number, updated_at=now)
            thread.turns.append(turn)
            return thread.conversation, turn

    async def delete(self, owner: str, conversation_id: uuid.UUID) -> bool:
        with self._lock:
            if self._owned(owner, conversation_id) is None:
                return False
            del self._threads[conversation_id]
            return True

    async def delete_all(self, owner: str) -> int:
        with self._lock:
            mine = [i for i, t in self._threads.items() if t.conversation.owner == owner]
            for ident in mine:
                del self._threads[ident]
            return len(mine)

    async def close(self) -> None:
        return None
