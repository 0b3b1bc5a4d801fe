"""``POST /feedback``: a thumbs up or down on one of the caller's turns, with an optional
comment and expected answer.

The turn is named by ``conversation_id`` and ``turn`` (its number, from 1, as ``/ask`` and
``GET /conversations/{id}`` give it), or by ``trace_id`` (the ``/ask`` answer's), which is
looked up among the caller's own turns only. Any authenticated caller, for their own turns
only: another caller's conversation is answered exactly as an unknown one (``404``
``not_found``, the message of ``GET /conversations/{id}``: ``no conversation <id>``); so is
a trace id no turn of the caller's carries (``no turn with trace id <id>``, whoever's trace
it is). A turn number the caller's own conversation does not hold is a 404 saying so.

One feedback per turn (``conversations.feedback``): rating it again replaces the rating,
the comment and the expected answer (``replaced: true``). The feedback is stored with the
turn (deleted with its conversation), counted (``agent_feedback`` by rating, where the
process has a metrics sink: the Serve Ingress), and put on the turn's trace after the
response is sent (``serve_app.feedback.attach_to_trace``: a Langfuse score, or an
``agent.feedback`` span).

Errors: ``422`` ``validation_error`` (no turn named, both ways at once, a rating other than
``up``/``down``, a comment over 2000 or an expected answer over 4000 characters, a turn
below 1, a trace id that is not 32 hex digits, unknown keys), ``409``
``ambiguous_trace_id`` (several of the caller's turns carry the trace id: the caller sent
the same ``traceparent`` more than once; rate by ``conversation_id`` and ``turn``), ``503``
``conversations_unavailable``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, BackgroundTasks
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    field_validator,
    model_validator,
)

from conversations.feedback import (
    MAX_COMMENT_CHARS,
    MAX_EXPECTED_ANSWER_CHARS,
    AmbiguousTrace,
    Feedback,
    FeedbackReceipt,
    NoSuchTurn,
    Rater,
)
from conversations.store import NoSuchConversation
from serve_app.api.deps import CurrentUser, FeedbackStoreDep, MetricsDep, SettingsDep
from serve_app.api.errors import ApiError, ErrorEnvelope, error_responses
from serve_app.api.fields import integral
from serve_app.backend import ConversationNotFound
from serve_app.feedback import attach_to_trace
from serve_app.metrics import feedback_measurement
from serve_app.threads import not_found_message

router = APIRouter(tags=["feedback"])

MAX_TURN = 1_000_000
NAME_THE_TURN = "name the turn by conversation_id and turn, or by trace_id (not both)"


def trace_not_found_message(trace_id: str) -> str:
    """Built from the requested id alone: the same for anyone's trace and an unknown one."""
    return f"no turn with trace id {trace_id} in your conversations"


def no_turn_message(conversation_id: uuid.UUID, turn: int) -> str:
    return f"conversation {conversation_id} has no turn {turn}"


class FeedbackRequest(BaseModel):
    """The turn (``conversation_id`` + ``turn``, or ``trace_id``) and the rating."""

    model_config = ConfigDict(
        extra="forbid",
        # Exactly one way of naming the turn (what ``_one_turn`` checks), in the schema too.
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["conversation_id", "turn"],
                    "properties": {
                        "conversation_id": {"type": "string"},
                        "turn": {"type": "integer"},
                        "trace_id": {"type": "null"},
                    },
                },
                {
                    "required": ["trace_id"],
                    "properties": {
                        "trace_id": {"type": "string"},
                        "conversation_id": {"type": "null"},
                        "turn": {"type": "null"},
                    },
                },
            ]
        },
    )

    conversation_id: uuid.UUID | None = Field(
        default=None, description="The turn's conversation (with `turn`)."
    )
    # The bounds sit inside Annotated: on the optional union beside a BeforeValidator they
    # would be enforced but dropped from the OpenAPI schema.
    turn: Annotated[int, Strict(), Field(ge=1, le=MAX_TURN), BeforeValidator(integral)] | None = (
        Field(
            default=None,
            description="The turn's number, from 1 (with `conversation_id`).",
        )
    )
    trace_id: str | None = Field(
        default=None,
        pattern=r"^[0-9a-fA-F]{32}$",
        description="The `/ask` answer's `trace_id`, instead of `conversation_id` and `turn`: "
        "the one turn of the caller's that carries it.",
    )
    rating: Literal["up", "down"] = Field(description="Thumbs up or down.")
    comment: str | None = Field(
        default=None,
        max_length=MAX_COMMENT_CHARS,
        description="What was good or wrong (at most 2000 characters).",
    )
    expected_answer: str | None = Field(
        default=None,
        max_length=MAX_EXPECTED_ANSWER_CHARS,
        description="What the answer should have said (at most 4000 characters); becomes "
        "the `rubric` of the golden-row candidate `agent-service eval export-feedback` "
        "writes.",
    )

    @field_validator("comment", "expected_answer")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("trace_id")
    @classmethod
    def _lower(cls, value: str | None) -> str | None:
        return value.lower() if value is not None else None

    @model_validator(mode="after")
    def _one_turn(self) -> FeedbackRequest:
        by_turn = self.conversation_id is not None or self.turn is not None
        if self.trace_id is not None and by_turn:
            raise ValueError(NAME_THE_TURN)
        if self.trace_id is None and (self.conversation_id is None or self.turn is None):
            raise ValueError(NAME_THE_TURN)
        return self


class FeedbackOut(BaseModel):
    conversation_id: uuid.UUID
    turn: int
    trace_id: str | None = Field(description="The rated turn's trace id.")
    rating: Literal["up", "down"]
    replaced: bool = Field(description="The turn had feedback already; this replaced it.")
    created_at: datetime = Field(description="When the turn was first rated.")
    updated_at: datetime = Field(description="When this rating was stored.")


_ERRORS: dict[int | str, dict[str, Any]] = {
    **error_responses(401, 422, 500, 503),
    404: {
        "model": ErrorEnvelope,
        "description": "No such turn of the caller's: the conversation is unknown or another "
        "caller's (the body of GET /conversations/{id}'s 404 either way), the trace id is on "
        "no turn of the caller's, or the caller's conversation has no such turn",
    },
    409: {
        "model": ErrorEnvelope,
        "description": "`ambiguous_trace_id`: several of the caller's turns carry this trace "
        "id; rate by `conversation_id` and `turn`",
    },
}


@router.post(
    "/feedback",
    response_model=FeedbackOut,
    responses=_ERRORS,
    summary="Rate one of the caller's turns (thumbs up/down, comment, expected answer)",
)
async def post_feedback(
    body: FeedbackRequest,
    user: CurrentUser,
    settings: SettingsDep,
    store: FeedbackStoreDep,
    metrics: MetricsDep,
    background: BackgroundTasks,
) -> FeedbackOut:
    """Stores the rating with the turn (a second rating of the same turn replaces the
    first), counts it, and puts it on the turn's trace once answered (a Langfuse score
    where the OTLP exporter points at Langfuse, else an `agent.feedback` span)."""
    feedback = Feedback(
        rating=body.rating,
        rater=Rater(sub=user.sub, roles=tuple(user.roles), domains=tuple(user.domains)),
        comment=body.comment,
        expected_answer=body.expected_answer,
    )
    receipt: FeedbackReceipt | None
    if body.trace_id is not None:
        try:
            receipt = await store.rate_trace(user.sub, body.trace_id, feedback)
        except AmbiguousTrace as exc:
            raise ApiError(
                409,
                f"{len(exc.turns)} of your turns carry trace id {exc.trace_id}; rate one by "
                "conversation_id and turn",
                code="ambiguous_trace_id",
            ) from None
        if receipt is None:
            raise ConversationNotFound(trace_not_found_message(body.trace_id))
    else:
        assert body.conversation_id is not None and body.turn is not None
        try:
            receipt = await store.rate_turn(user.sub, body.conversation_id, body.turn, feedback)
        except NoSuchConversation:
            raise ConversationNotFound(not_found_message(body.conversation_id)) from None
        except NoSuchTurn:
            raise ConversationNotFound(no_turn_message(body.conversation_id, body.turn)) from None
    if metrics is not None:
        metrics.record([feedback_measurement(receipt.rating)])
    background.add_task(attach_to_trace, settings, receipt, feedback)
    return FeedbackOut(
        conversation_id=receipt.conversation_id,
        turn=receipt.turn,
        trace_id=receipt.trace_id,
        rating=receipt.rating,
        replaced=receipt.replaced,
        created_at=receipt.created_at,
        updated_at=receipt.updated_at,
    )
