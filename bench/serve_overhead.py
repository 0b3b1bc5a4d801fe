"""Serve overhead: the whole Serve application against the same agent core in one plain
FastAPI/uvicorn process (the spec's architecture), same run.

    python -m bench.serve_overhead [--rounds 3] [--requests 640] [--concurrency 64]

The scripted model answers every chat call after 200 ms (one ``search_docs`` hop, then the
answer: 400 ms of provider time per question); it and the twin/sensor simulators run in their
own process (``python -m local_world``) so they do not share the load generator's interpreter.
Both servers read the same embedded PostgreSQL. Per round, in alternating order, each target
gets ``--requests`` questions at ``--concurrency`` and 30 at concurrency 1.

Reported (medians over rounds): req/s and latency percentiles; the Serve/baseline throughput
ratio at the concurrency (goal >= 0.8); the added latency over the provider's 400 ms at
concurrency 1 (goal <= 15 ms p50 for Serve); and each target's share of the ideal
(req/s / (concurrency / 0.4 s)).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.loadgen import LoadResult, run_load

MODEL_DELAY_MS = 200
PROVIDER_MS = 2 * MODEL_DELAY_MS
SERVE_PORT, BASELINE_PORT = 8013, 8014
TWIN_PORT, SENSOR_PORT, LLM_PORT = 8121, 8122, 8123
STAFF = {
    "x-gateway-claims": base64.b64encode(
        json.dumps(
            {"sub": "bench", "memberships": [{"domain": "northwind", "role": "business_staff"}]}
        ).encode()
    ).decode()
}
SCRIPT = {
    "mode": "loop",
    "delay_ms": MODEL_DELAY_MS,
    "steps": [
        {"tool_calls": [{"name": "search_docs", "arguments": {"query": "alert cooldown"}}]},
        {"text": "Alerts repeat at most once per cooldown."},
    ],
}


def wait_ready(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} is not ready after {timeout:.0f} s")


def ask(url: str, concurrency: int, requests: int) -> LoadResult:
    return asyncio.run(
        run_load(
            f"{url}/ask",
            lambda i: {"question": f"bench question {i}"},
            STAFF,
            concurrency=concurrency,
            requests=requests,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()

    import ray
    from ray import serve

    from serve_app.app import build_app

    env = {
        "LLM_BASE_URL": f"http://127.0.0.1:{LLM_PORT}/v1",
        "LLM_API_KEY": "bench",
        "ANSWER_MODEL": "local/scripted",
        "TWIN_SERVICE_URL": f"http://127.0.0.1:{TWIN_PORT}",
        "SENSOR_SERVICE_URL": f"http://127.0.0.1:{SENSOR_PORT}",
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(json.dumps(SCRIPT))
    py = sys.executable
    world = subprocess.Popen(
        [
            py,
            "-m",
            "local_world",
            "--twin-port",
            str(TWIN_PORT),
            "--sensor-port",
            str(SENSOR_PORT),
            "--llm-port",
            str(LLM_PORT),
            "--llm-script",
            str(script),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    baseline = subprocess.Popen(
        [py, "-m", "serve_app.api.single_process", "--port", str(BASELINE_PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    targets = {
        "Serve app": f"http://127.0.0.1:{SERVE_PORT}",
        "single process": f"http://127.0.0.1:{BASELINE_PORT}",
    }
    results: dict[str, dict[str, list[LoadResult]]] = {t: {"c": [], "one": []} for t in targets}
    try:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        serve.start(
            http_options={"host": "127.0.0.1", "port": SERVE_PORT},
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        serve.run(build_app(), name="agent", route_prefix="/")
        for url in targets.values():
            wait_ready(url)
            ask(url, args.concurrency, 2 * args.concurrency)  # warm-up (and autoscaling)
        ideal = args.concurrency / (PROVIDER_MS / 1000)
        print(
            f"provider time {PROVIDER_MS} ms per question; concurrency {args.concurrency}: "
            f"ideal {ideal:.0f} req/s; {args.rounds} rounds of {args.requests} requests",
            flush=True,
        )
        for round_ in range(args.rounds):
            order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
            for name in order:
                loaded = ask(targets[name], args.concurrency, args.requests)
                single = ask(targets[name], 1, 30)
                results[name]["c"].append(loaded)
                results[name]["one"].append(single)
                print(
                    f"round {round_ + 1} {name:<15} c={args.concurrency}: {loaded.line()}\n"
                    f"{'':<23} c=1: {single.line()}",
                    flush=True,
                )
    finally:
        if ray.is_initialized():
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
        for proc in (baseline, world):
            proc.terminate()
            proc.wait(timeout=30)

    def med(name: str, kind: str, value: str) -> float:
        return float(statistics.median(float(getattr(r, value)) for r in results[name][kind]))

    print(f"\nmedians over {args.rounds} rounds")
    for name in targets:
        rps = med(name, "c", "req_s")
        print(
            f"{name:<15} c={args.concurrency}: {rps:6.1f} req/s ({rps / ideal:.2f} of ideal), "
            f"p50 {med(name, 'c', 'p50'):6.0f} ms, p99 {med(name, 'c', 'p99'):6.0f} ms;  "
            f"c=1: p50 {med(name, 'one', 'p50'):6.1f} ms "
            f"(+{med(name, 'one', 'p50') - PROVIDER_MS:.1f} ms over the provider)"
        )
    ratio = med("Serve app", "c", "req_s") / med("single process", "c", "req_s")
    print(f"Serve / single process throughput at c={args.concurrency}: {ratio:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
