"""Usage limits: per-subject counters of the rate limits and budgets (``usage_limits.store``).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04

One row per subject (``user:<sub>``, ``domain:<name>``) and fixed UTC window: ``requests``
in ``minute`` windows, ``tokens`` and ``cost_usd`` in the budget period's (``hour``, ``day``,
``week``, ``month``). Every replica updates the same rows with one
``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``, so a limit holds across replicas.

``IF NOT EXISTS``: ``agent-service db reset`` re-runs every migration and keeps this table.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS usage_counters (
            subject       text NOT NULL,
            window_kind   text NOT NULL
                          CHECK (window_kind IN ('minute', 'hour', 'day', 'week', 'month')),
            window_start  timestamptz NOT NULL,
            requests      bigint NOT NULL DEFAULT 0 CHECK (requests >= 0),
            tokens        bigint NOT NULL DEFAULT 0 CHECK (tokens >= 0),
            cost_usd      double precision NOT NULL DEFAULT 0 CHECK (cost_usd >= 0),
            PRIMARY KEY (subject, window_kind, window_start)
        )
        """
    )
    # The prune of old minute rows (limits.store.PgUsageStore).
    op.execute(
        "CREATE INDEX IF NOT EXISTS usage_counters_window "
        "ON usage_counters (window_kind, window_start)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS usage_counters")
