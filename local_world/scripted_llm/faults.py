"""Fault injection: scripted delays, hangs and error replies (with OpenAI's retry headers)."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request
from fastapi.responses import JSONResponse

from local_world.scripted_llm.script import HANG_MS, Fault
from local_world.scripted_llm.wire import openai_error


async def wait(request: Request, delay_ms: int) -> bool:
    """Sleep up to ``delay_ms``; return False as soon as the client has gone away."""
    deadline = time.monotonic() + delay_ms / 1000.0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return True
        await asyncio.sleep(min(0.05, remaining))
        if await request.is_disconnected():
            return False


async def fault_reply(request: Request, fault: Fault) -> JSONResponse:
    """The reply to a ``hang``, ``rate_limit`` or ``server_error`` fault (not ``malformed``:
    each endpoint truncates its own body)."""
    if fault.kind == "hang":
        await wait(request, HANG_MS)
        return openai_error(504, "scripted hang ended", type_="server_error")
    return fault_response(fault)


def fault_headers(fault: Fault) -> dict[str, str]:
    headers: dict[str, str] = {}
    if fault.retry_after is not None:
        headers["retry-after"] = (
            str(int(fault.retry_after))
            if float(fault.retry_after).is_integer()
            else str(fault.retry_after)
        )
    if fault.retry_after_ms is not None:
        headers["retry-after-ms"] = str(fault.retry_after_ms)
    if fault.retry is not None:
        headers["x-should-retry"] = "true" if fault.retry else "false"
    return headers


def fault_response(fault: Fault) -> JSONResponse:
    if fault.kind == "rate_limit":
        return openai_error(
            fault.status,
            fault.message or "Rate limit reached (scripted)",
            type_="rate_limit_error" if fault.status == 429 else "api_error",
            code="rate_limit_exceeded" if fault.status == 429 else None,
            headers=fault_headers(fault),
        )
    return openai_error(
        fault.status,
        fault.message or f"scripted {fault.kind} ({fault.status})",
        type_="server_error" if fault.status >= 500 else "invalid_request_error",
        code=fault.kind,
        headers=fault_headers(fault),
    )
