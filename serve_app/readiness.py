"""Readiness checks shared by every backend (``/readyz``): the database answers, its schema
is at head with the configured embedding dimension, and a model provider is configured."""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel

from foundation.database import DatabaseError, check_schema
from foundation.settings import Settings
from retrieval.store import PgDocumentStore
from serve_app.knowledge import LazyStore

log = logging.getLogger(__name__)


class ReadinessCheck(BaseModel):
    name: str  # "database", "schema", "embedding_dim", "provider", ...
    ok: bool
    detail: str | None = None


class Readiness(BaseModel):
    ready: bool
    checks: list[ReadinessCheck]


CHECK_TIMEOUT_SECONDS = 3.0


async def store_checks(store: PgDocumentStore, settings: Settings) -> list[ReadinessCheck]:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            async with store.pool.acquire() as conn:
                await conn.fetchval("SELECT 1")
                try:
                    await check_schema(conn, settings.embedding.resolved_dim)
                except DatabaseError as exc:
                    return [
                        ReadinessCheck(name="database", ok=True),
                        ReadinessCheck(name="schema", ok=False, detail=str(exc)),
                    ]
    except (OSError, TimeoutError) as exc:
        detail = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
        return [ReadinessCheck(name="database", ok=False, detail=f"unreachable ({detail})")]
    except Exception as exc:  # asyncpg's errors do not share a base with OSError
        return [ReadinessCheck(name="database", ok=False, detail=type(exc).__name__)]
    return [
        ReadinessCheck(name="database", ok=True),
        ReadinessCheck(
            name="schema", ok=True, detail=f"at head, vector({settings.embedding.resolved_dim})"
        ),
    ]


def provider_check(settings: Settings) -> ReadinessCheck:
    if settings.llm.api_key is not None or settings.llm.is_local:
        return ReadinessCheck(name="provider", ok=True, detail=settings.llm.base_url)
    return ReadinessCheck(
        name="provider", ok=False, detail="no OPENROUTER_API_KEY (or alias) for a remote provider"
    )


async def lazy_store_checks(store: LazyStore, settings: Settings) -> list[ReadinessCheck]:
    """Open the store if it is not yet (a replica starts and reports "database down" rather
    than crash-looping), then ``store_checks``."""
    if store.opened is None:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                await store.get()
        except DatabaseError as exc:  # reachable, but the schema or dimension is wrong
            return [
                ReadinessCheck(name="database", ok=True),
                ReadinessCheck(name="schema", ok=False, detail=str(exc)),
            ]
        except Exception as exc:
            log.warning(
                "readiness: database unavailable: %s",
                (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__),
            )
            detail = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            return [
                ReadinessCheck(name="database", ok=False, detail=f"unreachable ({detail})"),
                ReadinessCheck(name="schema", ok=False, detail="database unreachable"),
            ]
    opened = store.opened
    assert opened is not None
    checks = await store_checks(opened, settings)
    if not any(check.name == "schema" for check in checks):
        checks.append(ReadinessCheck(name="schema", ok=False, detail="database unreachable"))
    return checks
