"""``agent-service db``: the embedded PostgreSQL, migrations, schema status, reset."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any, TextIO

from foundation.settings import Settings
from serve_app.cli.common import EXIT_OK, CliError


async def db_up(settings: Settings) -> dict[str, Any]:
    from foundation.database import head_revision, migrate, redact, resolve_database_url

    url = await resolve_database_url(settings)
    migrate(url, settings.embedding.resolved_dim)
    await _mend_vector_index(settings, url)
    return {
        "database": redact(url),
        "embedded": settings.database.url is None,
        "revision": head_revision(),
        "embedding_dim": settings.embedding.resolved_dim,
    }


async def _mend_vector_index(settings: Settings, url: str) -> None:
    """An ingestion run killed during a bulk load leaves the HNSW index dropped
    (INGEST_DEFER_VECTOR_INDEX); searches stay right but scan. ``db up`` builds it again."""
    from serve_app.knowledge import connect_store
    from serve_app.wiring import store_config

    store = await connect_store(store_config(settings), url)
    try:
        await store.build_vector_index()
    finally:
        await store.close()


async def db_status(settings: Settings) -> dict[str, Any]:
    import asyncpg

    from foundation.database import head_revision, redact, resolve_database_url, schema_state

    url = await resolve_database_url(settings)
    conn = await asyncpg.connect(url)
    try:
        revision, dim = await schema_state(conn)
        docs = chunks = None
        if revision is not None:
            docs = await conn.fetchval("SELECT count(*) FROM documents")
            chunks = await conn.fetchval("SELECT count(*) FROM chunks")
    finally:
        await conn.close()
    return {
        "database": redact(url),
        "embedded": settings.database.url is None,
        "revision": revision,
        "head": head_revision(),
        "column_dim": dim,
        "embedding_dim": settings.embedding.resolved_dim,
        "documents": docs,
        "chunks": chunks,
    }


async def db_reset(settings: Settings) -> dict[str, Any]:
    import asyncpg

    from foundation.database import migrate, redact, resolve_database_url

    url = await resolve_database_url(settings)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "DROP TABLE IF EXISTS chunks; DROP TABLE IF EXISTS documents; "
            "DROP TABLE IF EXISTS alembic_version"
        )
    finally:
        await conn.close()
    migrate(url, settings.embedding.resolved_dim)
    return {
        "database": redact(url),
        "reset": True,
        "embedding_dim": settings.embedding.resolved_dim,
    }


def cmd_db(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    if args.action == "down":
        from foundation.database import stop_embedded

        if settings.database.url:
            raise CliError("DATABASE_URL is set: `db down` only stops the embedded server")
        stopped = stop_embedded(settings.home)
        print(
            "embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL not running",
            file=out,
        )
        return EXIT_OK
    if args.action == "reset" and not args.yes:
        raise CliError("`db reset` deletes every document and chunk; add --yes to confirm")
    action = {"up": db_up, "status": db_status, "reset": db_reset}[args.action]
    result = asyncio.run(action(settings))
    print(json.dumps(result, indent=2), file=out)
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """The ``db`` command."""
    db = sub.add_parser(
        "db",
        help="manage the database: start the embedded PostgreSQL and migrate ('up'), "
        "show schema and counts ('status'), stop the embedded server ('down'), "
        "drop and recreate the tables ('reset')",
        description="With DATABASE_URL unset, 'up' starts an embedded PostgreSQL 18 + pgvector "
        "under $AGENT_SERVICE_HOME/pgdata (reusing a running one) and migrates it to head. "
        "With DATABASE_URL set, it migrates that server.",
    )
    db.add_argument("action", choices=["up", "status", "down", "reset"])
    db.add_argument("--yes", action="store_true", help="confirm 'reset'")
    db.set_defaults(handler=cmd_db)
