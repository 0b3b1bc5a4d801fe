"""``agent-service train-reranker``: the cross-encoder reranker, trained offline."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from typing import Any, TextIO

from foundation.settings import Settings
from serve_app.cli.common import EXIT_FAILURE, EXIT_OK


async def _mine_examples(
    settings: Settings, args: argparse.Namespace, pairs: list[Any], out: TextIO
) -> list[Any]:
    """The pairs' passages in a database of their own on the configured server, each query
    searched there with the hybrid retriever: its hard negatives."""
    from foundation.database import (
        ensure_database_exists,
        migrate,
        resolve_database_url,
        with_database,
    )
    from retrieval.embedders import build_embedder
    from retrieval.reranker_training import index_passages, mine_negatives
    from retrieval.rerankers import NoopReranker
    from retrieval.search import HybridRetriever
    from serve_app.knowledge import connect_store
    from serve_app.wiring import embedder_config, retrieval_config, store_config

    server_url = await resolve_database_url(settings)
    await ensure_database_exists(with_database(server_url, "postgres"), args.database)
    url = with_database(server_url, args.database)
    await asyncio.to_thread(migrate, url, settings.embedding.resolved_dim)
    store = await connect_store(store_config(settings), url)
    try:
        embedder = build_embedder(embedder_config(settings))
        written = await index_passages(store, embedder, pairs)
        docs, chunks = await store.counts()
        print(
            f"negatives: {written} passages embedded ({docs} packages, {chunks} passages "
            f"in database {args.database})",
            file=out,
        )
        retriever = HybridRetriever(store, embedder, NoopReranker(), retrieval_config(settings))
        return await mine_negatives(
            retriever,
            pairs,
            hard=args.hard_negatives,
            random_negatives=args.random_negatives,
            seed=args.seed,
        )
    finally:
        await store.close()


def cmd_train_reranker(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    import dataclasses
    import time
    from collections import Counter

    from retrieval import reranker_training as rt
    from retrieval.rerankers import TRAINED_RERANKER, trained_model_dir

    missing = [
        name for name in ("datasets", "accelerate") if importlib.util.find_spec(name) is None
    ]
    if missing:
        print(
            f"train-reranker needs {' and '.join(missing)} (the 'train' extra): "
            "pip install -e '.[train]'",
            file=sys.stderr,
        )
        return 2
    work = settings.home / "reranker-train"
    config = rt.TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        layers=args.layers,
        max_length=args.max_length,
        seed=args.seed,
        save_steps=args.save_steps,
    )
    started = time.perf_counter()
    pairs_file = work / f"pairs-{rt.data_key(rt.MINING_VERSION, args.per_package, args.seed)}.jsonl"
    if pairs_file.exists():
        pairs = rt.load_pairs(pairs_file)
    else:
        print("pairs: reading installed packages' descriptions and docstrings ...", file=out)
        pairs = rt.mine_pairs(rt.installed_texts(), per_package=args.per_package, seed=args.seed)
        rt.save_jsonl(pairs_file, pairs)
    pairs = pairs[: args.pairs]
    packages = len({p.package for p in pairs})
    print(f"pairs: {len(pairs)} from {packages} packages ({pairs_file})", file=out)
    examples_key = rt.data_key(
        pairs_file.name,
        len(pairs),
        args.hard_negatives,
        args.random_negatives,
        settings.embedding.model,
        settings.retrieval.top_k_vector,
        settings.retrieval.top_k_keyword,
        settings.retrieval.rrf_k,
    )
    examples_file = work / f"examples-{examples_key}.jsonl"
    if examples_file.exists():
        examples = rt.load_examples(examples_file)
    else:
        examples = asyncio.run(_mine_examples(settings, args, pairs, out))
        rt.save_jsonl(examples_file, examples)
    hard = sum(e.hard for e in examples)
    print(
        f"examples: {len(examples)} queries, {hard} hard and "
        f"{sum(len(e.negatives) for e in examples) - hard} random negatives ({examples_file})",
        file=out,
    )
    mined_s = time.perf_counter() - started
    run_dir = work / f"run-{rt.data_key(examples_file.name, dataclasses.asdict(config))}"
    result = rt.train_reranker(
        examples,
        run_dir,
        trained_model_dir(settings.home),
        config,
        progress=not args.quiet,
        manifest={
            "data": "pairs mined from installed packages' long descriptions (heading -> "
            "section) and docstrings (first sentence -> the rest); none from documentation/ "
            "or evals/",
            "pairs_file": str(pairs_file),
            "examples_file": str(examples_file),
            "pairs": len(pairs),
            "packages": packages,
            "pair_kinds": dict(sorted(Counter(p.kind for p in pairs).items())),
            "negatives": f"{args.hard_negatives} hard (hybrid search over the mined passages, "
            f"embedder {settings.embedding.model}) + {args.random_negatives} random per query",
            "checkpoints": str(run_dir),
        },
    )
    if result.steps < config.steps:
        print(f"stopped at step {result.steps} of {config.steps}; run again to resume", file=out)
        return EXIT_FAILURE
    resumed = f", resumed from step {result.resumed_from}" if result.resumed_from else ""
    print(
        f"trained {result.steps} steps on {result.train_rows} rows in "
        f"{result.seconds:.0f} s{resumed} (mining/caches {mined_s:.0f} s)",
        file=out,
    )
    print(f"validation (held-out mined queries): {json.dumps(result.validation)}", file=out)
    print(
        f"model: {result.model_dir}\nuse it: RERANKER=cross-encoder "
        f"RERANKER_MODEL={TRAINED_RERANKER} (or the folder)",
        file=out,
    )
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """The ``train-reranker`` command."""
    tr = sub.add_parser(
        "train-reranker",
        help="train the cross-encoder reranker offline (RERANKER_MODEL=trained)",
        description="Mines (query, passage) pairs from installed packages' descriptions and "
        "docstrings, hard negatives by hybrid search over them (a database of its own, "
        "--database), and fine-tunes the packaged MiniLM as a cross-encoder. Seeded; mined "
        "data and checkpoints are kept under AGENT_SERVICE_HOME/reranker-train, so a re-run "
        "with the same options resumes. The model: AGENT_SERVICE_HOME/models/reranker, used "
        "with RERANKER=cross-encoder RERANKER_MODEL=trained. Heavy: minutes on 2 cores.",
    )
    tr.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    tr.add_argument("--pairs", type=int, default=3000, help="at most this many pairs")
    tr.add_argument("--per-package", type=int, default=40, help="pairs per package at most")
    tr.add_argument("--layers", type=int, default=6, help="MiniLM layers kept (1-6)")
    tr.add_argument("--max-length", type=int, default=256, help="tokens of query + passage")
    tr.add_argument("--batch-size", type=int, default=16)
    tr.add_argument("--learning-rate", type=float, default=5e-5)
    tr.add_argument("--hard-negatives", type=int, default=3)
    tr.add_argument("--random-negatives", type=int, default=1)
    tr.add_argument("--save-steps", type=int, default=50, help="checkpoint every N steps")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--database", default="reranker_train", help="the mining database")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(handler=cmd_train_reranker)
