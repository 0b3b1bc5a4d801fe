"""Usage limits: what the PostgreSQL counter adds to one /ask (p50/p95 milliseconds).

    python -m bench.limits_overhead [--requests 400] [--concurrency 16] [--no-http]

Against the embedded PostgreSQL (or ``DATABASE_URL``'s server), in a scratch database of
its own (``limits_bench``, migrated to head, emptied first):

1. the store alone (``usage_limits.store.PgUsageStore``), one request at a time: ``admit``
   (the transaction with the one ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` for the
   caller and its domain, and the read of their period usage) and ``record`` (the charge
   after the answer);
2. the same ``admit`` from ``--concurrency`` tasks at once, all for one user and one domain
   (every request waits on the same two row locks: the worst case);
3. unless ``--no-http``: ``POST /ask`` through the real app (``create_app`` over a
   ``LocalBackend`` with an in-process model that answers at once, conversations stored in
   the same database), over httpx's in-process ASGI transport, with the limits on
   (``RATE_LIMIT_USER_PER_MINUTE``, ``RATE_LIMIT_DOMAIN_PER_MINUTE``, ``BUDGET_USER_TOKENS``)
   and off, interleaved request by request so drift hits both alike. The first 20 of each
   are warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime
from typing import Any

SCRATCH = "limits_bench"
WARMUP = 20


def _ms(samples: Sequence[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {statistics.median(ordered):.2f} ms, p95 {p95:.2f} ms (n={len(ordered)})"


async def _timed(work: Awaitable[Any]) -> float:
    started = time.perf_counter()
    await work
    return (time.perf_counter() - started) * 1000.0


async def _scratch_url() -> str:
    import asyncpg

    from foundation.database import (
        ensure_database_exists,
        migrate,
        resolve_database_url,
        with_database,
    )
    from foundation.settings import load_settings

    settings = load_settings()
    url = with_database(await resolve_database_url(settings), SCRATCH)
    await ensure_database_exists(with_database(url, "postgres"), SCRATCH)
    await asyncio.to_thread(migrate, url, settings.embedding.resolved_dim)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE usage_counters")
    finally:
        await conn.close()
    return url


async def _store(url: str, requests: int, concurrency: int) -> None:
    from usage_limits.core import LimitPolicy
    from usage_limits.store import PgUsageStore

    store = await PgUsageStore.connect(url, min_size=1, max_size=max(2, concurrency))
    policy = LimitPolicy(
        user_requests_per_minute=10**6, domain_requests_per_minute=10**6, user_tokens=10**9
    )
    subjects = policy.subjects("bench-user", ("bench-domain",), "standard")
    keys = [s.key for s in subjects if s.has_budget]
    try:
        admits, records = [], []
        for _ in range(requests + WARMUP):
            now = datetime.now(UTC)
            admits.append(await _timed(store.admit(subjects, now, "day")))
            records.append(await _timed(store.record(keys, 900, 0.0004, now, "day")))
        print(f"store admit (one at a time):          {_ms(admits[WARMUP:])}")
        print(f"store record (one at a time):         {_ms(records[WARMUP:])}")

        async def one() -> float:
            return await _timed(store.admit(subjects, datetime.now(UTC), "day"))

        contended: list[float] = []
        started = time.perf_counter()
        rounds = max(1, requests // concurrency)
        for _ in range(rounds):
            contended += await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        print(
            f"store admit, {concurrency} at once, one user: {_ms(contended)}; "
            f"{len(contended) / elapsed:.0f} admits/s"
        )
    finally:
        await store.close()


async def _ask(client: Any, headers: dict[str, str]) -> None:
    response = await client.post("/ask", json={"question": "hi"}, headers=headers)
    assert response.status_code == 200, response.text


async def _http(url: str, requests: int) -> None:
    import httpx

    from agent.testing import FunctionModel, text_reply
    from foundation.settings import Settings
    from local_world.claims import encode_claims
    from serve_app.api.app import create_app
    from serve_app.authz import load_authorizer
    from serve_app.wiring import build_local_backend

    authorizer = load_authorizer()
    base: dict[str, Any] = {
        "_env_file": None,
        "database_url": url,
        "llm_base_url": "http://127.0.0.1:9/v1",  # never called: the model is in-process
        "llm_api_key": "unused",
        "answer_model": "local/bench",
        "embedding_backend": "openai",  # never called: the question runs no search
        "embedding_model": "openai/text-embedding-3-small",
        "embedding_dim": 384,
    }
    limited: dict[str, Any] = {
        "rate_limit_user_per_minute": 10**6,
        "rate_limit_domain_per_minute": 10**6,
        "budget_user_tokens": 10**9,
    }
    clients: dict[str, httpx.AsyncClient] = {}
    backends = []
    variants: list[tuple[str, dict[str, Any]]] = [("off", {}), ("on", limited)]
    for name, extra in variants:
        settings = Settings(**{**base, **extra})
        model = FunctionModel(lambda request: text_reply("ok"), model="local/bench")
        backend = build_local_backend(settings, authorizer=authorizer, llm=model)
        backends.append(backend)
        app = create_app(backend, settings, authorizer)  # the backend carries its limits
        transport = httpx.ASGITransport(app=app)
        clients[name] = httpx.AsyncClient(transport=transport, base_url="http://bench")
    caller = encode_claims("bench-user", [("bench-domain", "business_staff")])
    headers = {"x-gateway-claims": caller}
    times: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for _ in range(requests + WARMUP):
            for name, client in clients.items():
                times[name].append(await _timed(_ask(client, headers)))
        off, on = times["off"][WARMUP:], times["on"][WARMUP:]
        print(f"POST /ask, limits off:                {_ms(off)}")
        print(f"POST /ask, limits on:                 {_ms(on)}")
        print(
            f"added by the limits (p50 on - p50 off): "
            f"{statistics.median(on) - statistics.median(off):.2f} ms"
        )
    finally:
        for client in clients.values():
            await client.aclose()
        for backend in backends:
            await backend.close()


async def _main(args: argparse.Namespace) -> None:
    url = await _scratch_url()
    await _store(url, args.requests, args.concurrency)
    if args.http:
        await _http(url, args.requests)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        prog="python -m bench.limits_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-http", dest="http", action="store_false")
    args = parser.parse_args(argv)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
