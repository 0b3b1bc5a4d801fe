"""Feedback on the turn's trace (``serve_app.feedback``): Langfuse's public API is used only
when the OTLP exporter already points at Langfuse with its Basic credentials; the score is
posted to a stand-in for Langfuse's ``POST /api/public/scores`` on 127.0.0.1 (the request
Langfuse documents: no real Langfuse here); a refusal or an unreachable host is logged and
reported, never raised."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from conversations.feedback import Feedback, FeedbackReceipt, Rater
from foundation.settings import Settings
from local_world.servers import run_in_thread
from serve_app.feedback import attach_to_trace, langfuse_scores

AUTH = "Basic cGstbGYtMTpzay1sZi0x"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def settings(**overrides: Any) -> Settings:
    return Settings(_env_file=None, **overrides)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("endpoint", "headers", "expected"),
    [
        (
            "https://cloud.langfuse.com/api/public/otel",
            f"Authorization={AUTH},x-langfuse-ingestion-version=4",
            "https://cloud.langfuse.com/api/public/scores",
        ),
        (
            "http://localhost:3000/lf/api/public/otel/v1/traces",
            "authorization=Basic%20cGs6c2s=",
            "http://localhost:3000/lf/api/public/scores",
        ),
        ("http://collector:4318", f"Authorization={AUTH}", None),  # not Langfuse
        ("https://cloud.langfuse.com/api/public/otel", None, None),  # no credentials
        ("https://cloud.langfuse.com/api/public/otel", "Authorization=Bearer x", None),
        (None, None, None),
    ],
    ids=["cloud", "self-hosted, path prefix", "collector", "no headers", "not basic", "unset"],
)
def test_langfuse_is_recognised_from_the_otlp_settings_alone(
    endpoint: str | None, headers: str | None, expected: str | None
) -> None:
    target = langfuse_scores(
        settings(otel_exporter_otlp_endpoint=endpoint, otel_exporter_otlp_headers=headers)
    )
    assert (target.url if target else None) == expected
    if target is not None:
        assert target.authorization.startswith("Basic ")


@pytest.fixture
def langfuse() -> Iterator[tuple[str, list[dict[str, Any]], list[int]]]:
    """A stand-in for Langfuse's scores endpoint: its base URL, the requests it got (body and
    authorization), and the statuses it answers with (next first; default 200)."""
    got: list[dict[str, Any]] = []
    statuses: list[int] = []
    app = FastAPI()

    @app.post("/api/public/scores")
    async def scores(request: Request) -> JSONResponse:
        got.append({"body": await request.json(), "auth": request.headers.get("authorization")})
        status = statuses.pop(0) if statuses else 200
        return JSONResponse({"id": "x"}, status_code=status)

    with run_in_thread(app) as url:
        yield url, got, statuses


def rating(comment: str | None = "too vague") -> tuple[FeedbackReceipt, Feedback]:
    now = datetime.now(UTC)
    conversation = uuid.UUID("0f85ccb4-f46d-4f51-9e4f-53c5faa93d90")
    receipt = FeedbackReceipt(conversation, 2, TRACE, "down", False, now, now)
    return receipt, Feedback("down", Rater("nina", ("business_staff",), ("northwind",)), comment)


async def test_a_rating_on_a_langfuse_trace_is_a_boolean_score_and_failures_are_logged(
    langfuse: tuple[str, list[dict[str, Any]], list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    url, got, statuses = langfuse
    configured = settings(
        otel_exporter_otlp_endpoint=f"{url}/api/public/otel",
        otel_exporter_otlp_headers=f"Authorization={AUTH},x-langfuse-ingestion-version=4",
    )
    receipt, feedback = rating()
    assert await attach_to_trace(configured, receipt, feedback) == "score"
    assert got[-1] == {
        "auth": AUTH,
        "body": {
            # the turn's own id: a second rating replaces the score
            "id": "feedback-0f85ccb4-f46d-4f51-9e4f-53c5faa93d90-2",
            "traceId": TRACE,
            "name": "user-feedback",
            "value": 0,
            "dataType": "BOOLEAN",
        },  # no comment: it is the user's text, sent only with OBSERVE_PAYLOADS=true
    }
    with_payloads = configured.model_copy(update={"observe_payloads": True})
    assert await attach_to_trace(with_payloads, receipt, feedback) == "score"
    assert got[-1]["body"]["comment"] == "too vague"

    statuses.append(500)
    with caplog.at_level(logging.WARNING, logger="serve_app.feedback"):
        assert await attach_to_trace(configured, receipt, feedback) == "score_failed"
    assert f"feedback score for trace {TRACE} refused: HTTP 500" in caplog.text

    gone = configured.model_copy(
        update={"otel_exporter_otlp_endpoint": "http://127.0.0.1:1/api/public/otel"}
    )
    with caplog.at_level(logging.WARNING, logger="serve_app.feedback"):
        assert await attach_to_trace(gone, receipt, feedback) == "score_failed"
    assert f"feedback score for trace {TRACE} not sent" in caplog.text

    disabled = configured.model_copy(update={"otel_sdk_disabled": True})
    sent = len(got)
    assert await attach_to_trace(disabled, receipt, feedback) == "off"
    assert len(got) == sent
