"""Conversations: threads of turns, each owned by one user (the caller's ``sub``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04

A conversation row carries its turn count, so appending a turn locks that one row, checks
the owner and the limit, and writes the turn in one transaction (``conversations.store``).
Turns keep what the caller was answered: the question, the answer, the citations (each by
its chunk id, with the source, section and snippet shown), the tool trace (calls, not their
results), the decision, usage, cost, model and trace id.

``IF NOT EXISTS``: ``agent-service db reset`` drops the knowledge base (a new embedding
dimension) and re-runs every migration; the users' conversations are kept.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS conversations (
            id          uuid PRIMARY KEY,
            owner_sub   text NOT NULL,
            title       text NOT NULL,
            turn_count  integer NOT NULL CHECK (turn_count >= 0),
            created_at  timestamptz NOT NULL DEFAULT now(),
            updated_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # The caller's own, most recently active first (GET /conversations, keyset pages).
    op.execute(
        "CREATE INDEX IF NOT EXISTS conversations_owner_recent "
        "ON conversations (owner_sub, updated_at DESC, id DESC)"
    )
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS conversation_turns (
            conversation_id  uuid NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            turn             integer NOT NULL CHECK (turn >= 1),
            question         text NOT NULL,
            answer           text NOT NULL,
            decision         text NOT NULL,
            idk              boolean NOT NULL,
            citations        jsonb NOT NULL DEFAULT '[]'::jsonb,
            tool_calls       jsonb NOT NULL DEFAULT '[]'::jsonb,
            usage            jsonb NOT NULL DEFAULT '{}'::jsonb,
            cost             jsonb NOT NULL DEFAULT '{}'::jsonb,
            model            text NOT NULL,
            trace_id         text,
            created_at       timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (conversation_id, turn)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS conversation_turns")
    op.execute("DROP TABLE IF EXISTS conversations")
