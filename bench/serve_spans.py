"""Where one ``/ask`` spends its time at concurrency 1, piece by piece, from our own spans.

    python -m bench.serve_spans [--requests 40] [--model-delay-ms 200] [--env KEY=VALUE ...]

The Serve application and the single-process baseline (``serve_app.api.single_process``)
both export their spans over OTLP to a collector in this process; the scripted model answers
each chat call after ``--model-delay-ms`` (one ``search_docs`` hop, then the answer). For each
target, sequential requests after a warm-up; per request, the pieces below are derived from its
own span tree (parent minus children), then the p50 of each piece over the requests is printed:

- ``outside agent.answer``: the client's end-to-end time minus the root span: HTTP, the Serve
  proxy and the Ingress -> AgentLoop handle call (or uvicorn and the route, in one process);
- ``model calls``: the ``gen_ai.chat`` spans (the provider's delay, HTTP and the SDK);
- ``tool dispatch``: ``agent.hop.1`` minus its chat and tool spans (in Serve: the AgentLoop ->
  ToolProxy handle call);
- ``tool -> retriever``: ``tool.search_docs`` minus the ``retrieve.*`` spans (in Serve: the
  ToolProxy -> Retriever handle call);
- ``retrieve.embed``, ``retrieve SQL`` (one round trip for both sides), ``retrieve.rerank``;
- ``loop's own work``: ``agent.answer`` minus all of the above (prompt, parsing, citations).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence

import httpx

from bench.serve_overhead import SCRIPT, STAFF, wait_ready
from bench.stack import agent_env, local_serve, scripted_world, single_process_baseline
from local_world.otlp_collector import CollectedSpan, OtlpCollector, create_otlp_app
from local_world.servers import run_in_thread


def _ms(span: CollectedSpan) -> float:
    return (span.end_ns - span.start_ns) / 1e6


def pieces(spans: Sequence[CollectedSpan], e2e_ms: float) -> dict[str, float]:
    """The request's time split into the pieces the module docstring lists."""
    by_name: dict[str, list[CollectedSpan]] = defaultdict(list)
    for span in spans:
        by_name[span.name].append(span)

    def total(prefix: str) -> float:
        group = [s for name, spans_ in by_name.items() if name.startswith(prefix) for s in spans_]
        return sum(_ms(s) for s in group)

    root = by_name["agent.answer"][0]
    hop1 = by_name["agent.hop.1"][0]
    dispatch = _ms(hop1) - sum(_ms(s) for s in spans if s.parent_span_id == hop1.span_id)
    tool = by_name["tool.search_docs"][0]
    retrieve = [s for s in spans if s.parent_span_id == tool.span_id]
    # vector and keyword cover the same interval (one SQL round trip): count it once.
    sql = max(_ms(s) for s in retrieve if s.name in ("retrieve.vector", "retrieve.keyword"))
    embed = total("retrieve.embed")
    rerank = total("retrieve.rerank")
    chat = total("gen_ai.chat")
    return {
        "end to end (client)": e2e_ms,
        "outside agent.answer": e2e_ms - _ms(root),
        "model calls": chat,
        "tool dispatch": dispatch,
        "tool -> retriever": _ms(tool) - embed - sql - rerank,
        "retrieve.embed": embed,
        "retrieve SQL": sql,
        "retrieve.rerank": rerank,
        "loop's own work": _ms(root) - chat - _ms(tool) - dispatch,
    }


def measure(
    url: str, collector: OtlpCollector, requests: int, warmup: int = 10
) -> dict[str, float]:
    durations: list[tuple[str, float]] = []
    with httpx.Client(timeout=60) as client:
        for i in range(warmup + requests):
            started = time.perf_counter()
            response = client.post(f"{url}/ask", json={"question": f"bench {i}"}, headers=STAFF)
            response.raise_for_status()
            if i >= warmup:
                durations.append(
                    (response.json()["trace_id"], (time.perf_counter() - started) * 1000)
                )
    wanted = {trace_id for trace_id, _ in durations}
    by_trace: dict[str, list[CollectedSpan]] = defaultdict(list)
    needed = {"agent.answer", "agent.hop.1", "tool.search_docs", "retrieve.embed"}

    def complete(trace_id: str) -> bool:
        return needed <= {s.name for s in by_trace[trace_id]}

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        by_trace.clear()
        for span in collector.snapshot():
            if span.trace_id in wanted:
                by_trace[span.trace_id].append(span)
        if all(complete(t) for t in wanted):
            break
        time.sleep(0.5)
    rows = [pieces(by_trace[trace_id], e2e) for trace_id, e2e in durations if complete(trace_id)]
    if len(rows) < len(durations):
        print(f"{len(durations) - len(rows)} of {len(durations)} traces arrived incomplete")
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--model-delay-ms", type=int, default=200)
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="settings for both"
    )
    args = parser.parse_args()

    from ray import serve

    from deployments.graph import build_app

    collector = OtlpCollector()
    results: dict[str, dict[str, float]] = {}
    with run_in_thread(create_otlp_app(collector)) as otlp_url:
        env = agent_env(
            OBSERVE_PAYLOADS="false",
            OTEL_EXPORTER_OTLP_ENDPOINT=otlp_url,
            **dict(pair.split("=", 1) for pair in args.env),
        )
        os.environ.update(env)
        with (
            scripted_world({**SCRIPT, "delay_ms": args.model_delay_ms}),
            single_process_baseline(env) as baseline_url,
            local_serve() as serve_url,
        ):
            targets = {"Serve app": serve_url, "single process": baseline_url}
            serve.run(build_app(), name="agent", route_prefix="/")
            for name, url in targets.items():
                wait_ready(url)
                results[name] = measure(url, collector, args.requests)

    print(
        f"p50 of each piece over {args.requests} sequential requests "
        f"(model delay {args.model_delay_ms} ms x 2 calls)"
    )
    names = list(targets)
    print(f"{'piece':<30}" + "".join(f"{n:>16}" for n in names))
    for key in results[names[0]]:
        print(f"{key:<30}" + "".join(f"{results[n][key]:>13.1f} ms" for n in names))


if __name__ == "__main__":
    main()
