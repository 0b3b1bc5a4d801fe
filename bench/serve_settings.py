"""Serve settings: our serve_config values against Serve's defaults, same run.

    python -m bench.serve_settings [--concurrency 32] [--requests 320]

The whole agent application on a local Ray (4 logical CPUs), the scripted model server
answering each chat call after 200 ms (one search_docs hop, then the answer: 400 ms of model
time per question), the simulators, and the embedded PostgreSQL with the sample docs. Two
variants of the same five deployments:

- ours: the values in deployments/*.py and serve_config.yaml (fractional num_cpus,
  max_ongoing_requests 64-200, autoscaling up to 2 replicas);
- Serve defaults: max_ongoing_requests=5, target_ongoing_requests=2, one replica each,
  with the fractional CPUs kept (Serve's default of 1 CPU per replica cannot even place five
  deployments plus an ingestion job on this machine).

A bounded asyncio httpx load (fixed concurrency, warm-up, a request count) to 127.0.0.1
reports req/s, p50/p95/p99 latency and errors, and the ideal req/s (concurrency / 0.4 s).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import time
from typing import Any

import httpx

from bench.loadgen import run_load
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.sensor_service import create_sensor_app
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import build_world

STAFF = {
    "x-gateway-claims": base64.b64encode(
        json.dumps(
            {"sub": "bench", "memberships": [{"domain": "northwind", "role": "business_staff"}]}
        ).encode()
    ).decode()
}
MODEL_DELAY_MS = 200

VARIANTS: dict[str, dict[str, Any]] = {
    "ours (serve_config.yaml)": {},
    "Serve defaults": {
        "max_ongoing_requests": 5,
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 1,
            "target_ongoing_requests": 2,
        },
    },
}


async def load(url: str, concurrency: int, total: int) -> dict[str, float]:
    """``total`` questions to ``url``/ask at ``concurrency`` (bench.loadgen), as a dict."""
    r = await run_load(
        f"{url}/ask",
        lambda i: {"question": f"bench question {i}"},
        STAFF,
        concurrency=concurrency,
        requests=total,
    )
    return {"req_s": r.req_s, "p50_ms": r.p50, "p95_ms": r.p95, "p99_ms": r.p99, "errors": r.errors}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=320)
    args = parser.parse_args()

    import ray
    from ray import serve

    from deployments.graph import build_app

    llm = ScriptedLLM()
    llm.script(
        {"tool_calls": [{"name": "search_docs", "arguments": {"query": "alert cooldown"}}]},
        {"text": "Alerts repeat at most once per cooldown."},
        mode="loop",
        delay_ms=MODEL_DELAY_MS,
    )
    world = build_world()
    with (
        run_in_thread(create_twin_app(world)) as twin_url,
        run_in_thread(create_sensor_app(world)) as sensor_url,
        run_in_thread(create_llm_app(llm)) as llm_url,
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
            }
        )
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        serve.start(
            http_options={"host": "127.0.0.1", "port": 8011},
            logging_config={"enable_access_log": False},
        )
        url = "http://127.0.0.1:8011"
        ideal = args.concurrency / (2 * MODEL_DELAY_MS / 1000)
        print(
            f"concurrency {args.concurrency}, {args.requests} requests, model time "
            f"{2 * MODEL_DELAY_MS} ms per question, ideal {ideal:.0f} req/s",
            flush=True,
        )
        try:
            for name, options in VARIANTS.items():
                serve.run(
                    build_app({"deployment_options": options}), name="agent", route_prefix="/"
                )
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline:
                    try:
                        if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(1)
                asyncio.run(load(url, args.concurrency, min(64, args.requests)))  # warm-up
                r = asyncio.run(load(url, args.concurrency, args.requests))
                print(
                    f"{name:<26} {r['req_s']:6.1f} req/s ({r['req_s'] / ideal:.2f} of ideal)  "
                    f"p50 {r['p50_ms']:6.0f} ms  p95 {r['p95_ms']:6.0f} ms  "
                    f"p99 {r['p99_ms']:6.0f} ms  errors {r['errors']:.0f}",
                    flush=True,
                )
                serve.delete("agent")
        finally:
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()


if __name__ == "__main__":
    main()
