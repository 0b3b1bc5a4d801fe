"""The ``DocumentStore`` port and its PostgreSQL + pgvector adapter.

Writes: whole documents (rows + all their chunks, one COPY) per transaction, each replacing
the previous version of the same source in that transaction, so a reader never sees half a
document and a crash leaves no half-written one.

Reads: one statement runs both searches, each filtered by the caller's ACL in SQL (never
after): pgvector cosine over HNSW with iterative scans (so a restrictive ACL still yields k
rows) and ``websearch_to_tsquery`` full-text over the GIN index. It returns each candidate's
rank in each list; fusion (RRF) happens in Python (``retrieval.fusion``).

``visible_chunk_ids`` answers "which of these chunks may this caller see now" with the same
ACL predicate (``ACL_PREDICATE`` over ``held_entries``): a chunk that is gone (its document
deleted, or re-ingested with other text, so another id) is not among them either. A
conversation's stored citations are re-checked with it when the thread is read.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

from foundation.database import check_schema

WriteOutcome = Literal["new", "replaced"]


@dataclass(frozen=True)
class ChunkRecord:
    id: str
    ordinal: int
    text: str
    section: str
    kind: str
    token_count: int
    embedding: np.ndarray[Any, np.dtype[np.float32]]
    metadata: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class DocumentRecord:
    source: str
    title: str | None
    content_hash: str
    fingerprint: str
    permissions: list[str]
    chunks: list[ChunkRecord]
    metadata: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """A chunk found by at least one side of the hybrid search."""

    chunk_id: str
    source: str
    title: str | None
    section: str
    kind: str
    text: str
    vector_rank: int | None
    keyword_rank: int | None
    distance: float | None


@dataclass(frozen=True)
class StoredDocument:
    source: str
    fingerprint: str
    permissions: list[str]
    chunk_count: int


class DocumentStore(Protocol):
    async def documents(self) -> dict[str, StoredDocument]: ...

    async def write_document(self, doc: DocumentRecord) -> WriteOutcome: ...

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]: ...

    async def delete_sources(self, sources: Iterable[str]) -> int: ...

    async def hybrid_candidates(
        self,
        query_text: str,
        query_vector: np.ndarray[Any, np.dtype[np.float32]],
        acl: Sequence[str],
        *,
        k_vector: int,
        k_keyword: int,
    ) -> list[Candidate]: ...

    async def visible_chunk_ids(self, chunk_ids: Iterable[str], acl: Sequence[str]) -> set[str]:
        """Those of ``chunk_ids`` that exist and that a caller holding ``acl`` may see."""
        ...

    async def counts(self) -> tuple[int, int]: ...

    async def close(self) -> None: ...


@runtime_checkable
class VectorIndexOwner(Protocol):
    """A store whose vector index an ingestion run may drop and build again: pgvector builds
    an HNSW graph over the whole table several times faster than it inserts the same vectors
    one by one (10,000 vectors here: ~4 s of CPU against ~21 s). While it is missing, vector
    search is exact (a scan): the same answers, slower."""

    async def drop_vector_index(self) -> None: ...

    async def build_vector_index(self) -> bool: ...


# The HNSW index as migration 0001 creates it (the migration keeps its own copy: migrations
# never change once released).
VECTOR_INDEX = "chunks_embedding_hnsw"
VECTOR_INDEX_EXISTS_SQL = "SELECT to_regclass($1) IS NOT NULL"  # $1: VECTOR_INDEX
VECTOR_INDEX_SQL = (
    f"CREATE INDEX IF NOT EXISTS {VECTOR_INDEX} ON chunks "
    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
)

LOCK_SOURCES_SQL = """
SELECT pg_advisory_xact_lock(l.h)
FROM (SELECT DISTINCT hashtext(s) AS h FROM unnest($1::text[]) AS s ORDER BY 1) AS l
"""
INSERT_DOCUMENTS_SQL = """
INSERT INTO documents
    (source, title, content_hash, fingerprint, permissions, metadata, chunk_count)
SELECT source, title, content_hash, fingerprint, permissions, metadata, chunk_count
FROM jsonb_to_recordset($1::jsonb) AS d(source text, title text, content_hash text,
    fingerprint text, permissions text[], metadata jsonb, chunk_count int)
RETURNING id, source
"""
CHUNK_COLUMNS = [
    "id",
    "document_id",
    "ordinal",
    "text",
    "section",
    "kind",
    "token_count",
    "embedding",
    "permissions",
    "metadata",
]


def _document_rows(docs: Sequence[DocumentRecord]) -> str:
    """The documents' rows as the JSON array ``INSERT_DOCUMENTS_SQL`` reads."""
    return json.dumps(
        [
            {
                "source": doc.source,
                "title": doc.title,
                "content_hash": doc.content_hash,
                "fingerprint": doc.fingerprint,
                "permissions": doc.permissions,
                "metadata": doc.metadata,
                "chunk_count": len(doc.chunks),
            }
            for doc in docs
        ]
    )


# $2 is the caller's entries plus PUBLIC_ACL_SENTINEL (see the migration's acl_match column):
# held_entries. The one ACL rule of every read (the search and visible_chunk_ids).
ACL_PREDICATE = "c.acl_match && $2::text[]"
PUBLIC_ACL_SENTINEL = "*"


def held_entries(acl: Sequence[str]) -> list[str]:
    """What ``ACL_PREDICATE``'s ``$2`` holds for a caller of ``acl``: its entries and the
    public sentinel. PostgreSQL text cannot hold U+0000 (the statement would fail): an entry
    holding one can match no stored ACL, so it is dropped."""
    return [PUBLIC_ACL_SENTINEL, *(entry for entry in acl if "\x00" not in entry)]


VISIBLE_CHUNKS_SQL = f"SELECT c.id FROM chunks c WHERE c.id = ANY($1::text[]) AND {ACL_PREDICATE}"
# A query word in more chunks than this does not select keyword candidates by itself (it
# still counts in the rank): bounds the keyword side's work (bench/search.py, real text).
DEFAULT_KEYWORD_COMMON_ROWS = 300  # tuned on data: bench/RESULTS.md, issue 16 item 4

# Words found in more than $1 chunks, from the planner's statistics of chunks.tsv (kept by
# ANALYZE and autovacuum; none on a small or never-analyzed table).
COMMON_WORDS_SQL = """
SELECT e.lexeme
FROM pg_stats s
CROSS JOIN LATERAL unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs)
    AS e(lexeme, freq)
WHERE s.schemaname = current_schema() AND s.tablename = 'chunks' AND s.attname = 'tsv'
  AND e.lexeme IS NOT NULL
  AND e.freq * (SELECT greatest(r.reltuples, 0) FROM pg_class r
                WHERE r.oid = 'chunks'::regclass) > $1::int
ORDER BY e.lexeme
"""
# How long a store trusts its list of common words before reading the statistics again.
COMMON_WORDS_TTL_S = 300.0

# How the keyword side orders its matches (KEYWORD_RANKING): one of two fixed SQL functions,
# chosen by name from this table, never formatted from a caller's text. ts_rank_cd is cover
# density (the matched words close together); ts_rank counts how often they occur. Both
# with normalization 32 (rank / (rank + 1)); neither has IDF.
KeywordRanking = Literal["ts_rank_cd", "ts_rank"]
DEFAULT_KEYWORD_RANKING: KeywordRanking = "ts_rank"  # tuned: issue 16 item 4
TS_RANK_CD = "ts_rank_cd(c.tsv, q.rank_q, 32)"
TS_RANK = "ts_rank(c.tsv, q.rank_q, 32)"
# Each ranking's (rank, tie-break): ties go to the other function.
KEYWORD_RANK_FUNCTIONS: dict[str, tuple[str, str]] = {
    "ts_rank_cd": (TS_RANK_CD, TS_RANK),
    "ts_rank": (TS_RANK, TS_RANK_CD),
}

HYBRID_SQL_TEMPLATE = f"""
WITH vec AS MATERIALIZED (
    SELECT c.id, c.embedding <=> $1 AS distance
    FROM chunks c
    WHERE {ACL_PREDICATE}
    ORDER BY c.embedding <=> $1
    LIMIT $3
), vec_ranked AS (
    SELECT id, distance, row_number() OVER (ORDER BY distance, id) AS rank FROM vec
), parsed AS (
    SELECT t, strpos(t, '!') > 0 AS negated, words
    FROM (SELECT websearch_to_tsquery('english', $4)::text AS t,
                 tsvector_to_array(to_tsvector('english', $4)) AS words) AS w
), split AS (
    SELECT t, negated,
           -- Questions are sentences: rank by ANY of their words (with the function of
           -- KEYWORD_RANKING: the kw step below). Quoted phrases keep their <->
           -- operators; a query with a negation (-word) keeps websearch's AND semantics.
           CASE WHEN negated THEN t::tsquery ELSE replace(t, ' & ', ' | ')::tsquery END AS any_q,
           -- $6: the corpus's common words (PgDocumentStore.common_words)
           ARRAY(SELECT x FROM unnest(words) AS x WHERE x = ANY($6::text[])) AS common_words,
           ARRAY(SELECT x FROM unnest(words) AS x WHERE NOT x = ANY($6::text[])) AS rare_words
    FROM parsed
), kwq AS MATERIALIZED (
    -- Which chunks get ranked: common words do not select chunks on their own (ranking
    -- every chunk that has one is what made keyword search slow on large corpora, and they
    -- say little), but they still count in the rank. If every word is common, all must match.
    SELECT any_q AS rank_q,
           CASE WHEN negated OR cardinality(common_words) = 0 THEN any_q
                WHEN cardinality(rare_words) > 0 THEN
                    (SELECT string_agg(quote_literal(x), ' | ') FROM unnest(rare_words) AS x)
                        ::tsquery
                ELSE t::tsquery END AS select_q
    FROM split
), kw AS MATERIALIZED (
    -- Ties on the ranking (ts_rank saturates: every chunk under a heading that holds the
    -- word scores the same) go to the other function, then to the id, never to the order
    -- rows happen to be stored in.
    SELECT c.id, {{rank}} AS score, {{tie}} AS tie
    FROM chunks c, kwq q
    WHERE c.tsv @@ q.select_q AND {ACL_PREDICATE}
    ORDER BY score DESC, tie DESC, c.id
    LIMIT $5
), kw_ranked AS (
    SELECT id, row_number() OVER (ORDER BY score DESC, tie DESC, id) AS rank FROM kw
)
SELECT c.id, d.source, d.title, c.section, c.kind, c.text,
       v.rank AS vector_rank, k.rank AS keyword_rank, v.distance
FROM vec_ranked v
FULL OUTER JOIN kw_ranked k ON k.id = v.id
JOIN chunks c ON c.id = coalesce(v.id, k.id)
JOIN documents d ON d.id = c.document_id
"""
# The hybrid statement for each keyword ranking (both fixed strings, built at import).
HYBRID_SQL_BY_RANKING: dict[str, str] = {
    name: HYBRID_SQL_TEMPLATE.replace("{rank}", rank).replace("{tie}", tie)
    for name, (rank, tie) in KEYWORD_RANK_FUNCTIONS.items()
}
HYBRID_SQL = HYBRID_SQL_BY_RANKING[DEFAULT_KEYWORD_RANKING]


def session_settings(ef_search: int) -> dict[str, str]:
    """Per-connection planner settings for the hybrid statement, sent as startup parameters:
    asyncpg's pool runs ``RESET ALL`` when a connection is released, which would undo a
    ``SET`` issued once at connect time, but it resets to these.

    Iterative scans keep HNSW returning rows after the ACL filter drops some. Custom plans,
    because a generic plan guesses the ACL's selectivity: a selective ACL is best served by a
    bitmap scan on the acl_match GIN plus an exact sort, a broad one by HNSW. SSD page costs,
    because with the default (4.0) the planner prefers an exact scan over HNSW on tables of
    ~10k rows (28 ms vs 3 ms measured; bench/search.py)."""
    return {
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.ef_search": str(int(ef_search)),
        "plan_cache_mode": "force_custom_plan",
        "random_page_cost": "1.1",
    }


_DASH_RUN = re.compile(r"-{2,}")
_LONE_DASH = re.compile(r"-(?!\w)")


def keyword_query_text(text: str) -> str:
    """``text`` as ``websearch_to_tsquery`` may parse it: a run of dashes, or dashes that
    negate nothing ("- - -", a Markdown rule), nest its NOT operators until PostgreSQL fails
    with "tsquery stack too small" (from about 100). A single dash before a word still
    negates it; "CV-E1033" and "plug-in" are untouched."""
    return _LONE_DASH.sub(" ", _DASH_RUN.sub("-", text))


@dataclass(frozen=True)
class StoreConfig:
    """How the knowledge base is opened (``PgDocumentStore.open``): the schema's vector
    dimension (EMBEDDING_DIM, checked), the pool (DB_POOL_*), pgvector's ``hnsw.ef_search``
    (HNSW_EF_SEARCH) and the keyword side (KEYWORD_COMMON_ROWS, KEYWORD_RANKING)."""

    embedding_dim: int
    min_size: int = 1
    max_size: int = 10
    ef_search: int = 200
    keyword_common_rows: int = DEFAULT_KEYWORD_COMMON_ROWS
    keyword_ranking: KeywordRanking = DEFAULT_KEYWORD_RANKING


class PgDocumentStore:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        keyword_common_rows: int = DEFAULT_KEYWORD_COMMON_ROWS,
        keyword_ranking: KeywordRanking = DEFAULT_KEYWORD_RANKING,
    ) -> None:
        if keyword_ranking not in HYBRID_SQL_BY_RANKING:
            raise ValueError(
                f"keyword_ranking: {keyword_ranking!r} is not one of "
                f"{sorted(HYBRID_SQL_BY_RANKING)}"
            )
        self._pool = pool
        self._keyword_common_rows = keyword_common_rows
        self._keyword_ranking = keyword_ranking
        self._common_words: list[str] = []
        self._common_words_read_at = -COMMON_WORDS_TTL_S  # monotonic seconds

    async def common_words(self, *, refresh: bool = False) -> list[str]:
        """Query words too common to select keyword candidates on their own: found in more
        than ``keyword_common_rows`` chunks. Read from the statistics at most every
        ``COMMON_WORDS_TTL_S`` (one extra statement then), so a search stays one statement."""
        if self._keyword_common_rows <= 0:
            return []
        now = time.monotonic()
        if refresh or now - self._common_words_read_at >= COMMON_WORDS_TTL_S:
            rows = await self._pool.fetch(COMMON_WORDS_SQL, self._keyword_common_rows)
            self._common_words = [r["lexeme"] for r in rows]
            self._common_words_read_at = now
        return self._common_words

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        embedding_dim: int,
        min_size: int = 1,
        max_size: int = 10,
        ef_search: int = 200,
        keyword_common_rows: int = DEFAULT_KEYWORD_COMMON_ROWS,
        keyword_ranking: KeywordRanking = DEFAULT_KEYWORD_RANKING,
    ) -> PgDocumentStore:
        """Open a pool, refusing a store whose schema or dimension does not match."""
        conn = await asyncpg.connect(url)
        try:
            await check_schema(conn, embedding_dim)
        finally:
            await conn.close()

        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            init=register_vector,
            server_settings=session_settings(ef_search),
        )
        assert pool is not None
        store = cls(pool, keyword_common_rows=keyword_common_rows, keyword_ranking=keyword_ranking)
        await store.common_words()
        return store

    @classmethod
    async def open(cls, url: str, config: StoreConfig) -> PgDocumentStore:
        """``connect`` as ``config`` says."""
        return await cls.connect(
            url,
            embedding_dim=config.embedding_dim,
            min_size=config.min_size,
            max_size=config.max_size,
            ef_search=config.ef_search,
            keyword_common_rows=config.keyword_common_rows,
            keyword_ranking=config.keyword_ranking,
        )

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    async def close(self) -> None:
        await self._pool.close()

    async def documents(self) -> dict[str, StoredDocument]:
        rows = await self._pool.fetch(
            "SELECT source, fingerprint, permissions, chunk_count FROM documents"
        )
        return {
            r["source"]: StoredDocument(
                r["source"], r["fingerprint"], list(r["permissions"]), r["chunk_count"]
            )
            for r in rows
        }

    async def write_document(self, doc: DocumentRecord) -> WriteOutcome:
        return (await self.write_documents([doc]))[0]

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]:
        """Whole documents in one transaction (one commit, one COPY of all their chunks),
        each replacing its source's previous version: all are written or none. The same
        round trips as one document, so an ingestion of many small pages pays one commit per
        batch instead of one per page."""
        if not docs:
            return []
        sources = [doc.source for doc in docs]
        if len(set(sources)) != len(sources):
            raise ValueError("a batch of documents holds each source at most once")
        async with self._pool.acquire() as conn, conn.transaction():
            # Serialise writers of the same sources (two ingestion runs at once), always in
            # the same order, so two batches cannot wait for each other.
            await conn.execute(LOCK_SOURCES_SQL, sources)
            deleted = await conn.fetch(
                "DELETE FROM documents WHERE source = ANY($1::text[]) RETURNING source", sources
            )
            ids = {
                row["source"]: row["id"]
                for row in await conn.fetch(INSERT_DOCUMENTS_SQL, _document_rows(docs))
            }
            records = [
                (
                    ch.id,
                    ids[doc.source],
                    ch.ordinal,
                    ch.text,
                    ch.section,
                    ch.kind,
                    ch.token_count,
                    ch.embedding,
                    doc.permissions,
                    json.dumps(ch.metadata),
                )
                for doc in docs
                for ch in doc.chunks
            ]
            if records:
                await conn.copy_records_to_table("chunks", records=records, columns=CHUNK_COLUMNS)
        replaced = {row["source"] for row in deleted}
        return ["replaced" if source in replaced else "new" for source in sources]

    async def delete_sources(self, sources: Iterable[str]) -> int:
        names = sorted(set(sources))
        if not names:
            return 0
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "DELETE FROM documents WHERE source = ANY($1::text[]) RETURNING id", names
            )
        return len(rows)

    async def hybrid_candidates(
        self,
        query_text: str,
        query_vector: np.ndarray[Any, np.dtype[np.float32]],
        acl: Sequence[str],
        *,
        k_vector: int,
        k_keyword: int,
    ) -> list[Candidate]:
        held = held_entries(acl)
        # PostgreSQL text cannot hold U+0000: in the query it separates words.
        query_text = keyword_query_text(query_text.replace("\x00", " "))
        rows = await self._pool.fetch(
            HYBRID_SQL_BY_RANKING[self._keyword_ranking],
            query_vector,
            held,
            k_vector,
            query_text,
            k_keyword,
            await self.common_words(),
        )
        return [
            Candidate(
                chunk_id=r["id"],
                source=r["source"],
                title=r["title"],
                section=r["section"],
                kind=r["kind"],
                text=r["text"],
                vector_rank=r["vector_rank"],
                keyword_rank=r["keyword_rank"],
                distance=None if r["distance"] is None else float(r["distance"]),
            )
            for r in rows
        ]

    async def visible_chunk_ids(self, chunk_ids: Iterable[str], acl: Sequence[str]) -> set[str]:
        ids = sorted({i for i in chunk_ids if "\x00" not in i})  # no stored id holds U+0000
        if not ids:
            return set()
        rows = await self._pool.fetch(VISIBLE_CHUNKS_SQL, ids, held_entries(acl))
        return {r["id"] for r in rows}

    async def counts(self) -> tuple[int, int]:
        row = await self._pool.fetchrow(
            "SELECT (SELECT count(*) FROM documents) AS d, (SELECT count(*) FROM chunks) AS c"
        )
        assert row is not None
        return int(row["d"]), int(row["c"])

    async def drop_vector_index(self) -> None:
        """Drop the HNSW index for a bulk load (:class:`VectorIndexOwner`)."""
        await self._pool.execute(f"DROP INDEX IF EXISTS {VECTOR_INDEX}")

    async def build_vector_index(self) -> bool:
        """Build the HNSW index if it is missing; True when this call built it. When it is
        there (nearly always) this is one statement; one builder at a time (an advisory lock):
        a second caller waits, then finds it there."""
        if await self._pool.fetchval(VECTOR_INDEX_EXISTS_SQL, VECTOR_INDEX):
            return False
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", VECTOR_INDEX)
            if await conn.fetchval(VECTOR_INDEX_EXISTS_SQL, VECTOR_INDEX):
                return False
            # The graph is built in memory when it fits (far faster than spilling to disk).
            await conn.execute("SET LOCAL maintenance_work_mem = '512MB'")
            await conn.execute(VECTOR_INDEX_SQL)
        return True
