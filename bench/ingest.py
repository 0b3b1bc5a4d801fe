"""Ingestion throughput: both executors vs the raw embedder on the same chunks, same run.

    python -m bench.ingest [--corpora sample,1000,10000] [--actors 1]

Each corpus is one of: ``sample`` (the 26 sample documentation pages), ``samplexN`` (those
pages copied N times, distinct sources) or a number N (N pages of one real docstring
paragraph each, from the installed packages: real technical English, one chunk per page).
For each corpus, over the same chunks:

1. raw: the embedder alone over the chunk texts in-process, sorted by length and cut into
   calls of 256 that ``encode_batches`` runs side by side (one per torch thread,
   ``EMBEDDING_STREAMS``, from ``STREAMS_MIN_CHUNKS`` chunks, as the pipelines do): the
   fastest way the model goes on this machine, with the least padding; also in batches of
   32 cut in file order, one ``encode`` after another, as the pipelines once did;
2. local: the whole pipeline in one process (read, hash, chunk, embed, COPY);
3. ray: the Ray Data job (chunk tasks, embedding actor pool, a child process that sends the
   rows, driver writes), timed after ``ray.init`` as a job on a running cluster would be;
   ``ray.init`` (once, shared) is reported apart;

and which executor ``--executor auto`` picks for it. Each pipeline run writes into a fresh
database on the configured server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from bench.text_corpus import build_texts
from foundation.database import (
    ensure_database_exists,
    migrate,
    resolve_database_url,
    with_database,
)
from foundation.settings import Settings, load_settings
from ingest_jobs.pipeline import (
    Executor,
    IngestOptions,
    IngestReport,
    choose_executor,
    effective_max_tokens,
    run_ingest,
)
from ingest_jobs.ray_executor import start_ray
from ingest_jobs.sources import PreparedSource, SourceFile, chunk_rows, discover, prepare
from ingest_jobs.token_counts import token_counter
from retrieval.embedders import (
    Embedder,
    SentenceTransformerEmbedder,
    build_embedder,
    encode_batches,
    resolve_local_model,
    streams_pay,
)
from retrieval.search import embedding_input
from retrieval.store import PgDocumentStore
from serve_app.wiring import embedder_config, ingest_config

ROOT = Path(__file__).resolve().parent.parent
# The raw encode's call size: the texts sorted by length, then cut into calls of this many,
# run side by side. The in-process window's size: a larger call pads no less once sorted, and
# its last call runs alone on one stream (10,000 pages: 112.8-123.7/s in calls of 1,000,
# 127.2-132.3/s in calls of 256, bench/RESULTS.md "Encode streams").
SORTED_CALL_TEXTS = 256


def build_corpus(dest: Path, name: str, paragraphs: list[str]) -> list[tuple[Path, list[str]]]:
    """The roots of corpus ``name`` (see the module docstring), written under ``dest``; a
    number N takes the first N of ``paragraphs``."""
    if name == "sample":
        return copy_samples(dest, 1)
    if name.startswith("samplex"):
        return copy_samples(dest, int(name.removeprefix("samplex")))
    pages = int(name)
    root = dest / "pages"
    root.mkdir(parents=True)
    if pages > len(paragraphs):
        raise SystemExit(f"corpus {name}: only {len(paragraphs)} paragraphs were built")
    for n, text in enumerate(paragraphs[:pages]):
        (root / f"page-{n:05d}.md").write_text(f"# Page {n}\n\n{text}\n", encoding="utf-8")
    return [(root, [])]


def copy_samples(dest: Path, copies: int) -> list[tuple[Path, list[str]]]:
    roots: list[tuple[Path, list[str]]] = []
    for i in range(copies):
        for folder in ("user", "developer"):
            target = dest / f"copy{i}" / folder
            shutil.copytree(ROOT / "documentation" / folder, target)
            roots.append((target, []))
    return roots


async def fresh_store(admin_url: str) -> tuple[PgDocumentStore, str]:
    name = f"bench_ingest_{uuid.uuid4().hex[:8]}"
    await ensure_database_exists(admin_url, name)
    url = with_database(admin_url, name)
    await asyncio.to_thread(migrate, url, 384)
    return await PgDocumentStore.connect(url, embedding_dim=384, max_size=2), name


async def drop(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def pipeline_run(
    admin_url: str,
    settings: Settings,
    roots: list[tuple[Path, list[str]]],
    executor: Executor,
    *,
    embedder: Embedder,
    actors: int,
    max_tokens: int,
) -> IngestReport:
    """One pipeline run into a fresh database, dropped after; ``embedder`` (warm) is used
    in-process only (the Ray actors load their own)."""
    options = IngestOptions(
        roots=roots,
        executor=executor,
        embed_actors=actors,
        batch_size=settings.embedding.batch_size,
        max_tokens=max_tokens,
    )
    store, db = await fresh_store(admin_url)
    try:
        local = executor == "local"
        return await run_ingest(
            store, ingest_config(settings), options, embedder=embedder if local else None
        )
    finally:
        await store.close()
        await drop(admin_url, db)


def chunk_texts(files: Sequence[SourceFile], embedder_name: str, max_tokens: int) -> list[str]:
    """The embedding inputs of every chunk of ``files`` (``discover``), in file order, as the
    pipelines chunk them (the packaged MiniLM's token counts)."""
    counter = token_counter(resolve_local_model("all-MiniLM-L6-v2"))
    texts: list[str] = []
    for file in files:
        doc = prepare(file, embedder_name=embedder_name, max_tokens=max_tokens)
        if isinstance(doc, PreparedSource):
            texts.extend(
                embedding_input(r["section"], r["text"])
                for r in chunk_rows(doc, counter, max_tokens)
            )
    return texts


def raw_encode_seconds(model: Embedder, texts: list[str], *, in_order_batch: int = 0) -> float:
    """The model alone on ``texts``: by default as fast as it goes (sorted by length, calls
    side by side); with ``in_order_batch``, batches of that many cut in file order, one after
    another (what the pipelines did before they sorted)."""
    model.encode(texts[:64])  # warm-up
    streams: int | None
    if in_order_batch:
        ordered, step, streams = texts, in_order_batch, 1
    else:
        ordered, step = sorted(texts, key=len), SORTED_CALL_TEXTS
        streams = None if streams_pay(len(texts)) else 1
    calls = [ordered[i : i + step] for i in range(0, len(texts), step)]
    start = time.perf_counter()
    for _ in encode_batches(model, calls, streams=streams):
        pass
    return time.perf_counter() - start


async def main_async(corpora: list[str], actors: int, compare_float32: bool) -> None:
    settings = load_settings()
    admin_url = with_database(await resolve_database_url(settings), "postgres")
    # The configured embedder (EMBEDDING_DTYPE included), as the pipelines build it.
    embedder = build_embedder(embedder_config(settings))
    max_tokens = effective_max_tokens(ingest_config(settings), embedder.max_tokens)
    dtype = getattr(embedder, "dtype", "float32")
    print(f"embedder {embedder.name} ({dtype}), chunk budget {max_tokens} tokens", flush=True)
    import ray

    t0 = time.perf_counter()
    start_ray(ingest_config(settings))
    # The pipeline runs Ray Data in a child process: it joins this Ray, so the start stays
    # out of the rate (as on a running cluster).
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    print(f"ray.init {time.perf_counter() - t0:.1f}s (once, not counted)", flush=True)
    # One walk over the installed docstrings for every numeric corpus: with no queries held
    # out, build_texts(n) is the first n of build_texts(m) for any m > n.
    largest = max((int(c) for c in corpora if c.isdigit()), default=0)
    paragraphs = build_texts(largest, 0, seed=15)[0] if largest else []
    rows = []
    for name in corpora:
        tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
        try:
            roots = build_corpus(tmp, name, paragraphs)
            rows.append(
                await measure(name, roots, embedder, max_tokens, actors, admin_url, compare_float32)
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        "\n| corpus | pages | chunks | raw, batches in order | raw encode (sorted) | "
        "in-process | Ray Data | auto picks |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(row)


async def measure(
    name: str,
    roots: list[tuple[Path, list[str]]],
    embedder: Embedder,
    max_tokens: int,
    actors: int,
    admin_url: str,
    compare_float32: bool,
) -> str:
    """One corpus: raw encode, then each executor into a fresh database; a table row."""
    settings = load_settings()
    files = discover(roots)
    texts = chunk_texts(files, embedder.name, max_tokens)
    print(f"\n{name}: {len(files)} documents, {len(texts)} chunks", flush=True)
    batch = settings.embedding.batch_size
    in_order_s = raw_encode_seconds(embedder, texts, in_order_batch=batch)
    in_order_rate = len(texts) / in_order_s
    print(f"raw, in order  {in_order_rate:7.1f} chunks/s  ({in_order_s:.1f}s)", flush=True)
    raw_s = raw_encode_seconds(embedder, texts)
    raw_rate = len(texts) / raw_s
    print(f"raw encode     {raw_rate:7.1f} chunks/s  ({raw_s:.1f}s)", flush=True)
    if compare_float32 and getattr(embedder, "dtype", "float32") != "float32":
        fp32 = SentenceTransformerEmbedder("all-MiniLM-L6-v2", dtype="float32")
        fp32_s = raw_encode_seconds(fp32, texts)
        print(f"raw float32    {len(texts) / fp32_s:7.1f} chunks/s  ({fp32_s:.1f}s)", flush=True)

    cells: dict[str, str] = {}
    executors: tuple[Executor, ...] = ("local", "ray")
    for executor in executors:
        report = await pipeline_run(
            admin_url,
            settings,
            roots,
            executor,
            embedder=embedder,
            actors=actors,
            max_tokens=max_tokens,
        )
        rate = report.chunks_written / report.seconds
        print(
            f"{executor:<14} {rate:7.1f} chunks/s  ({report.seconds:.1f}s, "
            f"{report.chunks_written} chunks, {report.new} documents): "
            f"{rate / raw_rate:.2f}x raw",
            flush=True,
        )
        cells[executor] = f"{report.seconds:.1f} s, {rate:.1f}/s, {rate / raw_rate:.2f}x raw"
    # auto on this machine alone, no running cluster
    auto = choose_executor(
        "auto", len(texts), ingest_config(settings.model_copy(update={"ray_address": None}))
    )
    return (
        f"| {name} | {len(files)} | {len(texts)} | {in_order_s:.1f} s, "
        f"{in_order_rate:.1f}/s | {raw_s:.1f} s, {raw_rate:.1f}/s | "
        f"{cells['local']} | {cells['ray']} | {'in-process' if auto == 'local' else 'Ray'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpora",
        default="sample,1000,10000",
        help="comma-separated: sample, samplexN (N copies), or N docstring pages",
    )
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument(
        "--compare-float32",
        action="store_true",
        help="also time the raw encode with float32 weights (when EMBEDDING_DTYPE resolves to "
        "bfloat16), for the speed-up",
    )
    args = parser.parse_args()
    corpora = [c.strip() for c in args.corpora.split(",") if c.strip()]
    asyncio.run(main_async(corpora, args.actors, args.compare_float32))


if __name__ == "__main__":
    main()
