"""Feedback on turns: a thumbs up or down, with an optional comment and expected answer
(``conversations.feedback``, ``POST /feedback``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

One row per turn (``PRIMARY KEY (conversation_id, turn)``): rating a turn again replaces
its feedback (``updated_at`` moves, ``created_at`` stays); no history is kept. The row goes
with its turn (``ON DELETE CASCADE`` from ``conversation_turns``, which goes with its
conversation), so deleting or pruning a conversation deletes its feedback too.

The rater is the turn's owner; ``rater_roles`` and ``rater_domains`` are their roles and
domains when they rated it (a turn keeps only its owner's ``sub``), so that
``agent-service eval export-feedback`` can say who to ask a golden row as.

``conversation_turns_trace``: ``POST /feedback`` by ``trace_id`` finds the caller's turn by
its trace id.

``IF NOT EXISTS``: ``agent-service db reset`` re-runs every migration and keeps this table.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS turn_feedback (
            conversation_id  uuid NOT NULL,
            turn             integer NOT NULL,
            rating           text NOT NULL CHECK (rating IN ('up', 'down')),
            comment          text,
            expected_answer  text,
            rater_sub        text NOT NULL,
            rater_roles      text[] NOT NULL DEFAULT '{}',
            rater_domains    text[] NOT NULL DEFAULT '{}',
            created_at       timestamptz NOT NULL DEFAULT now(),
            updated_at       timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (conversation_id, turn),
            FOREIGN KEY (conversation_id, turn)
                REFERENCES conversation_turns (conversation_id, turn) ON DELETE CASCADE
        )
        """
    )
    # The export reads the newest feedback first, optionally since a time.
    op.execute("CREATE INDEX IF NOT EXISTS turn_feedback_recent ON turn_feedback (updated_at DESC)")
    op.execute(
        "CREATE INDEX IF NOT EXISTS conversation_turns_trace "
        "ON conversation_turns (trace_id) WHERE trace_id IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS conversation_turns_trace")
    op.execute("DROP TABLE IF EXISTS turn_feedback")
