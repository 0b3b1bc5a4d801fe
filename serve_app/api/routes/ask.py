"""``POST /ask``: one question, answered as JSON or streamed as Server-Sent Events.

JSON: ``200`` with the ``AgentAnswer`` for every finished run (``answered``, ``idk``,
``declined_out_of_scope``, ``tool_loop_exhausted``). A run that ended in ``provider_error``
is not a success: the status is ``502`` (the provider rejected the request, or its reply was
unusable: ``provider_rejected``, ``malformed_reply``), ``503`` (``provider_unavailable``:
connection failure, 429 or 5xx after retries) or ``504`` (``provider_unavailable`` that was a
timeout), and the body is still the full ``AgentAnswer``: its ``error`` member
(``{"code", "message", "status_code"}``) *is* the error envelope, and ``usage``, ``cost`` and
``tool_calls`` still tell what the run spent.

Conversations (``serve_app.threads``): ``conversation_id`` continues one of the caller's
conversations (``404`` if it is not one, ``409`` ``conversation_full`` at
``CONVERSATION_MAX_TURNS``, both before any model call); without it the question starts a
new one. The finished run is stored as one turn before its answer is sent, and the answer
(JSON, or ``done``) carries ``conversation_id`` and ``turn``. The conversation's turns go to
the agent, which shows the model the newest that fit in ``HISTORY_MAX_TOKENS`` (``agent.turns``).

SSE (``stream=true``): once auth, validation and the model override pass, the response is
``200 text/event-stream`` and the run's outcome travels in the stream: ``progress``
(``{"stage", ...}``: ``started`` at once with the answering ``model``, then ``model`` per model
call, ``waiting`` heartbeats while it has sent nothing, ``tool_started`` per tool; see
``agent.answer.ProgressEvent``), ``tool`` (a ``ToolCallTrace``, as each tool finishes),
``token`` (``{"text"}``), ``citation`` (a ``CitationOut``), then exactly one of ``done`` (the
same ``AgentAnswer`` the JSON call returns) or ``error`` (the envelope; for a ``provider_error``
run, the full ``AgentAnswer`` whose ``error`` is the envelope). A client disconnect closes the
backend's event iterator, which cancels the model call and running tools; so does the deadline
(``ASK_TIMEOUT_SECONDS``, the JSON call's too): a stream still running then ends with an
``error`` event whose code is ``timeout``. A client that does
not know an event name skips it (new progress stages may appear).

Usage limits (``serve_app.limits``, off unless a ``RATE_LIMIT_*``/``BUDGET_*`` setting is
set): checked last, right before the run (a request refused for another reason counts
against none); over one: ``429`` ``rate_limited`` or ``budget_exceeded`` with
``Retry-After`` and the envelope's ``exceeded``. Admitted answers (JSON, and the stream's
headers) carry the remaining allowance (``X-RateLimit-*``, ``X-Budget-*``). A stream whose
estimated usage crosses the budget left at admission is cancelled and ends with an
``error`` event ``budget_exceeded``; its estimated usage is charged.

The ``done`` answer is authoritative: clients replace the text built from ``token`` events with
``done.answer`` (and the ``citation`` events with ``done.citations``). Tokens are sent as the
model writes them, before the service checks the answer; an answer whose figures no tool result
holds (``agent.grounding``) ends with a ``done`` carrying the repaired answer or the IDK answer,
and ``retrieval.ungrounded`` lists what was removed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, cast

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

from agent.answer import (
    AgentAnswer,
    AgentEvent,
    CitationEvent,
    DoneEvent,
    ProgressEvent,
    TokenEvent,
    ToolEvent,
)
from agent.request import AgentRequest
from agent.turns import history_messages
from foundation.tracing import carrier_from_headers
from serve_app.api.deps import AuthorizerDep, BackendDep, CurrentUser, LimitsDep, SettingsDep
from serve_app.api.errors import INTERNAL_ERROR_MESSAGE, envelope, error_responses
from serve_app.api.fields import integral
from serve_app.api.middleware import current_request_id
from serve_app.backend import BackendError, BackendTimeout
from serve_app.model_override import check_model_override
from serve_app.threads import AskResponse, open_thread

SESSION_HEADER = "x-session-id"  # optional: groups a conversation's traces (session.id)

log = logging.getLogger(__name__)

router = APIRouter(tags=["ask"])

MAX_QUESTION_CHARS = 4000
SSE_PING_SECONDS = 15
CLEANUP_TIMEOUT_SECONDS = 5.0


# "Holds a character that is not whitespace": the schema's way of saying what stripping the
# value and then asking for one character does (``minLength`` alone let "   " look valid).
# The class is Unicode's White_Space set, exactly what the validator strips.
NOT_BLANK = (
    "[^\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
)


class AskRequest(BaseModel):
    """``POST /ask`` body. Unknown fields are refused (a typo is a 422, not ignored)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"question": "How long is the occupancy alert cooldown?", "top_k": 5},
                {"question": "Which rooms in Harbor House are busy now?", "stream": True},
            ]
        },
    )

    question: Annotated[
        str,
        StringConstraints(
            strip_whitespace=True,
            min_length=1,
            max_length=MAX_QUESTION_CHARS,
            pattern=NOT_BLANK,
        ),
    ] = Field(description="The question, 1 to 4000 characters.")
    stream: bool = Field(
        default=False,
        description="true: answer as Server-Sent Events (progress/tool/token/.../done)",
    )
    top_k: Annotated[int, Field(ge=1, le=50), BeforeValidator(integral)] | None = Field(
        default=None, description="Documentation chunks per search (default TOP_K_FINAL)."
    )
    model: (
        Annotated[
            str,
            StringConstraints(
                strip_whitespace=True, min_length=1, max_length=200, pattern=NOT_BLANK
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="Answer-model override: MODEL_OVERRIDE_MIN_ROLE or above (else 403), "
        "and in ALLOWED_MODELS when that is set (else 400).",
    )
    conversation_id: Annotated[uuid.UUID, Field(strict=False)] | None = Field(
        default=None,
        description="Continue this conversation of the caller's (else 404; full: 409). "
        "Omitted: the question starts a new one. See serve_app.threads.",
    )


# --- status mapping --------------------------------------------------------------------------


def provider_error_status(answer: AgentAnswer) -> int:
    """The HTTP status of a ``provider_error`` run (see the module docstring)."""
    error = answer.error
    if error is None or error.code in ("provider_rejected", "malformed_reply"):
        return 502
    if error.status_code in (408, 504) or "timed out" in error.message.lower():
        return 504
    return 503


# --- SSE ------------------------------------------------------------------------------------------


def _sse(event: str, data: Any) -> ServerSentEvent:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return ServerSentEvent(data=text, event=event)


def _event_payload(event: AgentEvent) -> tuple[str, Any]:
    if isinstance(event, ProgressEvent):
        # Each stage carries only its own fields; ``type`` is the SSE event name already.
        return "progress", event.model_dump(mode="json", exclude={"type"}, exclude_none=True)
    if isinstance(event, ToolEvent):
        return "tool", event.call.model_dump(mode="json")
    if isinstance(event, TokenEvent):
        return "token", {"text": event.text}
    if isinstance(event, CitationEvent):
        return "citation", event.citation.model_dump(mode="json")
    answer = event.response
    if answer.decision == "provider_error":
        return "error", answer.model_dump(mode="json")
    return "done", answer.model_dump(mode="json")


async def _close(events: AsyncIterator[AgentEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is None:
        return
    # Shielded: on a client disconnect this runs inside a cancelled scope, and the backend's
    # cleanup (cancelling the model call, the tools, a Serve streaming call) must still run.
    with anyio.move_on_after(CLEANUP_TIMEOUT_SECONDS, shield=True):
        try:
            await aclose()
        except Exception:
            log.warning("closing the answer stream failed", exc_info=True)


@dataclass(frozen=True)
class _Failed:
    error: Exception


_END = object()  # the backend's stream finished


async def _pump(events: AsyncIterator[AgentEvent], queue: asyncio.Queue[object]) -> None:
    """Iterates ``events`` into ``queue`` (then ``_END``, or what it raised) in one task of
    its own: cancelling this task is how the deadline stops the model call and the tools,
    and the trace spans the run opens close in the context that opened them."""
    outcome: object = _END
    try:
        async for event in events:
            await queue.put(event)
    except Exception as exc:  # re-raised by the reader, where the route handles it
        outcome = _Failed(exc)
    finally:
        await _close(events)
    await queue.put(outcome)


async def within_deadline(
    events: AsyncIterator[AgentEvent], seconds: float
) -> AsyncIterator[AgentEvent]:
    """``events``, ended by ``BackendTimeout`` once ``seconds`` have passed since the call
    (the backend's iteration is cancelled then, as on a client disconnect). The timeout
    scope never spans a ``yield``: a scope left open across one would cancel the consumer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    pump = asyncio.create_task(_pump(events, queue))
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    item = await queue.get()
            except TimeoutError:
                raise BackendTimeout(f"no answer within {seconds:.0f} s; try again") from None
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield cast(AgentEvent, item)  # the queue holds events, then one marker
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)


async def sse_events(
    events: AsyncIterator[AgentEvent], request_id: str | None = None
) -> AsyncIterator[ServerSentEvent]:
    """Agent events -> SSE events; exactly one ``done`` or ``error`` ends the stream."""
    try:
        async for event in events:
            name, payload = _event_payload(event)
            yield _sse(name, payload)
            if isinstance(event, DoneEvent):
                return
        log.error("the answer stream ended without a done event (request_id=%s)", request_id)
        yield _sse("error", envelope("internal_error", "the answer stream ended early"))
    except (asyncio.CancelledError, GeneratorExit):
        # The client went away (a closed tab, a stop button): the finally below closes the
        # backend's iterator, which cancels the model call and the running tools.
        log.info("answer stream cancelled by the client (request_id=%s)", request_id)
        raise
    except BackendError as exc:
        log.warning("backend error mid-stream (request_id=%s): %s", request_id, exc.message)
        yield _sse("error", envelope(exc.code, exc.message, **exc.details))
    except Exception:
        log.exception("unhandled error mid-stream (request_id=%s)", request_id)
        message = INTERNAL_ERROR_MESSAGE
        if request_id:
            message += f"; quote request id {request_id} when reporting it"
        yield _sse("error", envelope("internal_error", message))
    finally:
        await _close(events)


# --- the route ----------------------------------------------------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _sse_event(name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One event of the stream: its name, and its ``data`` as JSON text of ``payload``."""
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"const": name},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": payload,
            },
        },
    }


def _progress_payload() -> dict[str, Any]:
    """``ProgressEvent``'s schema without its ``type`` (the event name carries it)."""
    schema = ProgressEvent.model_json_schema()
    schema["properties"].pop("type")
    return schema


# The event stream, as OpenAPI 3.2 describes sequential media types (``itemSchema``: each
# event, parsed into ``{"event", "data", ...}``; ``schema``: the whole stream as an array).
_SSE_EVENT: dict[str, Any] = {
    "oneOf": [
        _sse_event("progress", _progress_payload()),
        _sse_event("tool", _ref("ToolCallTrace")),
        _sse_event(
            "token",
            {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        ),
        _sse_event("citation", _ref("CitationOut")),
        _sse_event("done", _ref("AskResponse")),
        _sse_event("error", {"anyOf": [_ref("AskResponse"), _ref("ErrorEnvelope")]}),
    ]
}
_SSE_STREAM: dict[str, Any] = {
    "type": "array",
    "items": _SSE_EVENT,
    # exactly one final event: done, or error
    "contains": {"properties": {"event": {"enum": ["done", "error"]}}, "required": ["event"]},
    "minContains": 1,
    "maxContains": 1,
}
_ANSWER_OR_ENVELOPE = {"anyOf": [_ref("AgentAnswer"), _ref("ErrorEnvelope")]}
_ASK_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The answer (JSON), or with `stream=true` a `text/event-stream` of "
        "`progress` (`started` first, at once), `tool`, `token`, `citation` events and one "
        "final `done` (the same AgentAnswer) or `error` event. `done` is authoritative: clients "
        "replace the streamed text with its `answer` (an answer that failed the grounding check "
        "is corrected there).",
        "content": {
            "text/event-stream": {
                "itemSchema": _SSE_EVENT,
                "schema": _SSE_STREAM,
                "example": 'event: token\r\ndata: {"text":"The cooldown is "}\r\n\r\n',
            }
        },
    },
    502: {
        "model": AgentAnswer,
        "description": "provider_error: the model provider rejected the request or sent an "
        "unusable reply. The AgentAnswer's `error` is the envelope.",
    },
    # 503/504 also come from the backend itself (``BackendError``: e.g. Serve's deadline or an
    # unavailable deployment), with the plain error envelope instead of an AgentAnswer.
    503: {
        "description": "provider_error: the model provider is unavailable (after retries); "
        "or the service itself is (the error envelope).",
        "content": {"application/json": {"schema": _ANSWER_OR_ENVELOPE}},
    },
    504: {
        "description": "provider_error: the model provider timed out; or the service did "
        "(the error envelope).",
        "content": {"application/json": {"schema": _ANSWER_OR_ENVELOPE}},
    },
}
_ASK_RESPONSES.update(error_responses(400, 401, 403, 404, 409, 413, 422, 429, 500))


@router.post(
    "/ask",
    response_model=AskResponse,
    responses=_ASK_RESPONSES,
    summary="Ask a question (JSON or Server-Sent Events)",
)
async def ask(
    request: Request,
    body: AskRequest,
    user: CurrentUser,
    backend: BackendDep,
    settings: SettingsDep,
    authorizer: AuthorizerDep,
    limits: LimitsDep,
) -> Response:
    model = check_model_override(user, body.model, settings, authorizer)
    thread = await open_thread(
        backend.conversations,
        user,
        body.question,
        body.conversation_id,
        can_see=partial(backend.visible_chunks, user),
        max_turns=settings.conversation_max_turns,
        history_max_tokens=settings.resolved_history_max_tokens,
    )
    params = AgentRequest(
        question=body.question,
        user=user,
        model=None if model == settings.answer_model else model,
        top_k=body.top_k,
        trace_context=carrier_from_headers(
            request.headers,
            user_id=user.sub,
            session_id=request.headers.get(SESSION_HEADER),
        ),
        earlier=thread.earlier,
    )
    # The caller's rate limits and budgets, last: a request refused for any other reason
    # counts against none of them (LimitExceeded: 429; serve_app.limits).
    admission = await limits.admit(user, authorizer)
    if body.stream:
        events = admission.metered(
            within_deadline(backend.ask_stream(params), settings.ask_timeout_seconds),
            question=body.question,
            history=history_messages(
                thread.earlier, max_tokens=settings.resolved_history_max_tokens
            ),
            model=model,
        )
        return EventSourceResponse(
            sse_events(thread.recording(events), current_request_id()),
            ping=SSE_PING_SECONDS,
            headers=admission.headers(),
        )
    result = await backend.ask(params)
    await admission.record(result)
    answer = await thread.record(result)
    status = provider_error_status(answer) if answer.decision == "provider_error" else 200
    return JSONResponse(
        answer.model_dump(mode="json"), status_code=status, headers=admission.headers()
    )
