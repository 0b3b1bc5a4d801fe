"""Reranker throughput: cross-encoder pairs/s with ``@serve.batch`` vs one-by-one calls, same run.

    python -m bench.reranker [--sizes 20,2] [--seconds 8] [--rounds 2] [--concurrency 32]

No cross-encoder ships offline, so the bench builds one from the packaged all-MiniLM-L6-v2
weights (a BERT with a new, randomly initialised one-label head, seed 0) and saves it to a
temporary folder that both sides load (``RERANKER=cross-encoder``, ``RERANKER_MODEL``). Its
scores are meaningless: this measures the mechanics and the throughput of the same network
size as a MiniLM cross-encoder (ms-marco-MiniLM-L-6-v2's shape), not ranking quality.

Three ways of scoring the same requests (a query and ``size`` passages of the project's
documentation, ``--passage-words`` words each), each for ``--seconds`` per round:

- batched: the ``Reranker`` deployment (deployments/reranker.py, one replica) through its
  handle, ``--concurrency`` requests in flight, so ``@serve.batch`` joins up to 8 requests'
  pairs into one cross-encoder call;
- one-by-one: the same deployment, one handle call at a time (every batch is one request);
- in-process: ``CrossEncoderReranker.score`` per request in this process (no Serve at all).

Request sizes: ``--sizes`` (default 20, the retriever's TOP_K_RERANK, and 2, where per-call
overhead dominates and batching should pay most). Torch threads: ``--threads`` on both sides
(default 1: what Ray gives a replica with fractional ``num_cpus``, via OMP_NUM_THREADS).
Rounds alternate the order of the modes; reported: median pairs/s per mode and size, and the
batch speed-up (batched / one-by-one handle calls; batched / in-process).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
PORT = 8017
MODES = ("batched", "one-by-one", "in-process")
QUERIES = [
    "how do occupancy alerts repeat",
    "what does error code CV-E1022 mean",
    "which sensor types count people",
    "capacity rules for a harbor floor",
    "how to rename a room",
    "who may change alert thresholds",
    "why is a sensor reported offline",
    "how does the assistant cite its sources",
]


def passages_from_docs(words_per_passage: int, count: int = 400) -> list[str]:
    """``count`` passages of consecutive words from the documentation (deterministic)."""
    words: list[str] = []
    for path in sorted((ROOT / "documentation").rglob("*.md")):
        words.extend(path.read_text(encoding="utf-8").split())
    if len(words) < words_per_passage:
        raise SystemExit("bench.reranker: the documentation/ folder has too little text")
    rng = random.Random(0)
    starts = [rng.randrange(0, len(words) - words_per_passage + 1) for _ in range(count)]
    return [" ".join(words[s : s + words_per_passage]) for s in starts]


def requests_for(size: int, passages: list[str], n: int = 64) -> list[tuple[str, list[str]]]:
    rng = random.Random(size)
    return [(QUERIES[i % len(QUERIES)], rng.sample(passages, size)) for i in range(n)]


def build_cross_encoder(folder: Path) -> None:
    """A CrossEncoder (MiniLM body, new 1-label head) saved in ``folder``."""
    import torch
    from sentence_transformers import CrossEncoder

    from retrieval.embedders import resolve_local_model

    torch.manual_seed(0)
    model = CrossEncoder(
        resolve_local_model("all-MiniLM-L6-v2"),
        num_labels=1,
        max_length=256,
        local_files_only=True,
        device="cpu",
    )
    model.save(str(folder), create_model_card=False)


async def timed_concurrent(
    call: Callable[[str, list[str]], Awaitable[object]],
    requests: list[tuple[str, list[str]]],
    concurrency: int,
    seconds: float,
) -> tuple[int, float]:
    """(pairs scored, elapsed s): ``concurrency`` workers calling until ``seconds`` pass."""
    pairs = 0
    next_index = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def worker() -> None:
        nonlocal pairs, next_index
        while time.perf_counter() < deadline:
            query, batch = requests[next_index % len(requests)]
            next_index += 1
            await call(query, batch)
            pairs += len(batch)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return pairs, time.perf_counter() - started


def timed_sequential(
    call: Callable[[str, list[str]], object],
    requests: list[tuple[str, list[str]]],
    seconds: float,
) -> tuple[int, float]:
    pairs = 0
    i = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        query, batch = requests[i % len(requests)]
        i += 1
        call(query, batch)
        pairs += len(batch)
    return pairs, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="20,2", help="passages per request, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="per mode, size and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32, help="batched mode's in-flight")
    parser.add_argument("--passage-words", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        parser.error("--sizes: positive integers, e.g. 20,2")

    env = {
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "LOG_LEVEL": "WARNING",
        "OMP_NUM_THREADS": str(args.threads),
    }
    os.environ.update(env)

    import ray
    import torch
    from ray import serve

    from deployments.reranker import RerankerDeployment
    from retrieval.rerankers import CrossEncoderReranker

    torch.set_num_threads(args.threads)
    model_dir = Path(tempfile.mkdtemp(prefix="bench-cross-encoder-"))
    started = time.perf_counter()
    build_cross_encoder(model_dir)
    print(
        f"cross-encoder (MiniLM body, random head) built in {model_dir} in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    env |= {"RERANKER": "cross-encoder", "RERANKER_MODEL": str(model_dir)}
    os.environ.update(env)

    local = CrossEncoderReranker(str(model_dir))
    passages = passages_from_docs(args.passage_words)
    workloads = {size: requests_for(size, passages) for size in sizes}
    # results[size][mode] = pairs/s per round
    results: dict[int, dict[str, list[float]]] = {s: {m: [] for m in MODES} for s in sizes}
    try:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        serve.start(
            http_options={"host": "127.0.0.1", "port": PORT},
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        deployment = cast(Any, RerankerDeployment).options(
            autoscaling_config={"min_replicas": 1, "max_replicas": 1, "initial_replicas": 1},
            ray_actor_options={"num_cpus": 0.25, "runtime_env": {"env_vars": env}},
        )
        handle = serve.run(deployment.bind(), name="reranker-bench", route_prefix=None)

        async def via_handle(query: str, batch: list[str]) -> object:
            scores: list[float] = await handle.score.remote(query, batch)
            if len(scores) != len(batch):
                raise RuntimeError(f"{len(scores)} scores for {len(batch)} passages")
            return scores

        async def run_mode(mode: str, size: int, seconds: float) -> tuple[int, float]:
            requests = workloads[size]
            if mode == "batched":
                return await timed_concurrent(via_handle, requests, args.concurrency, seconds)
            if mode == "one-by-one":
                return await timed_concurrent(via_handle, requests, 1, seconds)
            # In this process, on this thread: nothing else is in flight meanwhile.
            return timed_sequential(local.score, requests, seconds)

        async def run_all() -> None:
            for size in sizes:  # warm-up: models loaded, first batches run
                for mode in MODES:
                    await run_mode(mode, size, 2.0)
            print(
                f"torch threads {args.threads} on both sides; {args.passage_words}-word "
                f"passages; {args.rounds} round(s) of {args.seconds:.0f} s per mode and size; "
                f"batched at concurrency {args.concurrency} (@serve.batch: up to 8 requests)",
                flush=True,
            )
            for round_ in range(args.rounds):
                order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
                for size in sizes:
                    for mode in order:
                        pairs, elapsed = await run_mode(mode, size, args.seconds)
                        rate = pairs / elapsed
                        results[size][mode].append(rate)
                        print(
                            f"round {round_ + 1}  {size:>3} passages/request  {mode:<11} "
                            f"{rate:8.1f} pairs/s  ({pairs} pairs in {elapsed:.1f} s)",
                            flush=True,
                        )

        asyncio.run(run_all())
    finally:
        if ray.is_initialized():
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
        shutil.rmtree(model_dir, ignore_errors=True)

    print(f"\nmedians over {args.rounds} round(s), pairs/s")
    print(
        f"{'passages/request':>16} | "
        + " | ".join(f"{m:>11}" for m in MODES)
        + " | batched/one-by-one | batched/in-process"
    )
    for size in sizes:
        med = {m: statistics.median(results[size][m]) for m in MODES}
        print(
            f"{size:>16} | "
            + " | ".join(f"{med[m]:11.1f}" for m in MODES)
            + f" | {med['batched'] / med['one-by-one']:18.2f}"
            + f" | {med['batched'] / med['in-process']:18.2f}"
        )


if __name__ == "__main__":
    main()
