"""``/ask`` inside a conversation: the thread is checked before the run, and the finished
run is stored as one whole turn.

Before the run (``open_thread``): a ``conversation_id`` must name one of the caller's
conversations (else ``ConversationNotFound``, 404, the same message for an unknown id and
another caller's) that is not full (else ``ConversationFullError``, 409), so a refused
question spends no model call; its turns become the run's ``earlier`` turns
(``serve_app.history``), which the agent fits to ``HISTORY_MAX_TOKENS``. Without one, the
run starts a new conversation.

Where the write happens, and why a disconnect cannot leave half a turn: the turn is written
once the run has finished, when its final answer (the JSON answer, or the stream's ``done``
event) reaches the API layer, and before that answer is sent, so ``done`` carries the
``conversation_id`` and ``turn`` that were stored. It is one transaction
(``ConversationStore.start``/``append``): the conversation row and the turn are written
together or not at all. The write is shielded from cancellation: a client that disconnects
while it runs does not interrupt it (the finished run is stored); one that disconnects
before the run finishes cancels the run, so there is no final answer and nothing is
written. A write that fails or times out rolls back as a whole.

What is not stored: a ``provider_error`` run (no answer; ask again in the same
conversation). If the conversation was deleted during the run, the answer is refused with
``ConversationDeleted`` (409; the stream's final ``error`` event) and not stored. If the
database cannot be reached when the turn is written, the answer is still returned, with
``turn: null`` (and, for a new conversation, ``conversation_id: null``) and a note saying it
was not stored.

Read-time permissions (``conversations.recheck``): the turns that become the run's earlier
turns are first re-checked against the caller's permissions now (``ChunkVisibility``: the
knowledge base's ACL rule): a turn whose answer cited a chunk the caller can no longer see
(narrowed, or gone) goes to the model with ``WITHHELD_ANSWER`` in place of its answer. The
check fails closed: if it cannot run, the question is refused with 503.

``LazyConversationStore`` is the store both backends hold: the PostgreSQL adapter opened on
first use (and again after a failure), with database failures turned into
``ConversationsUnavailable`` (503).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
from pydantic import Field

from agent.answer import AgentAnswer, AgentEvent, DoneEvent
from agent.turns import PriorTurn
from conversations.recheck import cited_chunk_ids, recheck
from conversations.store import (
    Conversation,
    ConversationFull,
    ConversationPage,
    ConversationsConfig,
    ConversationStore,
    ConversationStoreError,
    NoSuchConversation,
    PageCursor,
    PgConversationStore,
    Turn,
    TurnRecord,
)
from foundation.database import DatabaseError, resolve_database_url
from foundation.identity import AuthUser
from foundation.settings import Settings
from serve_app.backend import (
    ConversationDeleted,
    ConversationFullError,
    ConversationNotFound,
    ConversationsUnavailable,
)
from serve_app.history import prior_turns
from serve_app.knowledge import LazyStore
from serve_app.lazy import OpenedOnFirstUse

log = logging.getLogger(__name__)

T = TypeVar("T")

WRITE_TIMEOUT_S = 10.0
NOT_STORED_NOTE = "not stored in the conversation: the conversation store is unavailable"
UNAVAILABLE_MESSAGE = "the conversation store is unavailable; try again shortly"
# What a database failure looks like from asyncpg and the store's own checks. A server that
# shuts down mid-transaction can surface as InternalClientError ("cannot switch to state 15;
# another operation (2) is in progress"): a simple query (most likely the transaction's
# ROLLBACK) on a connection still reading the server's shutdown error (seen in
# tests/serve_app/api/test_database_restart.py, once in a few runs; before, a 500).
DATABASE_FAILURES = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    DatabaseError,
)


def not_found_message(conversation_id: uuid.UUID) -> str:
    """The 404 message: built from the requested id alone, so an unknown conversation and
    another caller's get byte-identical bodies."""
    return f"no conversation {conversation_id}"


def full_message(conversation_id: uuid.UUID, max_turns: int) -> str:
    return (
        f"conversation {conversation_id} already holds {max_turns} turns "
        "(CONVERSATION_MAX_TURNS); start a new conversation"
    )


# --- the store, opened on first use ----------------------------------------------------------


class LazyConversationStore:
    """The ``ConversationStore`` port over a ``PgConversationStore`` opened on first use (and
    again after a failed attempt). Database failures raise ``ConversationsUnavailable``;
    the store's rules (``NoSuchConversation``, ``ConversationFull``) pass through."""

    def __init__(self, settings: Settings, config: ConversationsConfig) -> None:
        self._settings = settings  # DATABASE_URL, or the embedded server under its home
        self._config = config
        self._store = OpenedOnFirstUse(self._connect)

    async def _connect(self) -> PgConversationStore:
        url = await resolve_database_url(self._settings)
        return await PgConversationStore.open(url, self._config)

    async def _call(self, use: Callable[[PgConversationStore], Awaitable[T]]) -> T:
        try:
            return await use(await self._store.get())
        except DATABASE_FAILURES as exc:
            log.warning("conversation store: %s: %s", type(exc).__name__, exc)
            raise ConversationsUnavailable(UNAVAILABLE_MESSAGE, retry_after=5) from None

    async def get(self, owner: str, conversation_id: uuid.UUID) -> Conversation | None:
        return await self._call(lambda s: s.get(owner, conversation_id))

    async def read(
        self, owner: str, conversation_id: uuid.UUID
    ) -> tuple[Conversation, list[Turn]] | None:
        return await self._call(lambda s: s.read(owner, conversation_id))

    async def recent(
        self, owner: str, *, limit: int, after: PageCursor | None = None
    ) -> ConversationPage:
        return await self._call(lambda s: s.recent(owner, limit=limit, after=after))

    async def start(self, owner: str, record: TurnRecord) -> tuple[Conversation, Turn]:
        return await self._call(lambda s: s.start(owner, record))

    async def append(
        self, owner: str, conversation_id: uuid.UUID, record: TurnRecord, *, max_turns: int
    ) -> tuple[Conversation, Turn]:
        return await self._call(
            lambda s: s.append(owner, conversation_id, record, max_turns=max_turns)
        )

    async def delete(self, owner: str, conversation_id: uuid.UUID) -> bool:
        return await self._call(lambda s: s.delete(owner, conversation_id))

    async def delete_all(self, owner: str) -> int:
        return await self._call(lambda s: s.delete_all(owner))

    async def close(self) -> None:
        await self._store.close()


# --- read-time permissions -------------------------------------------------------------------

# Which of these chunk ids the caller may see now (``ApiBackend.visible_chunks`` bound to the
# caller): the knowledge base's ACL rule, the search's own (``PgDocumentStore``).
ChunkVisibility = Callable[[Collection[str]], Awaitable[set[str]]]


async def visible_chunks(store: LazyStore, user: AuthUser, chunk_ids: Collection[str]) -> set[str]:
    """``store.visible_chunk_ids`` for ``user`` (no statement for no ids); a database failure
    is ``ConversationsUnavailable``: a thread is not shown unchecked."""
    if not chunk_ids:
        return set()
    try:
        return await store.visible_chunk_ids(chunk_ids, user.acl_entries)
    except DATABASE_FAILURES as exc:
        log.warning("citation check: %s: %s", type(exc).__name__, exc)
        raise ConversationsUnavailable(UNAVAILABLE_MESSAGE, retry_after=5) from None


async def rechecked(turns: Iterable[Turn], can_see: ChunkVisibility | None) -> list[Turn]:
    """``turns`` as the caller may be shown them now (``conversations.recheck``): one
    visibility query for all their citations (``can_see`` None: no chunk is visible)."""
    turns = list(turns)
    ids = cited_chunk_ids(turns)
    return recheck(turns, await can_see(ids) if ids and can_see is not None else set())


# --- /ask in a thread ------------------------------------------------------------------------


class AskResponse(AgentAnswer):
    """``POST /ask``'s answer (JSON body, the stream's ``done``): the agent's answer and
    where it was stored."""

    conversation_id: uuid.UUID | None = Field(
        default=None,
        description="The conversation this turn belongs to: pass it as `conversation_id` to "
        "ask a follow-up. null when the turn was not stored in a new conversation.",
    )
    turn: int | None = Field(
        default=None,
        description="This turn's number in the conversation (from 1); null when it was not "
        "stored (a provider_error run, or the conversation store was unavailable).",
    )


def turn_record(question: str, answer: AgentAnswer) -> TurnRecord:
    """What a turn keeps of a finished run."""
    return TurnRecord(
        question=question,
        answer=answer.answer,
        decision=answer.decision,
        idk=answer.idk,
        model=answer.model,
        trace_id=answer.trace_id,
        citations=tuple(answer.citations),  # the answer's own types: nothing repacked
        tool_calls=tuple(answer.tool_calls),
        usage=answer.usage,
        cost=answer.cost,
        answered_by=answer.answered_by,
    )


@dataclass
class Thread:
    """One ``/ask``'s place in a conversation (``conversation_id`` None: a new one)."""

    store: ConversationStore
    owner: str
    question: str
    conversation_id: uuid.UUID | None
    max_turns: int
    # The conversation's turns as the caller may be shown them now, oldest first: the agent
    # derives the model's history and what its strategy reads from them (agent.turns).
    earlier: tuple[PriorTurn, ...] = ()

    def _response(
        self,
        answer: AgentAnswer,
        conversation_id: uuid.UUID | None,
        turn: int | None,
        notes: list[str] | None = None,
    ) -> AskResponse:
        return AskResponse(
            **{**dict(answer), "notes": notes if notes is not None else list(answer.notes)},
            conversation_id=conversation_id,
            turn=turn,
        )

    async def _write(self, record: TurnRecord) -> tuple[Conversation, Turn]:
        if self.conversation_id is None:
            return await self.store.start(self.owner, record)
        return await self.store.append(
            self.owner, self.conversation_id, record, max_turns=self.max_turns
        )

    async def record(self, answer: AgentAnswer) -> AskResponse:
        """Store the finished run as the next turn (see the module docstring) and return
        the answer with its ``conversation_id`` and ``turn``."""
        if answer.decision == "provider_error":
            return self._response(answer, self.conversation_id, None)
        written: tuple[Conversation, Turn] | None
        try:
            written = await _shielded(self._write(turn_record(self.question, answer)))
        except NoSuchConversation:
            assert self.conversation_id is not None
            raise ConversationDeleted(
                f"conversation {self.conversation_id} was deleted while this question was "
                "being answered; the answer was not stored"
            ) from None
        except ConversationFull as exc:  # concurrent questions filled it during the run
            raise ConversationFullError(full_message(exc.conversation_id, exc.max_turns)) from None
        except (ConversationsUnavailable, TimeoutError):
            written = None
        if written is None:
            log.warning("a finished turn was not stored: the conversation store is unavailable")
            return self._response(
                answer, self.conversation_id, None, [*answer.notes, NOT_STORED_NOTE]
            )
        conversation, turn = written
        return self._response(answer, conversation.id, turn.number)

    async def recording(self, events: AsyncIterator[AgentEvent]) -> AsyncIterator[AgentEvent]:
        """``events`` with the final ``done`` stored first and carrying its place. Nothing
        is written unless ``done`` arrives; closing this closes ``events`` (which cancels
        the run)."""
        try:
            async for event in events:
                if isinstance(event, DoneEvent):
                    yield DoneEvent(response=await self.record(event.response))
                    return
                yield event
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()


_WRITES: set[asyncio.Task[tuple[Conversation, Turn]]] = set()  # kept until they finish


def _finished(task: asyncio.Task[tuple[Conversation, Turn]]) -> None:
    _WRITES.discard(task)
    exc = None if task.cancelled() else task.exception()
    # Read here (so asyncio never warns of an unread one), and logged when it is not one the
    # caller maps (a write whose caller went away is still on record).
    if exc is not None and not isinstance(exc, ConversationStoreError | ConversationsUnavailable):
        log.warning("a turn write failed: %r", exc)


async def _shielded(write: Awaitable[tuple[Conversation, Turn]]) -> tuple[Conversation, Turn]:
    """Run ``write`` in a task of its own that the caller's cancellation does not reach (a
    client disconnect cancels the request's task: asyncio's or anyio's cancellation alike),
    bounded by ``WRITE_TIMEOUT_S`` (on expiry it is cancelled, and rolls back)."""
    task = asyncio.ensure_future(asyncio.wait_for(write, WRITE_TIMEOUT_S))
    _WRITES.add(task)
    task.add_done_callback(_finished)
    return await asyncio.shield(task)


async def open_thread(
    store: ConversationStore,
    user: AuthUser,
    question: str,
    conversation_id: uuid.UUID | None,
    *,
    can_see: ChunkVisibility | None = None,
    max_turns: int,
    history_max_tokens: int = 0,
) -> Thread:
    """The ``/ask``'s thread, checked before any model call: ``ConversationNotFound`` (not
    the caller's), ``ConversationFullError`` (``max_turns`` reached), or
    ``ConversationsUnavailable`` (the database is down) for an existing conversation, whose
    turns, re-checked with ``can_see`` (the chunks the caller may see now; None: none, so
    every answer that cited one is withheld), become the thread's ``earlier`` (none at a
    ``history_max_tokens`` of 0: the agent would use none, so none is read)."""
    earlier: tuple[PriorTurn, ...] = ()
    if conversation_id is not None:
        found = await store.read(user.sub, conversation_id)
        if found is None:
            raise ConversationNotFound(not_found_message(conversation_id))
        conversation, turns = found
        if conversation.turn_count >= max_turns:
            raise ConversationFullError(full_message(conversation_id, max_turns))
        if history_max_tokens > 0:
            earlier = prior_turns(await rechecked(turns, can_see))
    return Thread(
        store=store,
        owner=user.sub,
        question=question,
        conversation_id=conversation_id,
        max_turns=max_turns,
        earlier=earlier,
    )
