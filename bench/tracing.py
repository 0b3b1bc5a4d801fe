"""Tracing overhead: /ask through the whole Serve application with tracing off and on, same run.

    python -m bench.tracing [--rounds 5] [--requests 80] [--concurrency 8] [--model-delay-ms 20]

Three copies of the five-deployment application run side by side in one local Ray (each its
own route prefix and replicas; settings through ``build_app({"env": ...})``):

- off: ``OTEL_SDK_DISABLED=true`` (no provider: spans are no-ops, trace ids still flow);
- on, log lines: no collector configured, one compact log line per span (the default);
- on, OTLP: every replica exports over OTLP/HTTP (batch processor) to a local protobuf
  collector in this process.

Payloads are off in all three (``OBSERVE_PAYLOADS=false``, the default). The scripted model
answers each chat call after ``--model-delay-ms`` (one search_docs hop, then the answer), so
the service's own CPU time, where tracing's cost lands, is a visible share of a request.
Rounds alternate the order of the variants; each round measures, per variant, sequential
latency (concurrency 1) and throughput at ``--concurrency``. Reported: medians over rounds,
and each "on" variant's added latency / lost throughput against "off" (goal: <= 5%).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics

from bench.serve_overhead import wait_ready
from bench.serve_settings import load
from local_world.otlp_collector import OtlpCollector, create_otlp_app
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.sensor_service import create_sensor_app
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import build_world

PORT = 8012


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=80, help="per variant per round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model-delay-ms", type=int, default=20)
    args = parser.parse_args()

    import ray
    from ray import serve

    from deployments.graph import build_app

    llm = ScriptedLLM()
    llm.script(
        {"tool_calls": [{"name": "search_docs", "arguments": {"query": "alert cooldown"}}]},
        {"text": "Alerts repeat at most once per cooldown."},
        mode="loop",
        delay_ms=args.model_delay_ms,
    )
    collector = OtlpCollector()
    world = build_world()
    with (
        run_in_thread(create_twin_app(world)) as twin_url,
        run_in_thread(create_sensor_app(world)) as sensor_url,
        run_in_thread(create_llm_app(llm)) as llm_url,
        run_in_thread(create_otlp_app(collector)) as otlp_url,
    ):
        os.environ.update(
            {
                "LLM_BASE_URL": f"{llm_url}/v1",
                "LLM_API_KEY": "bench",
                "ANSWER_MODEL": "local/scripted",
                "TWIN_SERVICE_URL": twin_url,
                "SENSOR_SERVICE_URL": sensor_url,
                "HF_HUB_OFFLINE": "1",
                "RAY_USAGE_STATS_ENABLED": "0",
                "OBSERVE_PAYLOADS": "false",
            }
        )
        variants: dict[str, dict[str, str]] = {
            "off": {"OTEL_SDK_DISABLED": "true"},
            "on, log lines": {"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": ""},
            "on, OTLP": {"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url},
        }
        prefixes = {name: f"/v{i}" for i, name in enumerate(variants)}
        base = f"http://127.0.0.1:{PORT}"
        ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
        try:
            serve.start(
                http_options={"host": "127.0.0.1", "port": PORT},
                logging_config={"enable_access_log": False},
            )
            for name, env in variants.items():
                serve.run(
                    build_app({"env": env}),
                    name=prefixes[name].strip("/"),
                    route_prefix=prefixes[name],
                    blocking=False,
                )
            for name in variants:
                wait_ready(base + prefixes[name])
                asyncio.run(load(base + prefixes[name], args.concurrency, 64))  # warm-up
            print(
                f"model delay {args.model_delay_ms} ms per chat call (2 per question); "
                f"per round and variant: {max(20, args.requests // 4)} sequential requests, "
                f"{args.requests} at concurrency {args.concurrency}; {args.rounds} rounds",
                flush=True,
            )
            rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
            for round_ in range(args.rounds):
                order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
                for name in order:
                    url = base + prefixes[name]
                    seq = asyncio.run(load(url, 1, max(20, args.requests // 4)))
                    par = asyncio.run(load(url, args.concurrency, args.requests))
                    errors = seq["errors"] + par["errors"]
                    rows[name].append((seq["p50_ms"], par["req_s"], par["p50_ms"]))
                    print(
                        f"round {round_ + 1} {name:<14} seq p50 {seq['p50_ms']:6.1f} ms   "
                        f"c={args.concurrency}: {par['req_s']:6.1f} req/s  "
                        f"p50 {par['p50_ms']:6.1f} ms  errors {errors:.0f}",
                        flush=True,
                    )
        finally:
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
        print(f"spans received by the OTLP collector: {len(collector.snapshot())}")

        def med(name: str, i: int) -> float:
            return statistics.median(r[i] for r in rows[name])

        seq0, rps0, p500 = med("off", 0), med("off", 1), med("off", 2)
        print("\nmedians over rounds (vs off; goal: <= 5% added latency / lost throughput)")
        for name in variants:
            seq_ms, rps, p50 = med(name, 0), med(name, 1), med(name, 2)
            print(
                f"{name:<14} seq p50 {seq_ms:6.1f} ms ({(seq_ms / seq0 - 1) * 100:+5.1f}%)   "
                f"req/s {rps:6.1f} ({(1 - rps / rps0) * 100:+5.1f}% lost)   "
                f"p50 at c={args.concurrency} {p50:6.1f} ms ({(p50 / p500 - 1) * 100:+5.1f}%)",
                flush=True,
            )


if __name__ == "__main__":
    main()
