"""Trace context that crosses every hop of one request (W3C ``traceparent`` + baggage).

The ingress continues the caller's trace (a valid incoming ``traceparent``) or picks a fresh
trace id, then passes the context as a plain ``dict`` carrier through every deployment handle
call; each hop re-attaches it (``use_context``), so logs, spans and the ``/ask`` response share
one trace id.

A fresh trace is carried as a bare trace id (``ROOT_TRACE_KEY``), not as a ``traceparent``
with an invented parent span: that parent would never be exported, and tracing backends
(Langfuse among them) would show ``agent.answer`` as the child of a span that does not exist.
``PresetTraceIdGenerator`` gives the first real span that trace id, so it becomes the root.

Baggage carries ``user.id`` and ``session.id`` to every process; ``observability`` copies
them onto every span. A caller's own ``baggage`` header is never read: those values are ours.

Plain OpenTelemetry API and SDK: no Ray, no FastAPI.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

Carrier = dict[str, str]

ROOT_TRACE_KEY = "agent-root-trace-id"  # carrier key and context key of a fresh trace's id
USER_ID = "user.id"
SESSION_ID = "session.id"
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_SESSION_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def _new_trace_id() -> int:
    return int.from_bytes(secrets.token_bytes(16), "big") or 1


def carrier_from_headers(
    headers: Mapping[str, str],
    *,
    user_id: str | None = None,
    session_id: str | None = None,
) -> Carrier:
    """The incoming trace (``traceparent``/``tracestate``) if valid, else a new trace id;
    plus ``user.id`` and ``session.id`` baggage (``session_id`` when it is a sane token)."""
    incoming = {
        k.lower(): v for k, v in headers.items() if k.lower() in {"traceparent", "tracestate"}
    }
    ctx = propagate.extract(incoming)
    if user_id:
        ctx = baggage.set_baggage(USER_ID, user_id, ctx)
    if session_id and _SESSION_ID.fullmatch(session_id):
        ctx = baggage.set_baggage(SESSION_ID, session_id, ctx)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        ctx = otel_context.set_value(ROOT_TRACE_KEY, _new_trace_id(), ctx)
    return inject(ctx)


def inject(ctx: otel_context.Context | None = None) -> Carrier:
    """``ctx`` (default: the current context) as a carrier, for the next handle call."""
    carrier: Carrier = {}
    propagate.inject(carrier, context=ctx)
    if "traceparent" not in carrier:
        root = otel_context.get_value(ROOT_TRACE_KEY, ctx)
        if isinstance(root, int):
            carrier[ROOT_TRACE_KEY] = format(root, "032x")
    return carrier


def inject_current() -> Carrier:
    """The current context as a carrier, for the next handle call."""
    return inject()


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context:
    """The context a previous hop sent (the current one for an empty carrier)."""
    if not carrier:
        return otel_context.get_current()
    ctx = propagate.extract(dict(carrier))
    root = carrier.get(ROOT_TRACE_KEY, "")
    if not trace.get_current_span(ctx).get_span_context().is_valid and _HEX32.fullmatch(root):
        ctx = otel_context.set_value(ROOT_TRACE_KEY, int(root, 16), ctx)
    return ctx


@contextmanager
def use_context(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Attach the context a previous hop sent (no-op for an empty carrier)."""
    if not carrier:
        yield
        return
    token = otel_context.attach(extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


def trace_id_of(ctx: otel_context.Context | None = None) -> str | None:
    """The trace id of ``ctx`` (default: the current context), as 32 hex digits."""
    span_context = trace.get_current_span(ctx).get_span_context()
    if span_context.is_valid:
        return format(span_context.trace_id, "032x")
    root = otel_context.get_value(ROOT_TRACE_KEY, ctx)
    return format(root, "032x") if isinstance(root, int) else None


def current_trace_id() -> str | None:
    return trace_id_of()


class PresetTraceIdGenerator(RandomIdGenerator):
    """Root spans take the request's preset trace id (``ROOT_TRACE_KEY`` in the current
    context), so a fresh request's first span is a true root with the id the ingress chose."""

    def generate_trace_id(self) -> int:
        root = otel_context.get_value(ROOT_TRACE_KEY)
        return root if isinstance(root, int) else super().generate_trace_id()


def request_context(user_id: str | None) -> otel_context.Context:
    """The current context with ``user.id`` baggage (the authenticated caller: whatever an
    upstream hop said is overwritten) and ``session.id`` (kept if set, else the trace id)."""
    ctx = otel_context.get_current()
    if trace_id_of(ctx) is None:  # called without a carrier (a test, a script): a fresh trace
        ctx = otel_context.set_value(ROOT_TRACE_KEY, _new_trace_id(), ctx)
    if user_id:
        ctx = baggage.set_baggage(USER_ID, user_id, ctx)
    if not baggage.get_baggage(SESSION_ID, ctx):
        ctx = baggage.set_baggage(SESSION_ID, trace_id_of(ctx) or "", ctx)
    return ctx
