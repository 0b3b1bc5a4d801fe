"""Per-process setup: the tracer provider, its exporter, and structured logs.

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: OTLP/HTTP (protobuf) through a batch processor, with
  ``OTEL_EXPORTER_OTLP_HEADERS`` (e.g. Langfuse's ``Authorization=Basic ...`` and
  ``x-langfuse-ingestion-version=4``). The endpoint is the collector's base URL; ``/v1/traces``
  is appended unless the URL already ends with it.
* Unset: one compact line per finished span in the logs (``CompactLogSpanExporter``).
* ``OTEL_SDK_DISABLED=true``: no provider at all (spans are no-ops; trace ids still flow).

Every span gets ``user.id`` and ``session.id`` from the request's baggage
(``RequestAttributesProcessor``), whichever process (Serve replica) it starts in.
Idempotent: each Serve replica calls ``configure_observability`` in its constructor.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import StatusCode

from foundation.observability import attributes as attr
from foundation.settings import Settings
from foundation.tracing import PresetTraceIdGenerator

SPAN_LOGGER = "agent_service.spans"
_lock = threading.Lock()
_provider: TracerProvider | None = None
_logging_configured = False

# Attributes worth a place on a span's log line (never payload keys).
_LOG_KEYS = (
    attr.LANGFUSE_TYPE,
    attr.GEN_AI_REQUEST_MODEL,
    attr.GEN_AI_RESPONSE_MODEL,
    attr.GEN_AI_INPUT_TOKENS,
    attr.GEN_AI_OUTPUT_TOKENS,
    attr.GEN_AI_COST,
    attr.GEN_AI_TOOL_NAME,
    attr.GEN_AI_RETRIEVAL_COUNT,
    attr.AGENT_DECISION,
    attr.AGENT_HOPS,
    attr.TOOL_ERROR_KIND,
    attr.USER_ID,
)


class RequestAttributesProcessor(SpanProcessor):
    """Copies ``user.id`` / ``session.id`` from the parent context's baggage onto each span."""

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        for key in (attr.USER_ID, attr.SESSION_ID):
            value = baggage.get_baggage(key, parent_context)
            if isinstance(value, str) and value:
                span.set_attribute(key, value)

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def span_line(span: ReadableSpan) -> str:
    """``span <name> <ms>ms trace=<id> [status=ERROR(<kind>)] key=value ...``."""
    duration_ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    context = span.get_span_context()
    parts = [f"span {span.name} {duration_ms:.1f}ms"]
    if context is not None:
        parts.append(f"trace={context.trace_id:032x}")
    if span.status.status_code is StatusCode.ERROR:
        parts.append(f"status=ERROR({span.status.description or ''})")
    attributes = span.attributes or {}
    for key in _LOG_KEYS:
        if key in attributes:
            parts.append(f"{key}={attributes[key]!s}")
    return " ".join(parts)


class CompactLogSpanExporter(SpanExporter):
    """One log line per span, for when no collector is configured."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger(SPAN_LOGGER)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self._log.info(span_line(span))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def parse_otlp_headers(raw: str | None) -> dict[str, str]:
    """``key=value,key2=value2`` (the OTEL_EXPORTER_OTLP_HEADERS format; values may be
    percent-encoded)."""
    from urllib.parse import unquote

    headers: dict[str, str] = {}
    for item in (raw or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[key.strip().lower()] = unquote(value.strip())
    return headers


def traces_endpoint(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


def build_exporter(settings: Settings) -> SpanExporter:
    if settings.observability.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        raw = settings.observability.otlp_headers
        return OTLPSpanExporter(
            endpoint=traces_endpoint(settings.observability.otlp_endpoint),
            headers=parse_otlp_headers(raw.get_secret_value() if raw else None),
            timeout=10,
        )
    return CompactLogSpanExporter()


def build_provider(
    settings: Settings,
    component: str,
    *,
    exporter: SpanExporter | None = None,
    processor: SpanProcessor | None = None,
) -> TracerProvider:
    """A provider for this process (not installed globally; see ``configure_observability``).
    Tests pass their own ``processor`` (e.g. a simple one over an in-memory exporter)."""
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": settings.observability.service_name, "service.component": component}
        ),
        id_generator=PresetTraceIdGenerator(),
    )
    provider.add_span_processor(RequestAttributesProcessor())
    provider.add_span_processor(
        processor or BatchSpanProcessor(exporter or build_exporter(settings))
    )
    return provider


def configure_observability(settings: Settings, component: str) -> TracerProvider | None:
    """Install this process's tracer provider and log format, once."""
    global _provider
    configure_logging(settings)
    if settings.observability.sdk_disabled:
        return None
    with _lock:
        if _provider is None:
            _provider = build_provider(settings, component)
            trace.set_tracer_provider(_provider)
        return _provider


def flush_observability(timeout_millis: int = 5_000) -> None:
    """Export what is buffered (call before a short-lived process exits)."""
    if _provider is not None:
        _provider.force_flush(timeout_millis)


# --- logs ---------------------------------------------------------------------------------------


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id``/``span_id`` of the current span (empty outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from foundation.tracing import current_trace_id

        span_context = trace.get_current_span().get_span_context()
        trace_id = current_trace_id() or ""
        record.trace_id = trace_id
        record.trace_tag = f" [trace={trace_id}]" if trace_id else ""
        record.span_id = format(span_context.span_id, "016x") if span_context.is_valid else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC), level, logger, message, trace/span ids, exception."""

    # The timestamp ends in "Z": UTC, whatever the host's time zone (the default is local time).
    converter = staticmethod(time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("trace_id", "span_id"):
            value = getattr(record, key, "")
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s%(trace_tag)s: %(message)s"


def log_handler(settings: Settings, stream: Any = None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(TraceContextFilter())
    if settings.observability.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    return handler


def configure_logging(settings: Settings, *, level: int | None = None) -> None:
    """Structured logs on the root logger (JSON or console per LOG_FORMAT), once."""
    global _logging_configured
    with _lock:
        root = logging.getLogger()
        root.setLevel(
            level if level is not None else getattr(logging, settings.observability.log_level)
        )
        if _logging_configured:
            return
        _logging_configured = True
        if root.handlers:  # someone (a test harness, a host app) owns the output: add ids only
            for handler in root.handlers:
                handler.addFilter(TraceContextFilter())
        else:
            root.addHandler(log_handler(settings))
        for noisy in (
            "httpx",
            "httpcore",
            "urllib3",
            "filelock",
            "sentence_transformers",
            "alembic.runtime.plugins",
        ):
            logging.getLogger(noisy).setLevel(logging.WARNING)
