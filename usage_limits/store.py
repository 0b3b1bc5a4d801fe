"""The ``UsageStore`` port and its PostgreSQL adapter (table ``usage_counters``, migration
0003).

One row per subject and window: ``requests`` in ``minute`` windows, ``tokens`` and
``cost_usd`` in the budget period's windows. Every replica of every deployment counts in
the same rows, so N replicas share one limit (never N limits).

``admit`` is one transaction: one ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` adds
this request to every rate-limited subject's minute row (rows locked in key order, so two
requests never wait on each other in a circle) and reads the subjects' period usage in the
same statement; then the decision (``usage_limits.core.decide``). A refused request is rolled
back, so it counts nowhere: a caller over its own limit does not spend its domain's
allowance. Concurrent requests of one subject queue on its row lock, so exactly ``limit``
of them get through a minute, however many replicas send them.

``record`` adds a finished run's tokens and cost to its subjects' period rows (one
statement). Minute rows older than an hour are deleted now and then (``PRUNE_EVERY_S``);
period rows stay (one per subject and period: the usage history).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

import asyncpg

from foundation.database import open_pool_at_head
from usage_limits.core import Counts, Decision, Period, SubjectLimits, decide, window_start

PRUNE_EVERY_S = 60.0
MINUTE_ROWS_KEPT = timedelta(hours=1)


class UsageStore(Protocol):
    """Where the counters live (shared by every replica)."""

    async def admit(
        self, subjects: Sequence[SubjectLimits], now: datetime, period: Period
    ) -> Decision:
        """Count one request against ``subjects`` and decide, atomically; a refused request
        counts nowhere."""
        ...

    async def record(
        self, keys: Sequence[str], tokens: int, cost_usd: float, now: datetime, period: Period
    ) -> None:
        """Add a run's tokens and cost to each subject's period (``keys``: subject keys)."""
        ...

    async def counts(self, key: str, now: datetime, period: Period) -> Counts:
        """A subject's requests this minute and its tokens and cost this period."""
        ...

    async def close(self) -> None: ...


_ADMIT = """
WITH bumped AS (
    INSERT INTO usage_counters AS c (subject, window_kind, window_start, requests)
    SELECT s, 'minute', $2, 1 FROM unnest($1::text[]) AS s ORDER BY s
    ON CONFLICT (subject, window_kind, window_start)
    DO UPDATE SET requests = c.requests + 1
    RETURNING c.subject, c.requests
)
SELECT 'minute' AS kind, subject, requests, 0::bigint AS tokens, 0::float8 AS cost_usd
FROM bumped
UNION ALL
SELECT 'period', subject, 0, tokens, cost_usd FROM usage_counters
WHERE window_kind = $4 AND window_start = $5 AND subject = ANY($3::text[])
"""

_RECORD = """
INSERT INTO usage_counters AS c (subject, window_kind, window_start, tokens, cost_usd)
SELECT s, $2, $3, $4, $5 FROM unnest($1::text[]) AS s ORDER BY s
ON CONFLICT (subject, window_kind, window_start)
DO UPDATE SET tokens = c.tokens + EXCLUDED.tokens, cost_usd = c.cost_usd + EXCLUDED.cost_usd
"""

_COUNTS = """
SELECT window_kind, requests, tokens, cost_usd FROM usage_counters
WHERE subject = $1 AND ((window_kind = 'minute' AND window_start = $2)
                        OR (window_kind = $3 AND window_start = $4))
"""


class _Refused(Exception):
    """Rolls the admission's transaction back."""


class PgUsageStore:
    """``UsageStore`` on PostgreSQL (one pool)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._pruned_at = 0.0

    @classmethod
    async def connect(cls, url: str, *, min_size: int = 1, max_size: int = 10) -> PgUsageStore:
        """Open a pool, refusing a database whose schema is missing or not at head."""
        return cls(await open_pool_at_head(url, min_size=min_size, max_size=max_size))

    async def close(self) -> None:
        await self._pool.close()

    async def admit(
        self, subjects: Sequence[SubjectLimits], now: datetime, period: Period
    ) -> Decision:
        counted = sorted(s.key for s in subjects if s.counts_requests)
        budgeted = sorted(s.key for s in subjects if s.has_budget)
        decision: Decision | None = None
        async with self._pool.acquire() as conn:
            try:
                async with conn.transaction():
                    rows = await conn.fetch(
                        _ADMIT,
                        counted,
                        window_start(now, "minute"),
                        budgeted,
                        period,
                        window_start(now, period),
                    )
                    decision = decide(subjects, _counts(rows), now, period)
                    if not decision.allowed:
                        raise _Refused
            except _Refused:
                pass
            await self._maybe_prune(conn, now)
        assert decision is not None
        return decision

    async def _maybe_prune(self, conn: asyncpg.Connection, now: datetime) -> None:
        if time.monotonic() - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = time.monotonic()
        await conn.execute(
            "DELETE FROM usage_counters WHERE window_kind = 'minute' AND window_start < $1",
            window_start(now, "minute") - MINUTE_ROWS_KEPT,
        )

    async def record(
        self, keys: Sequence[str], tokens: int, cost_usd: float, now: datetime, period: Period
    ) -> None:
        if not keys or (tokens <= 0 and cost_usd <= 0):
            return
        await self._pool.execute(
            _RECORD, sorted(set(keys)), period, window_start(now, period), tokens, cost_usd
        )

    async def counts(self, key: str, now: datetime, period: Period) -> Counts:
        rows = await self._pool.fetch(
            _COUNTS, key, window_start(now, "minute"), period, window_start(now, period)
        )
        requests, tokens, cost = 0, 0, 0.0
        for row in rows:
            if row["window_kind"] == "minute":
                requests = int(row["requests"])
            else:
                tokens, cost = int(row["tokens"]), float(row["cost_usd"])
        return Counts(requests=requests, tokens=tokens, cost_usd=cost)


def _counts(rows: Sequence[asyncpg.Record]) -> dict[str, Counts]:
    requests: dict[str, int] = {}
    spent: dict[str, tuple[int, float]] = {}
    for row in rows:
        if row["kind"] == "minute":
            requests[row["subject"]] = int(row["requests"])
        else:
            spent[row["subject"]] = (int(row["tokens"]), float(row["cost_usd"]))
    return {
        key: Counts(
            requests=requests.get(key, 0),
            tokens=spent.get(key, (0, 0.0))[0],
            cost_usd=spent.get(key, (0, 0.0))[1],
        )
        for key in {*requests, *spent}
    }
