"""The order in which chat completions take a model's llama.cpp slots: earliest ``/ask`` first.

An ``/ask`` makes several model calls (route, hops, a repair), each queued for the model's
slots. First come, first served interleaves the calls of concurrent asks, so every one of
them takes about as long as all of them together (at concurrency 4 on the single slot of
2 cores, the 2026-12-03 sweep had 26 asks cut off at the 170 s deadline). Served by when
their ask started instead, an ask under way finishes before a newer one takes the model:
the oldest one's wait is only its own calls, and the newest waits for the ones before it.

A request says when its ask started in the ``x-queue-priority`` header (seconds since the
epoch; lower goes first; the agent's OpenAI client sends it). A request without one (a
judge, ``curl``) ranks by its own arrival. The header is a scheduling hint from a trusted
caller: the local LLM app listens where the service does, so anyone who can reach it can
jump its queue - it is a development server, not a tenant boundary.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from agent.llm.base import QUEUE_PRIORITY_HEADER as PRIORITY_HEADER


def priority_of(headers: Mapping[str, str], now: float | None = None) -> float:
    """The request's rank: its header's value when it is a finite number, else ``now``."""
    arrival = time.time() if now is None else now
    raw = headers.get(PRIORITY_HEADER)
    if raw is None:
        return arrival
    try:
        value = float(raw)
    except ValueError:
        return arrival
    return value if math.isfinite(value) else arrival


class SlotGate:
    """``slots`` concurrent holders; waiters admitted lowest priority first (ties: arrival)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a slot gate needs at least one slot")
        self._free = slots
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot (cancelled ones not counted)."""
        return sum(1 for _, _, fut in self._waiting if not fut.done())

    @asynccontextmanager
    async def slot(self, priority: float) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: float) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._arrivals), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # granted just as the caller went away: pass it on
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                fut.set_result(None)  # the slot moves to the waiter; ``_free`` is unchanged
                return
        self._free += 1
