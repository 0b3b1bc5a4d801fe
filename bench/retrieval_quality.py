"""Retrieval quality on labelled questions over the sample docs, or on a known-item task over
10k-100k docstring paragraphs (``--corpus text``): nDCG@10, recall@k, MRR@10 of vector only,
keyword only, hybrid (RRF) and hybrid + reranker, side by side.

    python -m bench.retrieval_quality [--dataset evals/datasets/retrieval_sample.yaml]
        [--out-dir bench/out/retrieval_quality] [--database retrieval_quality] [--only ID,...]
    python -m bench.retrieval_quality --corpus text [--sizes 10000,100000] [--queries 500]
    ... [--split train|heldout]

The questions and their section labels are ``evals/datasets/retrieval_sample.yaml`` (how
they were written: its header). The sample documentation goes through the real ingestion
(``run_ingest``, in-process, the default folder ACLs) into a database of its own on the
configured server (embedded by default; ``--database``), so the configured knowledge base is
never touched; a second run finds every page unchanged and embeds nothing. Each question is
then searched as its row's caller through ``HybridRetriever`` four times over the same store,
embedder and settings (``TOP_K_*``, ``RRF_K``, ``KEYWORD_COMMON_ROWS``):

- vector only, keyword only: ``RetrievalConfig.sides``, one candidate list, no reranker;
- hybrid (RRF): both lists fused, no reranker (the service with ``RERANKER=noop``);
- hybrid + reranker: the service as configured (``RERANKER``; with ``noop`` this column is
  the hybrid one by construction, and the report says so).

Prints the tables (overall, by category, the questions with no visible answer) and writes
``report.md`` (the same, then every question) and ``report.jsonl`` (every question and
configuration with the sections returned) to ``--out-dir``. Exit 1 if any search returned a
chunk its caller may not read; 2 for a dataset error.

``--corpus text [--sizes 10000,100000] [--queries 500]``: the known-item task on the search
benchmark's real-text corpus (``bench.text_corpus``) instead. At each size, docstring
paragraphs of the installed packages and the standard library, ``--queries`` of them the
source paragraphs of held-out first sentences of standard-library docstrings (the query's
sentence and the rest of its docstring are not in the corpus); each query's one relevant
chunk is its source paragraph (``evals.known_item``). The paragraphs are embedded by the
configured embedder (cached in ``AGENT_SERVICE_HOME/bench-cache``) and loaded with COPY and
the production indexes (``bench.search.load``) into a database of their own per size and
corpus (``rq_text_<size>_<hash>``, kept for the next run); the four configurations are the
same ``HybridRetriever`` searches over ``PgDocumentStore``. Writes ``known-item-<size>.md``
and ``.jsonl`` to ``--out-dir``.

``--split train|heldout``: only the questions (or known-item queries) on that side of the
split that item 4 of issue 16 tunes the search settings on (``evals.splits``: a stable hash
of a question's id, of a known-item query's text; ~60% train). The corpus is the same.
``bench.retrieval_sweep`` sweeps the settings on the training side.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import asyncpg
import numpy as np
import numpy.typing as npt

from bench.search import Corpus, chunk_id, load
from bench.text_corpus import KNOWN_ITEM_VERSION, KnownItems, build_known_items, embed_cached
from evals.dataset import DatasetError
from evals.known_item import KnownItem, KnownItemReport, score_known_items
from evals.known_item import report_jsonl as known_item_jsonl
from evals.known_item import summary_markdown as known_item_markdown
from evals.retrieval_labels import (
    DEFAULT_QUALITY_DATASET,
    QualityDataset,
    load_quality_dataset,
    sample_doc_roots,
)
from evals.retrieval_quality import (
    QualityReport,
    Searcher,
    report_jsonl,
    report_markdown,
    score_config,
    summary_markdown,
)
from evals.splits import SPLITS, Split, select_split
from foundation.database import (
    asyncpg_url,
    ensure_database_exists,
    migrate,
    resolve_database_url,
    with_database,
)
from foundation.settings import Settings, load_settings
from ingest_jobs.pipeline import IngestOptions, IngestReport, effective_max_tokens, run_ingest
from retrieval.embedders import Embedder, Vectors, build_embedder
from retrieval.rerankers import NoopReranker, Reranker, build_reranker
from retrieval.search import HybridRetriever, Sides
from retrieval.store import PgDocumentStore
from serve_app.knowledge import connect_store
from serve_app.wiring import (
    embedder_config,
    ingest_config,
    reranker_config,
    retrieval_config,
    store_config,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE = "retrieval_quality"
DEFAULT_OUT_DIR = ROOT / "bench" / "out" / "retrieval_quality"
TEXT_SEED = 20261204
TEXT_ACL = "domain:common"  # every chunk of the text corpus, and the caller who searches it


@dataclass(frozen=True)
class Options:
    dataset: Path = ROOT / DEFAULT_QUALITY_DATASET
    out_dir: Path = DEFAULT_OUT_DIR
    database: str = DEFAULT_DATABASE
    only: tuple[str, ...] = ()
    corpus: str = "sample"  # "sample": the labelled questions; "text": the known-item task
    sizes: tuple[int, ...] = (10_000,)
    queries: int = 500
    split: Split | None = None  # only one side of evals.splits (None: every row)


class QueryCache:
    """The embedder, with each text embedded once per run: the four configurations search
    with identical query vectors, and each forward pass is paid once."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self._vectors: dict[str, Vectors] = {}

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def max_tokens(self) -> int:
        return self.inner.max_tokens

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def encode(self, texts: Sequence[str]) -> Vectors:
        return self.inner.encode(texts)

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            vectors = await self.inner.aencode(missing)
            self._vectors.update(zip(missing, vectors, strict=True))
        return np.stack([self._vectors[t] for t in texts])


async def open_sample_store(
    settings: Settings, database: str, embedder: Embedder
) -> tuple[PgDocumentStore, IngestReport]:
    """The benchmark's own database on the configured server, holding exactly the sample
    documentation (ingested if needed; pages gone from the folder are pruned)."""
    server_url = await resolve_database_url(settings)
    admin_url = with_database(server_url, "postgres")  # where CREATE DATABASE runs
    await ensure_database_exists(admin_url, database)
    url = with_database(server_url, database)
    await asyncio.to_thread(migrate, url, settings.embedding.resolved_dim)
    store = await connect_store(store_config(settings), url)
    options = IngestOptions(
        roots=sample_doc_roots(ROOT),
        prune=True,
        executor="local",
        batch_size=settings.embedding.batch_size,
        max_tokens=effective_max_tokens(ingest_config(settings), embedder.max_tokens),
    )
    try:
        report = await run_ingest(store, ingest_config(settings), options, embedder=embedder)
    except BaseException:
        await store.close()
        raise
    return store, report


def configurations(
    settings: Settings, store: PgDocumentStore, embedder: Embedder, reranker: Reranker
) -> dict[str, Searcher]:
    """The four searches compared, over one store and one embedder."""
    base = retrieval_config(settings)

    def retriever(sides: Sides, ranker: Reranker) -> HybridRetriever:
        return HybridRetriever(store, embedder, ranker, dataclasses.replace(base, sides=sides))

    return {
        "vector only": retriever("vector", NoopReranker()),
        "keyword only": retriever("keyword", NoopReranker()),
        "hybrid (RRF)": retriever("hybrid", NoopReranker()),
        f"hybrid + reranker ({reranker.name})": retriever("hybrid", reranker),
    }


def context_lines(
    settings: Settings, ingest: IngestReport, counts: tuple[int, int], reranker: Reranker
) -> dict[str, str]:
    """The facts a reader needs to reproduce or compare a run."""
    corpus = (
        f"{counts[0]} pages, {counts[1]} chunks (ingest: {ingest.new} new, "
        f"{ingest.unchanged} unchanged, {ingest.replaced} replaced, {ingest.pruned} pruned)"
    )
    return run_context(settings, reranker, corpus)


def run_context(settings: Settings, reranker: Reranker, corpus: str) -> dict[str, str]:
    """The facts every report of this command starts with."""
    noop = reranker.name == "noop"
    r = settings.retrieval
    return {
        "date": date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        "command": "python -m bench.retrieval_quality " + " ".join(sys.argv[1:]),
        "corpus": corpus,
        "embedder": settings.embedding.model,
        "reranker": "noop: the hybrid + reranker column equals hybrid by construction "
        "(RERANKER=noop keeps the fused order)"
        if noop
        else f"{reranker.name} (RERANKER={settings.retrieval.reranker})",
        "depths": f"TOP_K_VECTOR {r.top_k_vector}, TOP_K_KEYWORD {r.top_k_keyword}, "
        f"TOP_K_RERANK {r.top_k_rerank}, TOP_K_FINAL {r.top_k_final}, RRF_K {r.rrf_k}, "
        f"RRF_KEYWORD_WEIGHT {r.rrf_keyword_weight}, KEYWORD_RANKING {r.keyword_ranking}, "
        f"KEYWORD_COMMON_ROWS {r.keyword_common_rows}, CHUNK_MAX_TOKENS "
        f"{settings.ingestion.chunk_max_tokens}",
    }


def select(
    dataset: QualityDataset, only: Sequence[str], split: Split | None = None
) -> QualityDataset:
    """The rows named by ``only`` (all when empty) on ``split``'s side (both when None); an
    unknown id is an error."""
    if split is not None:
        rows = tuple(select_split(dataset.rows, lambda row: row.id, split))
        dataset = dataclasses.replace(dataset, rows=rows)
    if not only:
        return dataset
    known = {row.id for row in dataset.rows}
    unknown = sorted(set(only) - known)
    if unknown:
        raise DatasetError([f"--only: no row {name!r} in {dataset.path}" for name in unknown])
    rows = tuple(row for row in dataset.rows if row.id in set(only))
    return dataclasses.replace(dataset, rows=rows)


async def run_benchmark(
    settings: Settings, options: Options, *, embedder: Embedder | None = None
) -> QualityReport:
    """Ingest if needed, then every question through every configuration."""
    dataset = select(
        load_quality_dataset(options.dataset, repo_root=ROOT), options.only, options.split
    )
    queries = QueryCache(embedder or build_embedder(embedder_config(settings)))
    reranker = build_reranker(reranker_config(settings))
    store, ingest = await open_sample_store(settings, options.database, queries.inner)
    try:
        report = QualityReport(dataset, settings.retrieval.top_k_final, [])
        for name, searcher in configurations(settings, store, queries, reranker).items():
            started = time.perf_counter()
            report.configs.append(
                await score_config(dataset, searcher, name, settings.retrieval.top_k_final)
            )
            seconds = time.perf_counter() - started
            print(f"{name}: {len(dataset.rows)} questions in {seconds:.1f} s", file=sys.stderr)
        report.context.update(context_lines(settings, ingest, await store.counts(), reranker))
        report.context["questions"] = split_line(options.split, len(dataset.rows))
    finally:
        await store.close()
    return report


def split_line(split: Split | None, rows: int) -> str:
    if split is None:
        return f"all {rows} (both sides of evals.splits)"
    return f"the {split} side of evals.splits only ({rows}; --split {split})"


# --- the known-item task on the real-text corpus (--corpus text) ---------------------------


def known_item_corpus(
    settings: Settings, embedder: Embedder, size: int, queries: int, seed: int = TEXT_SEED
) -> tuple[KnownItems, npt.NDArray[np.float32]]:
    """The corpus and its vectors, both cached in ``bench-cache`` (reading every docstring
    takes minutes; embedding 100k paragraphs some twenty on 2 cores)."""
    cache = settings.agent_service_home / "bench-cache"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    listing = cache / f"known-items-{size}-{queries}-{seed}-v{KNOWN_ITEM_VERSION}-{version}.json"
    if listing.exists():
        items = KnownItems(**json.loads(listing.read_text(encoding="utf-8")))
    else:
        started = time.perf_counter()
        items = build_known_items(size, queries, seed)
        print(f"corpus of {size} read in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = listing.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(items)), encoding="utf-8")
        tmp.replace(listing)
    vectors = embed_cached(items.texts, embedder, cache, "known-item-chunks")
    return items, vectors


def text_database(items: KnownItems, embedder: Embedder) -> str:
    """The database of one size and corpus: a changed corpus or embedder gets a new one."""
    digest = hashlib.sha256(f"{embedder.name}\0".encode())
    for text in items.texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return f"rq_text_{len(items.texts)}_{digest.hexdigest()[:10]}"


async def open_text_store(
    settings: Settings, items: KnownItems, vectors: npt.NDArray[np.float32], database: str
) -> tuple[PgDocumentStore, float | None]:
    """The store over ``database``, loaded unless it already holds the corpus; the load's
    seconds (None: reused). Other sizes' and corpora's databases are left alone; a database
    of this name with another chunk count (an interrupted load) is made anew."""
    server_url = await resolve_database_url(settings)
    admin_url = with_database(server_url, "postgres")
    url = with_database(server_url, database)
    conn = await asyncpg.connect(asyncpg_url(admin_url))
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
    finally:
        await conn.close()
    if exists:
        check = await asyncpg.connect(asyncpg_url(url))
        try:
            loaded = await check.fetchval("SELECT count(*) FROM chunks")
        finally:
            await check.close()
        if loaded == len(items.texts):
            return await connect_store(store_config(settings), url), None
        conn = await asyncpg.connect(asyncpg_url(admin_url))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await conn.close()
    await ensure_database_exists(admin_url, database)
    await asyncio.to_thread(migrate, url, settings.embedding.resolved_dim)
    started = time.perf_counter()
    corpus = Corpus(vectors, [TEXT_ACL] * len(items.texts), items.texts)
    await load(asyncpg_url(url), corpus, np.random.default_rng(0))
    return await connect_store(store_config(settings), url), time.perf_counter() - started


async def run_known_item(
    settings: Settings, options: Options, *, embedder: Embedder | None = None
) -> list[KnownItemReport]:
    """The known-item task at every size of ``options.sizes``."""
    queries = QueryCache(embedder or build_embedder(embedder_config(settings)))
    reranker = build_reranker(reranker_config(settings))
    reports: list[KnownItemReport] = []
    for size in options.sizes:
        items, vectors = known_item_corpus(settings, queries.inner, size, options.queries)
        database = text_database(items, queries.inner)
        store, load_s = await open_text_store(settings, items, vectors, database)
        known = select_split(
            [
                KnownItem(f"q{i:04d}", query, chunk_id(answer))
                for i, (query, answer) in enumerate(zip(items.queries, items.answers, strict=True))
            ],
            lambda item: item.query,
            options.split,
        )
        title = f"Known-item search over {size:,} docstring paragraphs"
        report = KnownItemReport(
            title, settings.retrieval.top_k_final, settings.retrieval.top_k_rerank, []
        )
        try:
            for name, searcher in configurations(settings, store, queries, reranker).items():
                started = time.perf_counter()
                scores = await score_known_items(
                    known,
                    searcher,
                    name,
                    final_k=settings.retrieval.top_k_final,
                    pool=settings.retrieval.top_k_rerank,
                    acl=[TEXT_ACL],
                )
                report.configs.append(scores)
                seconds = time.perf_counter() - started
                print(f"{size}: {name}: {len(known)} queries in {seconds:.1f} s", file=sys.stderr)
        finally:
            await store.close()
        loaded = "reused" if load_s is None else f"loaded in {load_s:.0f} s"
        corpus = (
            f"{size} chunks ({len(items.answers)} of them the task's answers), database {database} "
            f"({loaded}); queries: first sentences of {len(known)} standard-library docstrings "
            f"(seed {TEXT_SEED}), each answered by one chunk"
        )
        report.context.update(run_context(settings, reranker, corpus))
        report.context["queries"] = split_line(options.split, len(known))
        reports.append(report)
    return reports


def write_known_item_reports(
    reports: Sequence[KnownItemReport], sizes: Sequence[int], out_dir: Path
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for size, report in zip(sizes, reports, strict=True):
        markdown = out_dir / f"known-item-{size}.md"
        jsonl = out_dir / f"known-item-{size}.jsonl"
        markdown.write_text(known_item_markdown(report), encoding="utf-8")
        jsonl.write_text(known_item_jsonl(report), encoding="utf-8")
        written += [markdown, jsonl]
    return written


def write_reports(report: QualityReport, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown, jsonl = out_dir / "report.md", out_dir / "report.jsonl"
    markdown.write_text(report_markdown(report), encoding="utf-8")
    jsonl.write_text(report_jsonl(report), encoding="utf-8")
    return [markdown, jsonl]


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retrieval_quality",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", type=Path, default=Options.dataset)
    parser.add_argument("--out-dir", type=Path, default=Options.out_dir)
    parser.add_argument(
        "--database",
        default=Options.database,
        help="the benchmark's own database on the configured server (created if needed)",
    )
    parser.add_argument("--only", action="append", default=[], help="row ids (repeatable, a,b)")
    parser.add_argument(
        "--corpus",
        choices=["sample", "text"],
        default=Options.corpus,
        help="sample: the labelled questions over the sample documentation; text: the "
        "known-item task over docstring paragraphs (--sizes, --queries)",
    )
    parser.add_argument(
        "--sizes",
        default="10000",
        help="--corpus text: corpus sizes in chunks, comma-separated (e.g. 10000,100000)",
    )
    parser.add_argument(
        "--queries", type=int, default=Options.queries, help="--corpus text: queries per size"
    )
    parser.add_argument(
        "--split",
        choices=SPLITS,
        default=None,
        help="only the questions on this side of the train/held-out split (evals.splits)",
    )
    args = parser.parse_args(argv)
    only = tuple(i.strip() for value in args.only for i in value.split(",") if i.strip())
    try:
        sizes = tuple(int(size) for size in args.sizes.split(",") if size.strip())
    except ValueError:
        parser.error(f"--sizes: not a list of chunk counts: {args.sizes!r}")
    if args.corpus == "text" and (not sizes or any(n <= args.queries for n in sizes)):
        parser.error("--sizes: every size must hold more chunks than --queries")
    if args.corpus == "text" and only:
        parser.error("--only names rows of the sample dataset; not with --corpus text")
    return Options(
        args.dataset,
        args.out_dir,
        args.database,
        only,
        args.corpus,
        sizes,
        args.queries,
        args.split,
    )


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = parse_args(argv)
    settings = load_settings()
    if options.corpus == "text":
        for size in options.sizes:  # each size's tables as soon as it is done
            one = dataclasses.replace(options, sizes=(size,))
            known = asyncio.run(run_known_item(settings, one))
            print(known_item_markdown(known[0]), flush=True)
            for path in write_known_item_reports(known, one.sizes, options.out_dir):
                print(f"wrote {path}", flush=True)
        return 0
    try:
        report = asyncio.run(run_benchmark(settings, options))
    except DatasetError as exc:
        print("invalid dataset:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return 2
    print(summary_markdown(report))
    for path in write_reports(report, options.out_dir):
        print(f"wrote {path}")
    leaks = sum(s.leaks for config in report.configs for s in config.rows)
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
