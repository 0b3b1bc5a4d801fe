"""``GET /conversations``, ``GET /conversations/{conversation_id}``,
``DELETE /conversations/{conversation_id}``, ``DELETE /conversations`` (all of them): the
caller's own conversations.

Any authenticated caller, for their own conversations only (the owner is the caller's
``sub``). Another caller's conversation is answered exactly as an unknown id: ``404``
``not_found`` with the same body (``serve_app.threads.not_found_message``), from the same
single statement. An id that is not a UUID is a ``422``. ``503``
``conversations_unavailable`` when the database cannot be reached.

A thread is shown as the caller may see it now (``conversations.recheck``): a stored
citation whose chunk the caller can no longer see (its page's ACL narrowed since, or the
page deleted or re-ingested with other text) is left out, and the answer that cited it is
withheld (``answer_withheld``), since it may quote the page.

The list runs most recently active first (a new turn moves a conversation to the top),
``limit`` (1-100, default 20) at a time; ``next_cursor`` (opaque) asks for the next page, and
is ``null`` on the last one.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from agent.answer import AnsweredBy, CitationOut, CostOut, Decision, ToolCallTrace, UsageOut
from conversations.store import Conversation, PageCursor, Turn
from serve_app.api.deps import BackendDep, CurrentUser
from serve_app.api.errors import ErrorEnvelope, error_responses
from serve_app.backend import ConversationNotFound
from serve_app.threads import not_found_message, rechecked

router = APIRouter(tags=["conversations"])

DEFAULT_PAGE = 20
MAX_PAGE = 100
MAX_CURSOR_CHARS = 200
BAD_CURSOR = "not a cursor this service issued (pass next_cursor back as it came)"


class ConversationSummary(BaseModel):
    id: uuid.UUID
    title: str = Field(description="The start of the conversation's first question.")
    turn_count: int
    created_at: datetime
    updated_at: datetime = Field(description="When its latest turn was stored.")


class ConversationList(BaseModel):
    conversations: list[ConversationSummary]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class TurnOut(BaseModel):
    turn: int = Field(description="The turn's number in the conversation, from 1.")
    question: str
    answer: str = Field(
        description="The answer as it was given; a fixed note instead when `answer_withheld`."
    )
    answer_withheld: bool = Field(
        default=False,
        description="The answer cited documentation the caller can no longer see (its "
        "access narrowed since, or the page deleted or changed): the answer is not shown, "
        "and those citations are left out. Ask again for an answer from what you can see.",
    )
    citations: list[CitationOut] = Field(
        description="The cited chunks the caller may still see (re-checked at every read)."
    )
    tool_calls: list[ToolCallTrace]
    decision: Decision
    answered_by: AnsweredBy | None = Field(
        default=None,
        description="Who wrote `answer`, as `POST /ask`'s `answered_by` says: `model` or "
        "`service` (`service` for a withheld answer: the note is the service's). null for a "
        "turn stored before the service recorded it.",
    )
    idk: bool
    usage: UsageOut
    cost: CostOut
    model: str
    trace_id: str | None
    created_at: datetime


class DeletedConversations(BaseModel):
    deleted: int = Field(description="How many of the caller's conversations were deleted.")


class ConversationOut(ConversationSummary):
    turns: list[TurnOut] = Field(description="Oldest first.")


def summary(conversation: Conversation) -> ConversationSummary:
    return ConversationSummary(
        id=conversation.id,
        title=conversation.title,
        turn_count=conversation.turn_count,
        created_at=conversation.created_at,
        updated_at=conversation.updated_at,
    )


def turn_out(turn: Turn) -> TurnOut:
    record = turn.record
    return TurnOut(
        turn=turn.number,
        question=record.question,
        answer=record.answer,
        answer_withheld=turn.answer_withheld,
        citations=list(record.citations),  # stored as the answer's own types
        tool_calls=list(record.tool_calls),
        decision=record.decision,  # type: ignore[arg-type]  # stored from a Decision
        answered_by=record.answered_by,  # type: ignore[arg-type]  # stored from AnsweredBy
        idk=record.idk,
        usage=record.usage,
        cost=record.cost,
        model=record.model,
        trace_id=record.trace_id,
        created_at=turn.created_at,
    )


# --- cursors ------------------------------------------------------------------------------------


def encode_cursor(cursor: PageCursor) -> str:
    raw = f"{cursor.updated_at.isoformat()}|{cursor.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> PageCursor:
    """The cursor ``encode_cursor`` made; ``ValueError`` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        when, _, ident = raw.partition("|")
        updated_at = datetime.fromisoformat(when)
        if updated_at.tzinfo is None:
            raise ValueError("naive time")
        return PageCursor(updated_at=updated_at, id=uuid.UUID(ident))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError(BAD_CURSOR) from None


def _bad_cursor() -> RequestValidationError:
    return RequestValidationError(
        [{"type": "value_error", "loc": ("query", "cursor"), "msg": BAD_CURSOR}]
    )


# --- routes -------------------------------------------------------------------------------------

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {
        "model": ErrorEnvelope,
        "description": "No such conversation of the caller's (unknown, or another caller's: "
        "the same body either way)",
    }
}


@router.get(
    "/conversations",
    response_model=ConversationList,
    responses=error_responses(401, 422, 500, 503),
    summary="The caller's conversations, most recently active first",
)
async def list_conversations(
    user: CurrentUser,
    backend: BackendDep,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description="Conversations per page (1-100).")
    ] = DEFAULT_PAGE,
    cursor: Annotated[
        str | None,
        Query(
            max_length=MAX_CURSOR_CHARS,
            description="The previous page's `next_cursor`; omitted: the first page.",
        ),
    ] = None,
) -> ConversationList:
    after: PageCursor | None = None
    if cursor is not None:
        try:
            after = decode_cursor(cursor)
        except ValueError:
            raise _bad_cursor() from None
    page = await backend.conversations.recent(user.sub, limit=limit, after=after)
    return ConversationList(
        conversations=[summary(c) for c in page.conversations],
        next_cursor=None if page.next_cursor is None else encode_cursor(page.next_cursor),
    )


@router.delete(
    "/conversations",
    response_model=DeletedConversations,
    responses=error_responses(401, 500, 503),
    summary="Delete all of the caller's conversations and their turns",
)
async def delete_all_conversations(user: CurrentUser, backend: BackendDep) -> DeletedConversations:
    """Every conversation of the caller's (their `sub`), with its turns: `{"deleted": n}`
    (0 when there were none). Another caller's conversations are never touched. A question
    being answered at that moment in a conversation deleted here is not stored (`409
    conversation_deleted`); one that starts a new conversation afterwards is."""
    return DeletedConversations(deleted=await backend.conversations.delete_all(user.sub))


@router.get(
    "/conversations/{conversation_id}",
    response_model=ConversationOut,
    responses={**error_responses(401, 422, 500, 503), **_NOT_FOUND},
    summary="One of the caller's conversations, with its turns (citations re-checked)",
)
async def get_conversation(
    conversation_id: uuid.UUID, user: CurrentUser, backend: BackendDep
) -> ConversationOut:
    found = await backend.conversations.read(user.sub, conversation_id)
    if found is None:
        raise ConversationNotFound(not_found_message(conversation_id))
    conversation, stored = found
    turns = await rechecked(stored, partial(backend.visible_chunks, user))
    return ConversationOut(**summary(conversation).model_dump(), turns=[turn_out(t) for t in turns])


@router.delete(
    "/conversations/{conversation_id}",
    status_code=204,
    response_class=Response,
    responses={**error_responses(401, 422, 500, 503), **_NOT_FOUND},
    summary="Delete one of the caller's conversations and its turns",
)
async def delete_conversation(
    conversation_id: uuid.UUID, user: CurrentUser, backend: BackendDep
) -> Response:
    if not await backend.conversations.delete(user.sub, conversation_id):
        raise ConversationNotFound(not_found_message(conversation_id))
    return Response(status_code=204)
