"""Ingestion throughput: the Ray Data job vs the raw embedder on the same chunks, same run.

    python -m bench.ingest [--copies 4] [--actors 1]

The corpus is the sample documentation copied ``--copies`` times (distinct sources, so every
copy is chunked, embedded and written). Three figures, each over the same chunks:

1. raw: ``SentenceTransformerEmbedder.encode`` over the chunk texts in batches, in-process
   (the physical limit on this machine: the embedder is where the CPU goes);
2. local: the whole pipeline in one process (read, hash, chunk, embed, COPY);
3. ray: the Ray Data job (chunk tasks, embedding actor pool, driver writes), timed after
   ``ray.init`` as a job on a running cluster would be; ``ray.init`` is reported apart.

Each pipeline run writes into a fresh database on the configured server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from foundation.database import (
    ensure_database_exists,
    migrate,
    resolve_database_url,
    with_database,
)
from foundation.settings import load_settings
from ingest_jobs.pipeline import (
    Executor,
    IngestOptions,
    effective_max_tokens,
    run_ingest,
    start_ray,
)
from ingest_jobs.sources import PreparedSource, chunk_rows, discover, prepare, token_counter
from retrieval.embedders import (
    Embedder,
    SentenceTransformerEmbedder,
    build_embedder,
    resolve_local_model,
)
from retrieval.search import embedding_input
from retrieval.store import PgDocumentStore

ROOT = Path(__file__).resolve().parent.parent


def build_corpus(dest: Path, copies: int) -> list[tuple[Path, list[str]]]:
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


async def main_async(copies: int, actors: int, compare_float32: bool) -> None:
    settings = load_settings()
    admin_url = with_database(await resolve_database_url(settings), "postgres")
    # The configured embedder (EMBEDDING_DTYPE included), as the pipelines build it.
    embedder = build_embedder(settings)
    max_tokens = effective_max_tokens(settings, embedder.max_tokens)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        roots = build_corpus(tmp, copies)
        # The same chunks the pipelines will produce, for the raw encode rate.
        counter = token_counter(resolve_local_model("all-MiniLM-L6-v2"))
        texts: list[str] = []
        for file in discover(roots):
            doc = prepare(file, embedder_name=embedder.name, max_tokens=max_tokens)
            if isinstance(doc, PreparedSource):
                texts.extend(
                    embedding_input(r["section"], r["text"])
                    for r in chunk_rows(doc, counter, max_tokens)
                )

        def raw_encode_seconds(model: Embedder) -> float:
            model.encode(texts[:64])  # warm-up
            start = time.perf_counter()
            for i in range(0, len(texts), settings.embedding_batch_size):
                model.encode(texts[i : i + settings.embedding_batch_size])
            return time.perf_counter() - start

        raw_s = raw_encode_seconds(embedder)
        raw_rate = len(texts) / raw_s
        dtype = getattr(embedder, "dtype", "float32")
        print(f"corpus: {len(discover(roots))} documents, {len(texts)} chunks", flush=True)
        print(f"raw encode ({dtype}) {raw_rate:7.1f} chunks/s  ({raw_s:.1f}s)", flush=True)
        if compare_float32 and dtype != "float32":
            fp32_s = raw_encode_seconds(
                SentenceTransformerEmbedder("all-MiniLM-L6-v2", dtype="float32")
            )
            print(
                f"raw encode (float32) {len(texts) / fp32_s:7.1f} chunks/s  ({fp32_s:.1f}s): "
                f"{dtype} is {fp32_s / raw_s:.2f}x faster",
                flush=True,
            )

        results: dict[str, float] = {}
        executors: tuple[Executor, ...] = ("local", "ray")
        for executor in executors:
            store, name = await fresh_store(admin_url)
            try:
                if executor == "ray":
                    import ray

                    t0 = time.perf_counter()
                    start_ray(settings)
                    # The pipeline runs Ray Data in a child process: it joins this Ray, so the
                    # start stays out of the rate (as on a running cluster).
                    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
                    print(f"ray.init       {time.perf_counter() - t0:.1f}s (not counted)")
                options = IngestOptions(
                    roots=roots,
                    executor=executor,
                    embed_actors=actors,
                    batch_size=settings.embedding_batch_size,
                    max_tokens=max_tokens,
                )
                report = await run_ingest(
                    store,
                    settings,
                    options,
                    embedder=embedder if executor == "local" else None,
                )
                rate = report.chunks_written / report.seconds
                results[executor] = rate
                print(
                    f"{executor:<14} {rate:7.1f} chunks/s  ({report.seconds:.1f}s, "
                    f"{report.chunks_written} chunks, {report.new} documents)",
                    flush=True,
                )
            finally:
                await store.close()
                await drop(admin_url, name)
        print(
            f"ratio ray/raw {results['ray'] / raw_rate:.2f}  local/raw "
            f"{results['local'] / raw_rate:.2f}  ray/local {results['ray'] / results['local']:.2f}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument(
        "--compare-float32",
        action="store_true",
        help="also time the raw encode with float32 weights (when EMBEDDING_DTYPE resolves to "
        "bfloat16), for the speed-up",
    )
    args = parser.parse_args()
    asyncio.run(main_async(args.copies, args.actors, args.compare_float32))


if __name__ == "__main__":
    main()
