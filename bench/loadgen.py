"""A small closed-loop HTTP load generator for the benchmarks (asyncio + httpx).

``concurrency`` workers each send one request at a time until ``requests`` have been sent or
``seconds`` have passed, whichever comes first; ``warmup`` requests go first and are not
counted. Traffic only to loopback addresses: this measures our service on this machine, never
someone else's. Reports req/s, p50/p95/p99 latency and the error count (non-2xx or transport
errors)::

    result = asyncio.run(run_load(url + "/ask", body_for, headers, concurrency=64, requests=640))
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class LoadResult:
    requests: int
    seconds: float
    errors: int
    latencies_ms: tuple[float, ...]

    @property
    def req_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    @property
    def p95(self) -> float:
        return self.pct(0.95)

    @property
    def p99(self) -> float:
        return self.pct(0.99)

    def line(self) -> str:
        return (
            f"{self.req_s:7.1f} req/s  p50 {self.p50:7.1f} ms  p95 {self.p95:7.1f} ms  "
            f"p99 {self.p99:7.1f} ms  errors {self.errors}/{self.requests}"
        )


def check_loopback(url: str) -> None:
    host = (urlparse(url).hostname or "").lower()
    if host not in LOOPBACK and not host.startswith("127."):
        raise ValueError(f"load only goes to this machine (127.0.0.1), not {host!r}")


async def run_load(
    url: str,
    body: Callable[[int], Any],
    headers: Mapping[str, str] | None = None,
    *,
    concurrency: int,
    requests: int,
    seconds: float | None = None,
    warmup: int = 0,
    request_timeout: float = 120.0,
    on_result: Callable[[float, bool], None] | None = None,
) -> LoadResult:
    """POST ``body(i)`` (JSON) to ``url`` under the limits above. ``on_result(latency_ms,
    ok)``, when given, is called as each counted (not warm-up) request completes: for a time
    series of the load (``bench.autoscaling``)."""
    check_loopback(url)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=request_timeout, limits=limits) as client:

        async def one(i: int) -> tuple[float, bool]:
            start = time.perf_counter()
            try:
                resp = await client.post(url, json=body(i), headers=dict(headers or {}))
                ok = 200 <= resp.status_code < 300
            except httpx.HTTPError:
                ok = False
            return (time.perf_counter() - start) * 1000.0, ok

        if warmup:
            sem = asyncio.Semaphore(concurrency)

            async def warm(i: int) -> None:
                async with sem:
                    await one(-1 - i)

            await asyncio.gather(*(warm(i) for i in range(warmup)))

        latencies: list[float] = []
        errors = 0
        next_index = 0
        started = time.perf_counter()
        deadline = started + seconds if seconds else None

        async def worker() -> None:
            nonlocal next_index, errors
            while next_index < requests and (deadline is None or time.perf_counter() < deadline):
                i = next_index
                next_index += 1
                ms, ok = await one(i)
                latencies.append(ms)
                errors += 0 if ok else 1
                if on_result is not None:
                    on_result(ms, ok)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return LoadResult(len(latencies), elapsed, errors, tuple(latencies))
