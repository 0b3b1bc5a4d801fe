"""``POST /feedback``'s service side: where the feedback is stored, and how it reaches the
turn's trace.

Storage (``conversations.feedback``): with the conversations. Over the PostgreSQL store, a
``LazyFeedbackStore``: a small pool of its own (at most 2 connections), opened on first use,
database failures turned into ``ConversationsUnavailable`` (503), like the conversation
store's. Over the in-memory conversation store (tests, the schema fuzzing): in memory too.

The trace (``attach_to_trace``, after the response is sent; a failure is logged, never
raised):

* **Langfuse's public API**, when the OTLP exporter already points at Langfuse:
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` ends in ``/api/public/otel`` (``/v1/traces`` may follow)
  and ``OTEL_EXPORTER_OTLP_HEADERS`` carries ``Authorization=Basic ...`` (Langfuse's public
  and secret key). No setting of its own: the same host and keys, ``POST
  /api/public/scores`` with a ``BOOLEAN`` score ``user-feedback`` (1 up, 0 down) on the
  turn's ``traceId``; its ``id`` is the turn's (``feedback-<conversation>-<turn>``), so a
  second rating replaces the score, as it replaces the stored feedback. The comment goes
  with it only with ``OBSERVE_PAYLOADS=true`` (it is the user's text). 5 s timeout.
* **Otherwise** (another collector, or span log lines): a span ``agent.feedback`` in the
  turn's trace (its trace id: a root span there, as ``agent.answer`` is), with the rating
  and where the turn is; the comment as a payload attribute only with payloads on.
* ``OTEL_SDK_DISABLED=true``: neither.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlparse

import httpx
from opentelemetry import baggage

from conversations.feedback import (
    Feedback,
    FeedbackReceipt,
    FeedbackStore,
    InMemoryFeedbackStore,
    PgFeedbackStore,
)
from conversations.memory import InMemoryConversationStore
from conversations.store import ConversationStore
from foundation.database import resolve_database_url
from foundation.observability import attributes as attr
from foundation.observability.setup import parse_otlp_headers
from foundation.observability.spans import Observer
from foundation.settings import Settings
from foundation.tracing import ROOT_TRACE_KEY, use_context
from serve_app.backend import ConversationsUnavailable
from serve_app.lazy import OpenedOnFirstUse
from serve_app.threads import DATABASE_FAILURES, UNAVAILABLE_MESSAGE

log = logging.getLogger(__name__)

T = TypeVar("T")

SCORE_NAME = "user-feedback"
SCORE_TIMEOUT_S = 5.0
SPAN_NAME = "agent.feedback"
LANGFUSE_OTLP_PATH = "/api/public/otel"
_HEX32 = re.compile(r"^[0-9a-f]{32}$")

# Attributes of the agent.feedback span
FEEDBACK_RATING = "agent.feedback.rating"
FEEDBACK_VALUE = "agent.feedback.value"
FEEDBACK_TRACE_ID = "agent.feedback.trace_id"
FEEDBACK_CONVERSATION = "agent.feedback.conversation_id"
FEEDBACK_TURN = "agent.feedback.turn"
FEEDBACK_REPLACED = "agent.feedback.replaced"
FEEDBACK_HAS_EXPECTED = "agent.feedback.has_expected_answer"
FEEDBACK_COMMENT = "agent.feedback.comment"  # payload


class LazyFeedbackStore:
    """The ``FeedbackStore`` port over a ``PgFeedbackStore`` opened on first use (and again
    after a failed attempt); database failures raise ``ConversationsUnavailable``."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._store = OpenedOnFirstUse(self._connect)

    async def _connect(self) -> PgFeedbackStore:
        return await PgFeedbackStore.connect(await resolve_database_url(self._settings))

    async def _call(self, use: Callable[[PgFeedbackStore], Awaitable[T]]) -> T:
        try:
            return await use(await self._store.get())
        except DATABASE_FAILURES as exc:
            log.warning("feedback store: %s: %s", type(exc).__name__, exc)
            raise ConversationsUnavailable(UNAVAILABLE_MESSAGE, retry_after=5) from None

    async def rate_turn(
        self, owner: str, conversation_id: uuid.UUID, turn: int, feedback: Feedback
    ) -> FeedbackReceipt:
        return await self._call(lambda s: s.rate_turn(owner, conversation_id, turn, feedback))

    async def rate_trace(
        self, owner: str, trace_id: str, feedback: Feedback
    ) -> FeedbackReceipt | None:
        return await self._call(lambda s: s.rate_trace(owner, trace_id, feedback))

    async def close(self) -> None:
        await self._store.close()


def feedback_store_for(conversations: ConversationStore, settings: Settings) -> FeedbackStore:
    """Where feedback on these conversations' turns is kept: beside them."""
    if isinstance(conversations, InMemoryConversationStore):
        return InMemoryFeedbackStore(conversations)
    return LazyFeedbackStore(settings)


# --- the trace ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LangfuseScores:
    """Langfuse's score endpoint and credentials, as the OTLP exporter's settings give them."""

    url: str
    authorization: str


def langfuse_scores(settings: Settings) -> LangfuseScores | None:
    """The scores endpoint when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is Langfuse's OTLP endpoint
    and ``OTEL_EXPORTER_OTLP_HEADERS`` holds its Basic credentials; else None."""
    endpoint = settings.observability.otlp_endpoint
    if not endpoint or settings.observability.sdk_disabled:
        return None
    parsed = urlparse(endpoint)
    path = parsed.path.rstrip("/").removesuffix("/v1/traces")
    if not path.endswith(LANGFUSE_OTLP_PATH):
        return None
    raw = settings.observability.otlp_headers
    authorization = parse_otlp_headers(raw.get_secret_value() if raw else None).get(
        "authorization", ""
    )
    if not authorization.lower().startswith("basic "):
        return None
    base = path.removesuffix("/otel")  # .../api/public
    return LangfuseScores(f"{parsed.scheme}://{parsed.netloc}{base}/scores", authorization)


def score_id(receipt: FeedbackReceipt) -> str:
    return f"feedback-{receipt.conversation_id}-{receipt.turn}"


async def post_score(
    target: LangfuseScores,
    receipt: FeedbackReceipt,
    feedback: Feedback,
    *,
    payloads: bool,
    client: httpx.AsyncClient | None = None,
) -> bool:
    """One ``POST /api/public/scores``; False (logged) when it fails or is refused."""
    body: dict[str, object] = {
        "id": score_id(receipt),
        "traceId": receipt.trace_id,
        "name": SCORE_NAME,
        "value": 1 if feedback.rating == "up" else 0,
        "dataType": "BOOLEAN",
    }
    if payloads and feedback.comment:
        body["comment"] = feedback.comment
    own = client is None
    http = client or httpx.AsyncClient(timeout=SCORE_TIMEOUT_S)
    try:
        response = await http.post(
            target.url, json=body, headers={"authorization": target.authorization}
        )
    except httpx.HTTPError as exc:
        log.warning("feedback score for trace %s not sent: %s", receipt.trace_id, exc)
        return False
    finally:
        if own:
            await http.aclose()
    if response.status_code >= 300:
        log.warning(
            "feedback score for trace %s refused: HTTP %s", receipt.trace_id, response.status_code
        )
        return False
    return True


def record_span(receipt: FeedbackReceipt, feedback: Feedback, *, payloads: bool) -> None:
    """The ``agent.feedback`` span, in the turn's trace when it has one."""
    carrier = {}
    if receipt.trace_id is not None and _HEX32.fullmatch(receipt.trace_id):
        carrier[ROOT_TRACE_KEY] = receipt.trace_id
    with use_context(carrier):
        ctx = baggage.set_baggage(attr.USER_ID, feedback.rater.sub)
        observer = Observer(payloads=payloads)
        span = observer.start(
            SPAN_NAME,
            "event",
            parent=ctx,
            attributes={
                FEEDBACK_RATING: feedback.rating,
                FEEDBACK_VALUE: 1 if feedback.rating == "up" else 0,
                FEEDBACK_TRACE_ID: receipt.trace_id or "",
                FEEDBACK_CONVERSATION: str(receipt.conversation_id),
                FEEDBACK_TURN: receipt.turn,
                FEEDBACK_REPLACED: receipt.replaced,
                FEEDBACK_HAS_EXPECTED: feedback.expected_answer is not None,
            },
        )
        if feedback.comment:
            observer.payload(span, FEEDBACK_COMMENT, feedback.comment)
        span.end()


async def attach_to_trace(
    settings: Settings,
    receipt: FeedbackReceipt,
    feedback: Feedback,
    *,
    client: httpx.AsyncClient | None = None,
) -> str:
    """Put the rating on the turn's trace (see the module docstring); what was done:
    ``score``, ``score_failed``, ``span``, ``failed`` or ``off``. Never raises."""
    if settings.observability.sdk_disabled:
        return "off"
    try:
        target = langfuse_scores(settings)
        if target is not None and receipt.trace_id:
            sent = await post_score(
                target,
                receipt,
                feedback,
                payloads=settings.observability.observe_payloads,
                client=client,
            )
            return "score" if sent else "score_failed"
        record_span(receipt, feedback, payloads=settings.observability.observe_payloads)
        return "span"
    except Exception:  # a rating is stored whatever happens to its trace
        log.exception("feedback on trace %s: not attached", receipt.trace_id)
        return "failed"
