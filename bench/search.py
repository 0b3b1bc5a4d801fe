"""Hybrid search latency and vector recall at 10k, 100k and 300k chunks, by ACL selectivity.

    python -m bench.search [--sizes 10000,100000] [--queries 200] [--corpus synthetic|text]

Builds a corpus in its own database on the configured server (embedded by default), loaded
with COPY, then the production HNSW/GIN indexes. ``--corpus synthetic``: clustered unit
vectors (384 dims, like MiniLM's) and Zipf-distributed generated words, any size in seconds.
``--corpus text``: docstring paragraphs of the installed packages, embedded by the configured
embedder (cached), queried with held-out docstrings' first sentences (bench.text_corpus).
For each caller shape (all rows visible, a 5%-selective ACL, a 0.5%-selective one) it times
the production hybrid statement (``PgDocumentStore.hybrid_candidates``) and measures recall@10
of its vector side against exact search (numpy over the visible rows). The same run times an
exact-scan variant of the statement (no ANN index: the design of Anyscale's reference RAG
app) and the keyword side without the common-word bound (``KEYWORD_COMMON_ROWS=0``), with the
share of that unbounded keyword top 10 the bound keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
import numpy.typing as npt
from pgvector.asyncpg import register_vector

from foundation.database import (
    ensure_database_exists,
    migrate,
    resolve_database_url,
    with_database,
)
from foundation.settings import load_settings
from retrieval.store import (
    CHUNK_COLUMNS,
    DEFAULT_KEYWORD_COMMON_ROWS,
    HYBRID_SQL,
    PgDocumentStore,
)

DIM = 384
KEYWORD_COMMON_ROWS = int(os.environ.get("KEYWORD_COMMON_ROWS", DEFAULT_KEYWORD_COMMON_ROWS))
# A Zipf-distributed vocabulary, as in real text: the most frequent ranks are the English stop
# words of PostgreSQL's english.stop (the 'english' configuration drops them, as it would in
# real documents and queries); the rest are content words, a few common and most rare.
STOP_WORDS = [
    "i",
    "me",
    "my",
    "myself",
    "we",
    "our",
    "ours",
    "ourselves",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
    "he",
    "him",
    "his",
    "himself",
    "she",
    "her",
    "hers",
    "herself",
    "it",
    "its",
    "itself",
    "they",
    "them",
    "their",
    "theirs",
    "themselves",
    "what",
    "which",
    "who",
    "whom",
    "this",
    "that",
    "these",
    "those",
    "am",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "have",
    "has",
    "had",
    "having",
    "do",
    "does",
    "did",
    "doing",
    "a",
    "an",
    "the",
    "and",
    "but",
    "if",
    "or",
    "because",
    "as",
    "until",
    "while",
    "of",
    "at",
    "by",
    "for",
    "with",
    "about",
    "against",
    "between",
    "into",
    "through",
    "during",
    "before",
    "after",
    "above",
    "below",
    "to",
    "from",
    "up",
    "down",
    "in",
    "out",
    "on",
    "off",
    "over",
    "under",
    "again",
    "further",
    "then",
    "once",
    "here",
    "there",
    "when",
    "where",
    "why",
    "how",
    "all",
    "any",
    "both",
    "each",
    "few",
    "more",
    "most",
    "other",
    "some",
    "such",
    "no",
    "nor",
    "not",
    "only",
    "own",
    "same",
    "so",
    "than",
    "too",
    "very",
    "s",
]
VOCAB = STOP_WORDS + [f"w{i}x" for i in range(20_000 - len(STOP_WORDS))]
ZIPF = 1.0 / np.arange(1, len(VOCAB) + 1) ** 1.1
ZIPF /= ZIPF.sum()

CALLERS = {
    "all visible": ["domain:common", "domain:five", "domain:rare"],
    "5% ACL": ["domain:five"],
    "0.5% ACL": ["domain:rare"],
}


@dataclass
class Corpus:
    vectors: npt.NDArray[np.float32]
    acl: list[str]
    # Real text and its queries (``--corpus text``); None: Zipf words and perturbed vectors.
    texts: list[str] | None = None
    query_texts: list[str] | None = None
    query_vectors: npt.NDArray[np.float32] | None = None


def chunk_id(i: int) -> str:
    """The id ``load`` gives the corpus's ``i``-th chunk."""
    return f"c{i:07d}"


def draw_acl(n: int, rng: np.random.Generator) -> list[str]:
    u = rng.random(n)
    return [
        "domain:rare" if x < 0.005 else "domain:five" if x < 0.055 else "domain:common" for x in u
    ]


def text_corpus(n: int, queries: int, rng: np.random.Generator) -> Corpus:
    """Docstring paragraphs embedded by the configured embedder (bench.text_corpus)."""
    from bench.text_corpus import build_texts, embed_cached
    from retrieval.embedders import build_embedder
    from serve_app.wiring import embedder_config

    settings = load_settings()
    cache = settings.agent_service_home / "bench-cache"
    # Reading every docstring takes ~2.5 min; the chosen texts are cached with the vectors.
    listing = cache / f"texts-{n}-{queries}-{sys.version_info[0]}.{sys.version_info[1]}.json"
    if listing.exists():
        texts, query_texts = json.loads(listing.read_text())
    else:
        texts, query_texts = build_texts(n, queries, seed=20261130)
        cache.mkdir(parents=True, exist_ok=True)
        listing.write_text(json.dumps([texts, query_texts]))
    embedder = build_embedder(embedder_config(settings))
    vectors = embed_cached(texts, embedder, cache, "chunks")
    query_vectors = embed_cached(query_texts, embedder, cache, "queries")
    return Corpus(vectors, draw_acl(n, rng), texts, query_texts, query_vectors)


def make_corpus(n: int, rng: np.random.Generator) -> Corpus:
    centroids = rng.normal(size=(max(8, n // 500), DIM)).astype(np.float32)
    labels = rng.integers(0, len(centroids), size=n)
    vecs = centroids[labels] + 0.6 * rng.normal(size=(n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return Corpus(vecs.astype(np.float32), draw_acl(n, rng))


async def load(url: str, corpus: Corpus, rng: np.random.Generator) -> None:
    conn = await asyncpg.connect(url)
    await register_vector(conn)
    try:
        await conn.execute("DROP INDEX IF EXISTS chunks_embedding_hnsw")
        n = len(corpus.acl)
        per_doc = 100
        docs = [
            (f"synthetic/{d}.md", f"h{d}", f"f{d}", per_doc)
            for d in range((n + per_doc - 1) // per_doc)
        ]
        await conn.copy_records_to_table(
            "documents",
            records=docs,
            columns=["source", "content_hash", "fingerprint", "chunk_count"],
        )
        ids = await conn.fetch("SELECT id FROM documents ORDER BY id")
        doc_ids = [r["id"] for r in ids]
        words = np.array(VOCAB)
        records = []
        for i in range(n):
            if corpus.texts is not None:
                text = corpus.texts[i].replace("\x00", " ")  # PostgreSQL text holds no NUL
            else:
                text = " ".join(words[rng.choice(len(words), size=40, p=ZIPF)])
            records.append(
                (
                    chunk_id(i),
                    doc_ids[i // per_doc],
                    i % per_doc,
                    text,
                    "",
                    "prose",
                    40,
                    corpus.vectors[i],
                    [corpus.acl[i]],
                    "{}",  # metadata: the column's default
                )
            )
        await conn.copy_records_to_table("chunks", records=records, columns=CHUNK_COLUMNS)
        await conn.execute("SET maintenance_work_mem = '1GB'")
        await conn.execute("SET max_parallel_maintenance_workers = 1")
        await conn.execute(
            "CREATE INDEX chunks_embedding_hnsw ON chunks "
            "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
        )
        await conn.execute("VACUUM ANALYZE chunks")
    finally:
        await conn.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_size(
    admin_url: str, n: int, queries: int, rng: np.random.Generator, kind: str
) -> list[dict[str, Any]]:
    name = f"bench_search_{uuid.uuid4().hex[:8]}"
    await ensure_database_exists(admin_url, name)
    url = with_database(admin_url, name)
    await asyncio.to_thread(migrate, url, DIM)
    corpus = text_corpus(n, queries, rng) if kind == "text" else make_corpus(n, rng)
    t0 = time.perf_counter()
    await load(url, corpus, rng)
    load_s = time.perf_counter() - t0
    store = await PgDocumentStore.connect(
        url, embedding_dim=DIM, min_size=1, max_size=1, keyword_common_rows=KEYWORD_COMMON_ROWS
    )
    # The keyword side without the common-word bound (every chunk with any query word is
    # ranked), same run: its latency, and how much of its keyword top 10 the bound keeps.
    unbounded = await PgDocumentStore.connect(
        url, embedding_dim=DIM, min_size=1, max_size=1, keyword_common_rows=0
    )
    exact_conn = await asyncpg.connect(url)
    await register_vector(exact_conn)
    # The exact-scan baseline: same statement, ANN index off, distinct SQL text so no cached
    # plan from the indexed runs is reused (NOTES.md pitfall).
    await exact_conn.execute("SET enable_indexscan = off; SET plan_cache_mode = force_custom_plan")
    exact_sql = "/* exact */ " + HYBRID_SQL
    common = await store.common_words()
    print(f"  {len(common)} common words (in more than {KEYWORD_COMMON_ROWS} chunks)", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        if corpus.query_vectors is not None and corpus.query_texts is not None:
            qvecs, qtexts = corpus.query_vectors, corpus.query_texts
        else:
            qidx = rng.integers(0, n, size=queries)
            # A query near a stored chunk (noise of norm ~0.3 against unit vectors), as a
            # paraphrase is near the passage that answers it.
            noise = rng.normal(size=(queries, DIM)).astype(np.float32) * (0.3 / np.sqrt(DIM))
            qvecs = corpus.vectors[qidx] + noise
            qvecs /= np.linalg.norm(qvecs, axis=1, keepdims=True)
            qtexts = [" ".join(rng.choice(VOCAB, size=3, p=ZIPF)) for _ in range(queries)]
        acl_arr = np.array(corpus.acl)
        for label, held in CALLERS.items():
            visible = np.isin(acl_arr, held)
            vis_idx = np.nonzero(visible)[0]
            lat: list[float] = []
            exact_lat: list[float] = []
            unbounded_lat: list[float] = []
            keyword_overlap: list[float] = []
            recalls: list[float] = []
            for qi in range(min(queries, 50)):  # warm-up: a serving process is warm
                await store.hybrid_candidates(
                    qtexts[qi], qvecs[qi], held, k_vector=40, k_keyword=40
                )
            for qi in range(queries):
                vec = qvecs[qi].astype(np.float32)
                start = time.perf_counter()
                cands = await store.hybrid_candidates(
                    qtexts[qi], vec, held, k_vector=40, k_keyword=40
                )
                lat.append((time.perf_counter() - start) * 1000)
                got = {
                    c.chunk_id for c in cands if c.vector_rank is not None and c.vector_rank <= 10
                }
                sims = corpus.vectors[vis_idx] @ vec
                top = vis_idx[np.argsort(-sims)[:10]]
                truth = {chunk_id(i) for i in top}
                recalls.append(len(got & truth) / max(1, len(truth)))
                if qi < min(queries, 100):
                    start = time.perf_counter()
                    every = await unbounded.hybrid_candidates(
                        qtexts[qi], vec, held, k_vector=40, k_keyword=40
                    )
                    unbounded_lat.append((time.perf_counter() - start) * 1000)
                    want = {c.chunk_id for c in every if (c.keyword_rank or 99) <= 10}
                    kept = {c.chunk_id for c in cands if (c.keyword_rank or 99) <= 10}
                    if want:
                        keyword_overlap.append(len(want & kept) / len(want))
                if qi < min(queries, 40):
                    start = time.perf_counter()
                    await exact_conn.fetch(exact_sql, vec, ["*", *held], 40, qtexts[qi], 40, common)
                    exact_lat.append((time.perf_counter() - start) * 1000)
            rows.append(
                {
                    "chunks": n,
                    "caller": label,
                    "visible": int(visible.sum()),
                    "p50_ms": statistics.median(lat),
                    "p99_ms": percentile(lat, 0.99),
                    "recall@10": statistics.mean(recalls),
                    "min_recall@10": min(recalls),
                    "exact_p50_ms": statistics.median(exact_lat),
                    "unbounded_p50_ms": statistics.median(unbounded_lat),
                    "keyword_top10_kept": statistics.mean(keyword_overlap or [1.0]),
                    "load_s": load_s,
                }
            )
    finally:
        await exact_conn.close()
        await store.close()
        await unbounded.close()
        if os.environ.get("BENCH_KEEP_DB") == "1":
            print(f"kept database {name} (BENCH_KEEP_DB=1): {url}", flush=True)
        else:
            conn = await asyncpg.connect(admin_url)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await conn.close()
    return rows


async def main_async(sizes: list[int], queries: int, kind: str) -> None:
    settings = load_settings()
    url = await resolve_database_url(settings)
    admin_url = with_database(url, "postgres")  # where CREATE DATABASE runs
    rng = np.random.default_rng(20261130)
    print(
        f"{'chunks':>7} {'caller':<12} {'visible':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'recall@10':>9} {'min':>5} {'exact p50':>9} {'unbounded kw p50':>16} "
        f"{'kw top10 kept':>13}"
    )
    for n in sizes:
        for r in await run_size(admin_url, n, queries, rng, kind):
            print(
                f"{r['chunks']:>7} {r['caller']:<12} {r['visible']:>8} {r['p50_ms']:>7.2f} "
                f"{r['p99_ms']:>7.2f} {r['recall@10']:>9.3f} {r['min_recall@10']:>5.2f} "
                f"{r['exact_p50_ms']:>9.2f} {r['unbounded_p50_ms']:>16.2f} "
                f"{r['keyword_top10_kept']:>13.3f}",
                flush=True,
            )
        print(f"  (load + index build of {n} chunks: {r['load_s']:.1f}s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--corpus",
        choices=["synthetic", "text"],
        default="synthetic",
        help="synthetic: clustered vectors and Zipf words (any size, seconds to build); text: "
        "docstring paragraphs of the installed packages embedded by the configured embedder "
        "(real text and vectors; embedding is cached, ~1 min per 10k chunks on 2 cores)",
    )
    args = parser.parse_args()
    asyncio.run(main_async([int(s) for s in args.sizes.split(",")], args.queries, args.corpus))


if __name__ == "__main__":
    main()
