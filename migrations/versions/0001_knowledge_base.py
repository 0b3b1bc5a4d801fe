"""Knowledge base: documents and chunks with pgvector, full-text and ACL indexes.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

The embedding dimension is fixed here, from ``embedding_dim`` passed by the caller
(EMBEDDING_DIM at migration time). Changing it later needs a new database or a migration.
"""

from __future__ import annotations

from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    dim = int(context.config.attributes["embedding_dim"])
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(
        """
        CREATE TABLE documents (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source        text NOT NULL UNIQUE,
            title         text,
            content_hash  text NOT NULL,
            fingerprint   text NOT NULL,
            permissions   text[] NOT NULL DEFAULT '{}',
            metadata      jsonb NOT NULL DEFAULT '{}'::jsonb,
            chunk_count   integer NOT NULL DEFAULT 0,
            created_at    timestamptz NOT NULL DEFAULT now(),
            updated_at    timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        f"""
        CREATE TABLE chunks (
            id           text PRIMARY KEY,
            document_id  bigint NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            ordinal      integer NOT NULL,
            text         text NOT NULL,
            section      text NOT NULL DEFAULT '',
            kind         text NOT NULL CHECK (kind IN ('prose', 'code', 'table')),
            token_count  integer NOT NULL,
            embedding    vector({dim}) NOT NULL,
            tsv          tsvector GENERATED ALWAYS AS (
                             setweight(to_tsvector('english', section), 'A')
                             || setweight(to_tsvector('english', text), 'B')
                         ) STORED,
            permissions  text[] NOT NULL DEFAULT '{{}}',
            -- What the ACL filter matches: the permissions, or the '*' sentinel for an empty
            -- (public) ACL, so "empty OR overlap" is one GIN-indexable overlap test. Typed
            -- entries always contain ':', so no real entry can equal '*'.
            acl_match    text[] GENERATED ALWAYS AS (
                             CASE WHEN cardinality(permissions) = 0 THEN ARRAY['*']
                                  ELSE permissions END
                         ) STORED,
            metadata     jsonb NOT NULL DEFAULT '{{}}'::jsonb,
            -- also the relation index (document_id first)
            UNIQUE (document_id, ordinal)
        )
        """
    )
    op.execute(
        "CREATE INDEX chunks_embedding_hnsw ON chunks "
        "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
    )
    op.execute("CREATE INDEX chunks_tsv_gin ON chunks USING gin (tsv)")
    op.execute("CREATE INDEX chunks_acl_match_gin ON chunks USING gin (acl_match)")
    op.execute("CREATE INDEX documents_permissions_gin ON documents USING gin (permissions)")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS chunks")
    op.execute("DROP TABLE IF EXISTS documents")
