"""Retrieval quality on labelled questions: nDCG@10, recall@k, MRR@10 of vector only, keyword
only, hybrid (RRF) and hybrid + reranker, side by side.

    python -m bench.retrieval_quality [--dataset evals/datasets/retrieval_sample.yaml]
        [--out-dir bench/out/retrieval_quality] [--database retrieval_quality] [--only ID,...]

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
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from evals.dataset import DatasetError
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
from foundation.database import (
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
from serve_app.wiring import retrieval_config

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE = "retrieval_quality"
DEFAULT_OUT_DIR = ROOT / "bench" / "out" / "retrieval_quality"


@dataclass(frozen=True)
class Options:
    dataset: Path = ROOT / DEFAULT_QUALITY_DATASET
    out_dir: Path = DEFAULT_OUT_DIR
    database: str = DEFAULT_DATABASE
    only: tuple[str, ...] = ()


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
    await asyncio.to_thread(migrate, url, settings.resolved_embedding_dim)
    store = await connect_store(settings, url)
    options = IngestOptions(
        roots=sample_doc_roots(ROOT),
        prune=True,
        executor="local",
        batch_size=settings.embedding_batch_size,
        max_tokens=effective_max_tokens(settings, embedder.max_tokens),
    )
    try:
        report = await run_ingest(store, settings, options, embedder=embedder)
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
    noop = reranker.name == "noop"
    return {
        "date": date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        "command": "python -m bench.retrieval_quality " + " ".join(sys.argv[1:]),
        "corpus": f"{counts[0]} pages, {counts[1]} chunks (ingest: {ingest.new} new, "
        f"{ingest.unchanged} unchanged, {ingest.replaced} replaced, {ingest.pruned} pruned)",
        "embedder": settings.embedding_model,
        "reranker": "noop: the hybrid + reranker column equals hybrid by construction "
        "(RERANKER=noop keeps the fused order)"
        if noop
        else f"{reranker.name} (RERANKER={settings.reranker})",
        "depths": f"TOP_K_VECTOR {settings.top_k_vector}, TOP_K_KEYWORD "
        f"{settings.top_k_keyword}, TOP_K_RERANK {settings.top_k_rerank}, TOP_K_FINAL "
        f"{settings.top_k_final}, RRF_K {settings.rrf_k}, KEYWORD_COMMON_ROWS "
        f"{settings.keyword_common_rows}, CHUNK_MAX_TOKENS {settings.chunk_max_tokens}",
    }


def select(dataset: QualityDataset, only: Sequence[str]) -> QualityDataset:
    """The rows named by ``only`` (all when empty); an unknown id is an error."""
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
    dataset = select(load_quality_dataset(options.dataset, repo_root=ROOT), options.only)
    queries = QueryCache(embedder or build_embedder(settings))
    reranker = build_reranker(settings)
    store, ingest = await open_sample_store(settings, options.database, queries.inner)
    try:
        report = QualityReport(dataset, settings.top_k_final, [])
        for name, searcher in configurations(settings, store, queries, reranker).items():
            started = time.perf_counter()
            report.configs.append(await score_config(dataset, searcher, name, settings.top_k_final))
            seconds = time.perf_counter() - started
            print(f"{name}: {len(dataset.rows)} questions in {seconds:.1f} s", file=sys.stderr)
        report.context.update(context_lines(settings, ingest, await store.counts(), reranker))
    finally:
        await store.close()
    return report


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
    args = parser.parse_args(argv)
    only = tuple(i.strip() for value in args.only for i in value.split(",") if i.strip())
    return Options(args.dataset, args.out_dir, args.database, only)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = parse_args(argv)
    settings = load_settings()
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
