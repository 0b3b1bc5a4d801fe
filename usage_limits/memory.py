"""``InMemoryUsageStore``: the ``UsageStore`` port in one process's memory, for unit tests
(the semantics of ``usage_limits.store.PgUsageStore``; one lock stands in for its row
locks)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from usage_limits.core import (
    Counts,
    Decision,
    Period,
    SubjectLimits,
    WindowKind,
    decide,
    window_start,
)

_Row = tuple[str, WindowKind, datetime]


class InMemoryUsageStore:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.requests: dict[_Row, int] = defaultdict(int)
        self.spent: dict[_Row, tuple[int, float]] = defaultdict(lambda: (0, 0.0))
        self.fail: Exception | None = None  # raised by every call while set (a store outage)

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def admit(
        self, subjects: Sequence[SubjectLimits], now: datetime, period: Period
    ) -> Decision:
        self._check()
        minute = window_start(now, "minute")
        start = window_start(now, period)
        async with self._lock:
            counts: dict[str, Counts] = {}
            for subject in subjects:
                requests = 0
                if subject.counts_requests:
                    requests = self.requests[(subject.key, "minute", minute)] + 1
                tokens, cost = self.spent.get((subject.key, period, start), (0, 0.0))
                counts[subject.key] = Counts(requests=requests, tokens=tokens, cost_usd=cost)
            decision = decide(subjects, counts, now, period)
            if decision.allowed:
                for subject in subjects:
                    if subject.counts_requests:
                        self.requests[(subject.key, "minute", minute)] += 1
            return decision

    async def record(
        self, keys: Sequence[str], tokens: int, cost_usd: float, now: datetime, period: Period
    ) -> None:
        self._check()
        start = window_start(now, period)
        async with self._lock:
            for key in set(keys):
                old_tokens, old_cost = self.spent[(key, period, start)]
                self.spent[(key, period, start)] = (old_tokens + tokens, old_cost + cost_usd)

    async def counts(self, key: str, now: datetime, period: Period) -> Counts:
        self._check()
        tokens, cost = self.spent.get((key, period, window_start(now, period)), (0, 0.0))
        requests = self.requests.get((key, "minute", window_start(now, "minute")), 0)
        return Counts(requests=requests, tokens=tokens, cost_usd=cost)

    async def close(self) -> None:
        return None
