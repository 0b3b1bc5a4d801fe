"""Who wrote a turn's answer: ``conversation_turns.answered_by`` (``model`` or ``service``,
``AgentAnswer.answered_by``; docs/agent-loop.md says exactly when each).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06

Nullable: a turn stored before this revision did not record it, and reads back as ``null``
(``GET /conversations/{id}``), never guessed. Adding a nullable column without a default
rewrites nothing, so the upgrade is instant on a large table.

``IF NOT EXISTS``: ``agent-service db reset`` re-runs every migration and keeps this table.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE conversation_turns ADD COLUMN IF NOT EXISTS answered_by text "
        "CHECK (answered_by IN ('model', 'service'))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE conversation_turns DROP COLUMN IF EXISTS answered_by")
