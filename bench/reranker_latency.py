"""Rerank latency: milliseconds for one cross-encoder call scoring 20 candidates (p50, p95).

    python -m bench.reranker_latency [--model trained] [--candidates 20] [--calls 60]
        [--threads 1,2] [--words 150]

Issue 16's bar for turning a reranker on by default is at most 30 ms p50 to score the 20
candidates (``TOP_K_RERANK``) of one search on this machine's 2 cores. This loads
``--model`` (a CrossEncoder folder or name; ``trained`` = the folder ``agent-service
train-reranker`` built under ``AGENT_SERVICE_HOME``) through ``CrossEncoderReranker`` and times
``score(query, passages)`` in this process, one call at a time (no Serve, no batching across
requests: the best case for one search), with ``--words``-word passages of the project's
documentation (about the 200 word pieces of a chunk; the model truncates at its own
max length) and each torch thread count of ``--threads``. The first 5 calls are warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERIES = [
    "how do occupancy alerts repeat",
    "what does error code CV-E1022 mean",
    "which sensor types count people",
    "how to rename a room",
    "who may change alert thresholds",
    "why is a sensor reported offline",
]


def passages(words: int, count: int) -> list[str]:
    text: list[str] = []
    for path in sorted((ROOT / "documentation").rglob("*.md")):
        text.extend(path.read_text(encoding="utf-8").split())
    return [" ".join(text[i * words : (i + 1) * words]) for i in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        prog="python -m bench.reranker_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="trained")
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--words", type=int, default=150)
    args = parser.parse_args(argv)

    import torch

    from foundation.settings import load_settings
    from retrieval.rerankers import CrossEncoderReranker, resolve_reranker_model

    folder = resolve_reranker_model(args.model, load_settings().home)
    reranker = CrossEncoderReranker(folder)
    model = reranker._model
    layers = model[0].auto_model.config.num_hidden_layers
    print(
        f"model {folder}: {layers} layers, max length {model.max_seq_length}, "
        f"{os.cpu_count()} CPUs, {args.candidates} candidates of {args.words} words"
    )
    docs = passages(args.words, args.candidates * 3)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        times: list[float] = []
        for i in range(args.calls + 5):
            start = (i * args.candidates) % (len(docs) - args.candidates)
            batch = docs[start : start + args.candidates]
            began = time.perf_counter()
            reranker.score(QUERIES[i % len(QUERIES)], batch)
            if i >= 5:
                times.append((time.perf_counter() - began) * 1000)
        times.sort()
        p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
        print(
            f"threads {threads}: p50 {statistics.median(times):.1f} ms, p95 {p95:.1f} ms "
            f"({args.calls} calls)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
