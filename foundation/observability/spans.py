"""Small helpers the instrumented code uses to open spans and gate payloads.

Spans are opened against an explicit parent context and ended explicitly, never attached
across a ``yield``: the agent loop is an async generator whose consumer (an SSE response, a
Ray streaming handle) may resume or close it from another task, and a context token
attached in one task cannot be detached in another. Code without yields uses
``start_as_current_span`` as usual.

With no tracer provider configured every call here is a cheap no-op (OpenTelemetry's
non-recording spans); trace ids still flow through the carrier.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from foundation.observability import attributes as attr

TRACER_NAME = "agent-service"
MAX_PAYLOAD_CHARS = 32_000  # per attribute: enough for a prompt, bounded for the exporter


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def to_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


def _clip(text: str) -> str:
    if len(text) <= MAX_PAYLOAD_CHARS:
        return text
    return text[:MAX_PAYLOAD_CHARS] + f"...[{len(text) - MAX_PAYLOAD_CHARS} more chars]"


@dataclass(frozen=True)
class Observer:
    """Opens typed spans; ``payloads`` (OBSERVE_PAYLOADS) decides whether content is kept."""

    payloads: bool = False

    def start(
        self,
        name: str,
        observation: str,
        *,
        parent: Context | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Span:
        values: dict[str, AttributeValue] = {attr.LANGFUSE_TYPE: observation}
        values.update(attributes or {})
        return tracer().start_span(name, context=parent, attributes=values)

    def payload(self, span: Span, key: str, value: object) -> None:
        """Set a content attribute, only when payloads are on (strings kept, the rest JSON)."""
        if not self.payloads or not span.is_recording():
            return
        text = value if isinstance(value, str) else to_json(value)
        span.set_attribute(key, _clip(text))

    def fail(
        self,
        span: Span,
        kind: str,
        *,
        message: str | None = None,
        exception: BaseException | None = None,
    ) -> None:
        """Error status plus an ``exception`` event. The message (which may quote the
        request) is kept only with payloads on; otherwise the failure's kind stands in."""
        if not span.is_recording():
            return
        shown = message if (self.payloads and message) else kind
        span.set_status(Status(StatusCode.ERROR, shown))
        event: dict[str, AttributeValue] = {
            "exception.type": type(exception).__name__ if exception is not None else kind,
            "exception.message": _clip(shown),
            "exception.escaped": False,
        }
        span.add_event("exception", event)
        span.set_attribute(attr.LANGFUSE_LEVEL, "ERROR")
        span.set_attribute(attr.LANGFUSE_STATUS_MESSAGE, shown)


def set_attributes(span: Span, values: Mapping[str, Any]) -> None:
    """Set the non-None values (OpenTelemetry refuses None)."""
    if not span.is_recording():
        return
    for key, value in values.items():
        if value is not None:
            span.set_attribute(key, value)


def in_span(span: Span, parent: Context | None = None) -> Context:
    """A context whose current span is ``span`` (for children and carriers)."""
    return trace.set_span_in_context(span, parent)
