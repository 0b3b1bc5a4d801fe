from __future__ import annotations

import asyncio

from serve_app.tracing import carrier_from_headers, current_trace_id, inject_current, use_context

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
