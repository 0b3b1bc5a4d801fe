"""Alembic environment: the URL and the embedding dimension come from the caller
(``foundation.database.migrate``) through ``config.attributes``, never from a file."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

config = context.config


def run_migrations_online() -> None:
    url = config.attributes.get("sqlalchemy_url")
    if not url:
        raise RuntimeError("run migrations through `agent-service db up`, which passes the URL")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
