from __future__ import annotations

import asyncio
import re

import pytest
from opentelemetry import baggage, trace
from opentelemetry.sdk.trace import TracerProvider

from foundation.tracing import (
    ROOT_TRACE_KEY,
    PresetTraceIdGenerator,
    carrier_from_headers,
    current_trace_id,
    extract,
    inject_current,
    request_context,
    trace_id_of,
    use_context,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_incoming_trace_is_continued() -> None:
    carrier = carrier_from_headers({"TraceParent": TRACEPARENT, "x-other": "1"})
    with use_context(carrier):
        assert current_trace_id() == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert inject_current()["traceparent"].split("-")[1] == current_trace_id()
    assert current_trace_id() is None


def test_a_missing_or_broken_trace_starts_a_new_one() -> None:
    ids = set()
    for headers in ({}, {"traceparent": "garbage"}, {"traceparent": "00-" + "0" * 32 + "-1-01"}):
        with use_context(carrier_from_headers(headers)):
            trace_id = current_trace_id()
            assert trace_id is not None and len(trace_id) == 32
            ids.add(trace_id)
    assert len(ids) == 3


def test_context_follows_across_an_async_hop() -> None:
    async def hop(carrier: dict[str, str]) -> str | None:
        with use_context(carrier):
            await asyncio.sleep(0)
            return current_trace_id()

    carrier = carrier_from_headers({"traceparent": TRACEPARENT})
    with use_context(carrier):
        sent = inject_current()
    assert asyncio.run(hop(sent)) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert asyncio.run(hop({})) is None


# --- a fresh trace, baggage, and the request's identity ------------------------------------------

ROOT_ID = re.compile(r"^[0-9a-f]{32}$")


def _baggage(carrier: dict[str, str]) -> dict[str, object]:
    return dict(baggage.get_all(extract(carrier)))


def test_a_fresh_trace_is_a_bare_trace_id_not_an_invented_parent() -> None:
    carrier = carrier_from_headers({}, user_id="alice")
    assert "traceparent" not in carrier and "tracestate" not in carrier
    assert ROOT_ID.match(carrier[ROOT_TRACE_KEY])
    with use_context(carrier):
        # no parent span anywhere in the context, but the trace id is known already
        assert not trace.get_current_span().get_span_context().is_valid
        assert current_trace_id() == carrier[ROOT_TRACE_KEY]
        # and it travels on to the next hop the same way
        assert inject_current() == carrier


def test_a_continued_trace_carries_no_preset_id() -> None:
    carrier = carrier_from_headers({"traceparent": TRACEPARENT})
    assert ROOT_TRACE_KEY not in carrier
    assert carrier["traceparent"] == TRACEPARENT


def test_a_malformed_preset_id_is_ignored() -> None:
    for bad in ("xyz", "0" * 31, "A" * 32, "1" * 33):
        with use_context({ROOT_TRACE_KEY: bad}):
            assert current_trace_id() is None


def test_the_first_span_of_a_fresh_trace_is_a_root_with_the_preset_id() -> None:
    provider = TracerProvider(id_generator=PresetTraceIdGenerator())
    tracer = provider.get_tracer("t")
    carrier = carrier_from_headers({})
    with use_context(carrier), tracer.start_as_current_span("agent.answer") as root:
        with tracer.start_as_current_span("agent.hop.1") as child:
            pass
        assert current_trace_id() == carrier[ROOT_TRACE_KEY]
    assert root.parent is None  # type: ignore[attr-defined]
    assert format(root.get_span_context().trace_id, "032x") == carrier[ROOT_TRACE_KEY]
    assert child.get_span_context().trace_id == root.get_span_context().trace_id
    # outside a request: ordinary random ids
    with tracer.start_as_current_span("other") as other:
        pass
    assert format(other.get_span_context().trace_id, "032x") != carrier[ROOT_TRACE_KEY]
    assert (
        PresetTraceIdGenerator().generate_trace_id() != PresetTraceIdGenerator().generate_trace_id()
    )


def test_a_callers_baggage_header_is_never_read() -> None:
    headers = {
        "traceparent": TRACEPARENT,
        "baggage": "user.id=mallory,session.id=stolen,role=admin",
    }
    assert _baggage(carrier_from_headers(headers)) == {}
    assert _baggage(carrier_from_headers(headers, user_id="alice", session_id="s-1")) == {
        "user.id": "alice",
        "session.id": "s-1",
    }
    assert _baggage(carrier_from_headers({"baggage": "user.id=mallory"})) == {}


@pytest.mark.parametrize("session", ["s-42", "conv:2024.06_a", "A" * 128])
def test_a_sane_session_id_is_carried(session: str) -> None:
    assert _baggage(carrier_from_headers({}, session_id=session)) == {"session.id": session}


@pytest.mark.parametrize(
    "session",
    ["", "has space", "semi;colon", "a,b", "user.id=x", "é", "A" * 129, "line\nbreak"],
)
def test_a_bad_session_id_is_dropped(session: str) -> None:
    carrier = carrier_from_headers({}, user_id="alice", session_id=session)
    assert _baggage(carrier) == {"user.id": "alice"}
    assert ROOT_ID.match(carrier[ROOT_TRACE_KEY])  # the request itself goes on


def test_request_context_sets_the_authenticated_user_and_keeps_the_session() -> None:
    carrier = carrier_from_headers({}, user_id="spoofed", session_id="s-9")
    with use_context(carrier):
        ctx = request_context("alice")
    assert baggage.get_baggage("user.id", ctx) == "alice"
    assert baggage.get_baggage("session.id", ctx) == "s-9"
    assert trace_id_of(ctx) == carrier[ROOT_TRACE_KEY]


def test_request_context_defaults_the_session_to_the_trace_id() -> None:
    carrier = carrier_from_headers({"traceparent": TRACEPARENT}, user_id="alice")
    with use_context(carrier):
        ctx = request_context("alice")
    assert baggage.get_baggage("session.id", ctx) == "4bf92f3577b34da6a3ce929d0e0e4736"
    fresh = carrier_from_headers({})
    with use_context(fresh):
        ctx = request_context("bob")
    assert baggage.get_baggage("session.id", ctx) == fresh[ROOT_TRACE_KEY]
    assert baggage.get_baggage("user.id", ctx) == "bob"


def test_request_context_without_a_carrier_starts_a_trace() -> None:
    """A test or a script calling the agent directly still gets one trace id."""
    ctx = request_context("carol")
    trace_id = trace_id_of(ctx)
    assert trace_id is not None and ROOT_ID.match(trace_id)
    assert baggage.get_baggage("session.id", ctx) == trace_id
    assert trace_id_of(request_context("carol")) != trace_id
    assert current_trace_id() is None  # nothing was attached
