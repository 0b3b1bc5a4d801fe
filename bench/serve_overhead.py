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
import os
import statistics
import time

import httpx

from bench.loadgen import LoadResult, run_load
from bench.stack import LLM_PORT, agent_env, local_serve, scripted_world, single_process_baseline
from local_world.claims import claims_headers

MODEL_DELAY_MS = 200
PROVIDER_MS = 2 * MODEL_DELAY_MS
STAFF = claims_headers("bench", [("northwind", "business_staff")])
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


def provider_alone(serve_url: str, requests: int) -> LoadResult:
    """The provider's own time for one question, as an HTTP client sees it: the two chat
    requests the agent sent for one ``/ask`` (read back from the scripted server's request
    log), replayed sequentially, ``requests`` times. This is the floor under any agent."""
    llm = f"http://127.0.0.1:{LLM_PORT}"
    httpx.delete(f"{llm}/_requests", timeout=10).raise_for_status()
    ask(serve_url, 1, 1)
    log = httpx.get(f"{llm}/_requests", timeout=10).json()["requests"]
    bodies = [entry["body"] for entry in log if entry["endpoint"] == "chat.completions"]
    if len(bodies) != 2:
        raise RuntimeError(f"expected the agent's 2 chat calls, the model server saw {len(bodies)}")
    latencies: list[float] = []
    started = time.perf_counter()
    with httpx.Client(headers={"authorization": "Bearer bench"}, timeout=30) as client:
        for _ in range(requests + 3):
            t0 = time.perf_counter()
            for body in bodies:
                client.post(f"{llm}/v1/chat/completions", json=body).raise_for_status()
            latencies.append((time.perf_counter() - t0) * 1000)
    httpx.delete(f"{llm}/_requests", timeout=10).raise_for_status()
    return LoadResult(
        requests=requests,
        seconds=time.perf_counter() - started,
        errors=0,
        latencies_ms=tuple(latencies[3:]),  # the first three warm the connection
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="also measure a second Serve application with these settings, side by side "
        "(its own route prefix and replicas), e.g. --also EMBEDDING_DTYPE=float32",
    )
    args = parser.parse_args()
    variants = {
        f"Serve {spec}": dict(pair.split("=", 1) for pair in spec.split(",")) for spec in args.also
    }

    from ray import serve

    from deployments.graph import build_app

    env = agent_env()
    os.environ.update(env)
    results: dict[str, dict[str, list[LoadResult]]] = {}
    provider: list[LoadResult] = []
    ideal = args.concurrency / (PROVIDER_MS / 1000)
    with (
        scripted_world(SCRIPT),
        single_process_baseline(env) as baseline_url,
        local_serve() as serve_url,
    ):
        targets = {"Serve app": serve_url, "single process": baseline_url}
        for i, name in enumerate(variants):
            targets[name] = f"{serve_url}/v{i}"
        results = {t: {"c": [], "one": []} for t in targets}
        serve.run(build_app(), name="agent", route_prefix="/")
        for i, variant_env in enumerate(variants.values()):
            serve.run(build_app({"env": variant_env}), name=f"v{i}", route_prefix=f"/v{i}")
        for url in targets.values():
            wait_ready(url)
            ask(url, args.concurrency, 2 * args.concurrency)  # warm-up (and autoscaling)
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
            provider.append(provider_alone(targets["Serve app"], 30))
            print(f"round {round_ + 1} provider alone   c=1: {provider[-1].line()}", flush=True)

    def med(name: str, kind: str, value: str) -> float:
        return float(statistics.median(float(getattr(r, value)) for r in results[name][kind]))

    provider_p50 = float(statistics.median(r.p50 for r in provider))
    print(f"\nmedians over {args.rounds} rounds")
    print(
        f"provider alone (the agent's two chat calls replayed): c=1 p50 {provider_p50:6.1f} ms "
        f"(+{provider_p50 - PROVIDER_MS:.1f} ms of HTTP and the fake server over its delays)"
    )
    for name in targets:
        rps = med(name, "c", "req_s")
        one = med(name, "one", "p50")
        print(
            f"{name:<15}\n    c={args.concurrency}: {rps:6.1f} req/s ({rps / ideal:.2f} of ideal), "
            f"p50 {med(name, 'c', 'p50'):6.0f} ms, p99 {med(name, 'c', 'p99'):6.0f} ms;  "
            f"\n    c=1: p50 {one:6.1f} ms (+{one - provider_p50:.1f} ms over the provider alone, "
            f"+{one - PROVIDER_MS:.1f} ms over its {PROVIDER_MS} ms of delays)"
        )
    ratio = med("Serve app", "c", "req_s") / med("single process", "c", "req_s")
    print(f"Serve / single process throughput at c={args.concurrency}: {ratio:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
