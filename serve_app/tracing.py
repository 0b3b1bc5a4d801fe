"""Trace context that crosses every hop of one request (W3C ``traceparent``).

The ingress continues the caller's trace (a valid incoming ``traceparent``) or starts one,
then passes the context as a plain ``dict`` carrier through every deployment handle call;
each hop re-attaches it (``use_context``), so logs, spans and the ``/ask`` response share one
trace id. Plain OpenTelemetry API: no Ray, no FastAPI.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

Carrier = dict[str, str]


def new_trace_context() -> otel_context.Context:
    """A fresh root context (random trace and span ids, sampled)."""
    span_context = SpanContext(
        trace_id=int.from_bytes(secrets.token_bytes(16), "big") or 1,
        span_id=int.from_bytes(secrets.token_bytes(8), "big") or 1,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def carrier_from_headers(headers: Mapping[str, str]) -> Carrier:
    """The incoming trace (``traceparent``/``tracestate``) if valid, else a new one."""
    incoming = {
        k.lower(): v for k, v in headers.items() if k.lower() in {"traceparent", "tracestate"}
    }
    ctx = propagate.extract(incoming)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        ctx = new_trace_context()
    carrier: Carrier = {}
    propagate.inject(carrier, context=ctx)
    return carrier


def inject_current() -> Carrier:
    """The current context as a carrier, for the next handle call."""
    carrier: Carrier = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def use_context(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Attach the context a previous hop sent (no-op for an empty carrier)."""
    if not carrier:
        yield
        return
    token = otel_context.attach(propagate.extract(dict(carrier)))
    try:
        yield
    finally:
        otel_context.detach(token)


def current_trace_id() -> str | None:
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None
