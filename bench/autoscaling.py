"""Autoscaling observed: replica counts per deployment under a load ramp, from Serve's status API.

    python -m bench.autoscaling [--steps 1,8,32,64,8,1] [--step-seconds 20] [--cooldown-seconds 30]

The whole agent application (five deployments) on a local Ray (4 logical CPUs), set up as
``bench.serve_overhead`` does: the scripted model answers each chat call after
``--model-delay-ms`` (one ``search_docs`` hop, then the answer), it and the twin/sensor
simulators run in their own process (``python -m local_world``), the embedded PostgreSQL with
the sample docs. AgentLoop, ToolProxy and Retriever get autoscaling settings that make
replicas move within seconds on this machine (``build_app({"per_deployment": ...})``):
1 to ``--max-replicas``, a low ``target_ongoing_requests`` each (``--targets``), short
``upscale_delay_s``/``downscale_delay_s``/``look_back_period_s``, and metrics pushed every
``--push-interval-s`` (``metrics_interval_s`` and the RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S
variables; Serve's default is 10 s). Ingress and Reranker keep their defaults.

A closed-loop load (``bench.loadgen``) steps through ``--steps`` concurrencies, each for
``--step-seconds``, then stops for up to ``--cooldown-seconds`` (ending early once every
scaled deployment is back to one replica). Every second a row: time, concurrency, requests
completed in that second and their p50, and each deployment's replicas from
``serve.status()`` (``replica_states``: RUNNING, with ``+n`` STARTING and ``-n`` STOPPING).
Then a summary per step and the settings used. It should show replicas rising under load
and falling back after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.loadgen import LoadResult, run_load
from bench.serve_overhead import SCRIPT, STAFF, wait_ready
from bench.stack import agent_env, local_serve, scripted_world

APP = "agent"
DEPLOYMENTS = ("Ingress", "AgentLoop", "ToolProxy", "Retriever", "Reranker")
SCALED = ("AgentLoop", "ToolProxy", "Retriever")
DEFAULT_TARGETS = "AgentLoop=8,ToolProxy=2,Retriever=2"


@dataclass
class Row:
    t: float
    concurrency: int
    done: int
    p50_ms: float
    replicas: dict[str, tuple[int, int, int]]  # name -> (running, starting, stopping)


@dataclass
class Timeline:
    """Completions (from the load's callback) and per-second rows (from the sampler)."""

    started: float = field(default_factory=time.perf_counter)
    concurrency: int = 0
    completions: list[tuple[float, float, bool]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, latency_ms: float, ok: bool) -> None:
        with self.lock:
            self.completions.append((time.perf_counter() - self.started, latency_ms, ok))


def replica_counts() -> dict[str, tuple[int, int, int]]:
    """(running, starting, stopping) per deployment of the agent app, from serve.status()."""
    from ray import serve

    status = serve.status()
    app = status.applications.get(APP)
    counts: dict[str, tuple[int, int, int]] = {}
    for name in DEPLOYMENTS:
        overview = app.deployments.get(name) if app is not None else None
        states: dict[str, int] = {}
        for state, n in dict(getattr(overview, "replica_states", None) or {}).items():
            states[str(getattr(state, "value", state))] = int(n)
        counts[name] = (
            states.get("RUNNING", 0),
            states.get("STARTING", 0) + states.get("UPDATING", 0) + states.get("RECOVERING", 0),
            states.get("STOPPING", 0),
        )
    return counts


def fmt_replicas(counts: tuple[int, int, int]) -> str:
    running, starting, stopping = counts
    return (
        f"{running}" + (f"+{starting}" if starting else "") + (f"-{stopping}" if stopping else "")
    )


def header() -> str:
    cols = " ".join(f"{name:>9}" for name in DEPLOYMENTS)
    return f"{'t s':>5} {'conc':>4} {'req/s':>6} {'p50 ms':>7} | {cols}"


def sampler(timeline: Timeline, stop: threading.Event) -> None:
    """Every second: one row (completions of the last second, replica counts), printed."""
    print(header(), flush=True)
    next_tick = time.perf_counter() + 1.0
    seen = 0
    while not stop.is_set():
        stop.wait(max(0.0, next_tick - time.perf_counter()))
        next_tick += 1.0
        t = time.perf_counter() - timeline.started
        with timeline.lock:
            new = timeline.completions[seen:]
            seen = len(timeline.completions)
        try:
            counts = replica_counts()
        except Exception as exc:  # a status call that fails once should not end the run
            print(f"serve.status() failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        latencies = [ms for _, ms, _ in new]
        row = Row(
            t=t,
            concurrency=timeline.concurrency,
            done=len(new),
            p50_ms=statistics.median(latencies) if latencies else float("nan"),
            replicas=counts,
        )
        timeline.rows.append(row)
        cols = " ".join(f"{fmt_replicas(counts[name]):>9}" for name in DEPLOYMENTS)
        p50 = f"{row.p50_ms:7.0f}" if latencies else f"{'-':>7}"
        print(f"{t:5.0f} {row.concurrency:>4} {row.done:>6} {p50} | {cols}", flush=True)


def parse_targets(raw: str) -> dict[str, float]:
    targets: dict[str, float] = {}
    for part in raw.split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        if name.strip() not in SCALED or not value:
            raise ValueError(f"--targets: expected NAME=VALUE with NAME in {', '.join(SCALED)}")
        targets[name.strip()] = float(value)
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default="1,8,32,64,8,1", help="concurrency per step")
    parser.add_argument("--step-seconds", type=float, default=20.0)
    parser.add_argument("--cooldown-seconds", type=float, default=30.0)
    parser.add_argument("--model-delay-ms", type=int, default=200)
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument(
        "--targets", default=DEFAULT_TARGETS, help="target_ongoing_requests per deployment"
    )
    parser.add_argument("--upscale-delay-s", type=float, default=2.0)
    parser.add_argument("--downscale-delay-s", type=float, default=5.0)
    parser.add_argument("--look-back-s", type=float, default=5.0)
    parser.add_argument("--push-interval-s", type=float, default=1.0)
    args = parser.parse_args()
    try:
        steps = [int(c) for c in args.steps.split(",") if c.strip()]
        targets = {**parse_targets(DEFAULT_TARGETS), **parse_targets(args.targets)}
    except ValueError as exc:
        parser.error(str(exc))
    if not steps or min(steps) < 1:
        parser.error("--steps: positive concurrencies, e.g. 1,8,32,64,8,1")

    push = str(args.push_interval_s)
    env = agent_env(
        # Read when Serve's modules are imported in the controller, proxy and replicas.
        RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S=push,
        RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S=push,
    )
    os.environ.update(env)

    per_deployment: dict[str, dict[str, Any]] = {
        name: {
            "autoscaling_config": {
                "min_replicas": 1,
                "initial_replicas": 1,
                "max_replicas": args.max_replicas,
                "target_ongoing_requests": targets[name],
                "upscale_delay_s": args.upscale_delay_s,
                "downscale_delay_s": args.downscale_delay_s,
                "look_back_period_s": args.look_back_s,
                # Deprecated but still what Ray 2.60's handles and replicas push by.
                "metrics_interval_s": args.push_interval_s,
            }
        }
        for name in SCALED
    }

    timeline = Timeline()
    stop = threading.Event()
    thread = threading.Thread(target=sampler, args=(timeline, stop), daemon=True)
    step_results: list[tuple[int, float, float, LoadResult]] = []  # (conc, start, end, result)
    with (
        scripted_world({**SCRIPT, "delay_ms": args.model_delay_ms}),
        local_serve() as url,
    ):
        try:
            run_ramp(url, args, steps, per_deployment, timeline, thread, step_results)
        finally:
            stop.set()
            if thread.is_alive():
                thread.join(timeout=10)

    summarize(timeline, step_results)
    print_settings(args, steps, per_deployment)


def run_ramp(
    url: str,
    args: argparse.Namespace,
    steps: list[int],
    per_deployment: dict[str, dict[str, Any]],
    timeline: Timeline,
    thread: threading.Thread,
    step_results: list[tuple[int, float, float, LoadResult]],
) -> None:
    """Deploy the app with ``per_deployment``, warm it up, then run the concurrency steps and
    wait (up to ``--cooldown-seconds``) for the scaled deployments to return to 1 replica."""
    from ray import serve

    from deployments.graph import build_app

    serve.run(build_app({"per_deployment": per_deployment}), name=APP, route_prefix="/")
    wait_ready(url)
    asyncio.run(  # warm-up at concurrency 1 (models loaded, pools open)
        run_load(
            f"{url}/ask", lambda i: {"question": f"warm {i}"}, STAFF, concurrency=1, requests=5
        )
    )
    print_settings(args, steps, per_deployment)
    timeline.started = time.perf_counter()
    thread.start()
    for concurrency in steps:
        timeline.concurrency = concurrency
        start = time.perf_counter() - timeline.started
        result = asyncio.run(
            run_load(
                f"{url}/ask",
                lambda i: {"question": f"bench question {i}"},
                STAFF,
                concurrency=concurrency,
                requests=10**9,
                seconds=args.step_seconds,
                on_result=timeline.record,
            )
        )
        step_results.append((concurrency, start, time.perf_counter() - timeline.started, result))
    timeline.concurrency = 0
    cooldown_end = time.perf_counter() + args.cooldown_seconds
    settled = 0
    while time.perf_counter() < cooldown_end and settled < 3:
        time.sleep(1.0)
        last = timeline.rows[-1].replicas if timeline.rows else {}
        at_min = all(last.get(name, (0, 0, 0)) == (1, 0, 0) for name in SCALED)
        settled = settled + 1 if at_min else 0


def print_settings(
    args: argparse.Namespace, steps: list[int], per_deployment: dict[str, dict[str, Any]]
) -> None:
    print(
        f"\nsettings: model delay {args.model_delay_ms} ms per chat call (2 calls per question), "
        f"steps {','.join(map(str, steps))} x {args.step_seconds:.0f} s, cooldown <= "
        f"{args.cooldown_seconds:.0f} s; RAY_SERVE_{{REPLICA,HANDLE}}_AUTOSCALING_METRIC_"
        f"PUSH_INTERVAL_S={args.push_interval_s}; Ray: 4 logical CPUs"
    )
    for name, options in per_deployment.items():
        print(f"  {name}: {json.dumps(options['autoscaling_config'])}")
    print("  Ingress, Reranker: their deployments/*.py defaults\n", flush=True)


def summarize(timeline: Timeline, steps: list[tuple[int, float, float, LoadResult]]) -> None:
    print(
        f"\n{'step':>4} {'conc':>4} {'t s':>9} {'req/s':>6} {'p50 ms':>7} {'p95 ms':>7} errors | "
        + " ".join(f"{n:>9}" for n in SCALED)
        + "   (max replicas seen, then at step end)"
    )
    for i, (concurrency, start, end, result) in enumerate(steps, start=1):
        rows = [r for r in timeline.rows if start < r.t <= end + 1]
        peak = {n: max((r.replicas[n][0] for r in rows), default=0) for n in SCALED}
        final = rows[-1].replicas if rows else {}
        cols = " ".join(
            f"{f'{peak[n]} -> {final[n][0]}' if n in final else '-':>9}" for n in SCALED
        )
        print(
            f"{i:>4} {concurrency:>4} {start:4.0f}-{end:<4.0f} {result.req_s:6.1f} "
            f"{result.p50:7.0f} {result.p95:7.0f} {result.errors:>6} | {cols}"
        )
    if timeline.rows:
        first, last = timeline.rows[0].replicas, timeline.rows[-1].replicas
        peak_all = {n: max(r.replicas[n][0] for r in timeline.rows) for n in SCALED}
        rose = [n for n in SCALED if peak_all[n] > first[n][0]]
        fell = [n for n in rose if last[n][0] < peak_all[n]]
        print(
            "replicas (start -> peak -> end): "
            + ", ".join(f"{n} {first[n][0]} -> {peak_all[n]} -> {last[n][0]}" for n in SCALED)
        )
        print(
            f"rose under load: {', '.join(rose) or 'none'}; "
            f"fell back after: {', '.join(fell) or 'none'}"
        )


if __name__ == "__main__":
    main()
