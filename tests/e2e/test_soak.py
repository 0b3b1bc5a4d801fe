"""Soak (issue 8, item 8): concurrency 64 for 60 s against the whole Serve application with
the scripted model (a 20 ms delay per reply). One replica per deployment (fixed, so the same
processes are measured before and after). A 10 s warm-up at the same concurrency fills the
connection pools and caches first; then every replica's and the HTTP proxy's resident memory
and open file descriptors (sockets among them) are read from /proc before and after the
60 s. Zero errors; memory roughly flat; no descriptor or connection growth that scales with
the requests served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.stack_helpers import (
    AgentStack,
    ProcessUsage,
    SharedServe,
    agent_stack,
    claims,
    process_usage,
    proxy_actors,
    replica_actors,
    run_load_with,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CONCURRENCY = 64
SECONDS = 60
WARMUP_SECONDS = 10
DEPLOYMENTS = ("Ingress", "AgentLoop", "ToolProxy", "Retriever", "Reranker")
MAX_GROWTH_MB = 200.0
MAX_GROWTH_SHARE = 0.5
MAX_FD_GROWTH = CONCURRENCY  # pools may still settle; a leak per request would be thousands

STAFF = claims("u-soak", ("northwind", "business_staff"))
QUESTIONS = (
    "Soak: what is Harbor Warehouse?",  # get_building: AgentLoop -> ToolProxy -> twin
    "Soak: which sensors does Harbor Warehouse have?",  # list_sensors: twin and sensor
    "Soak: how often do alerts repeat?",  # search_docs: ToolProxy -> Retriever -> Postgres
    "Soak: hello there",  # no tool
)


@pytest.fixture(scope="module")
def stack(
    sample_docs_url: str, tmp_path_factory: pytest.TempPathFactory, shared_serve: SharedServe
) -> Iterator[AgentStack]:
    with agent_stack(
        sample_docs_url,
        tmp_path_factory.mktemp("soak-home"),
        env={"LOG_LEVEL": "WARNING"},
        app_args={"deployment_options": {"num_replicas": 1, "autoscaling_config": None}},
        shared=shared_serve,
    ) as running:
        yield running


def _script(stack: AgentStack) -> None:
    harbor = {"building_id": "bld-northwind-harbor"}
    steps: list[list[dict[str, Any]]] = [
        [
            {"tool_calls": [{"name": "get_building", "arguments": harbor}]},
            {"text": "Harbor Warehouse is Northwind's warehouse."},
        ],
        [
            {"tool_calls": [{"name": "list_sensors", "arguments": harbor}]},
            {"text": "Loading Dock A has all five sensor types."},
        ],
        [
            {"tool_calls": [{"name": "search_docs", "arguments": {"query": "alert cooldown"}}]},
            {"text": "Alerts repeat at most once per cooldown."},
        ],
        [{"text": "Hello! Ask me about buildings, rooms or sensors."}],
    ]
    for question, script in zip(QUESTIONS, steps, strict=True):
        stack.llm.script(*script, key=question, mode="loop", delay_ms=20)


def _body(i: int) -> dict[str, Any]:
    return {"question": QUESTIONS[i % len(QUESTIONS)]}


def _processes() -> dict[str, tuple[str, int]]:
    """label -> (actor id, pid) of every replica and the HTTP proxy."""
    found: dict[str, tuple[str, int]] = {}
    for deployment in DEPLOYMENTS:
        (actor,) = replica_actors(deployment)
        found[deployment] = (actor.actor_id, int(actor.pid))
    (proxy,) = proxy_actors()
    found["ProxyActor"] = (proxy.actor_id, int(proxy.pid))
    return found


def test_soak_at_concurrency_64_for_60_seconds(stack: AgentStack) -> None:
    _script(stack)
    warm = run_load_with(
        f"{stack.url}/ask", _body, STAFF, concurrency=CONCURRENCY, seconds=WARMUP_SECONDS
    )
    print(f"[soak] warm-up: {warm.summary()}")
    assert warm.result.errors == 0, warm.summary()

    processes = _processes()
    before: dict[str, ProcessUsage] = {k: process_usage(pid) for k, (_, pid) in processes.items()}
    stack.llm.clear_requests()  # the scripted server's log is this process's memory, not theirs
    run = run_load_with(f"{stack.url}/ask", _body, STAFF, concurrency=CONCURRENCY, seconds=SECONDS)
    time.sleep(3)  # let the last responses and their cleanup finish
    after: dict[str, ProcessUsage] = {k: process_usage(pid) for k, (_, pid) in processes.items()}
    print(f"[soak] {CONCURRENCY} concurrent for {SECONDS} s: {run.summary()}")
    print(
        f"[soak] {run.result.req_s:.1f} req/s, p50 {run.result.p50:.0f} ms, "
        f"p95 {run.result.p95:.0f} ms, p99 {run.result.p99:.0f} ms"
    )
    for label in processes:
        b, a = before[label], after[label]
        print(
            f"[soak] {label:<10} pid {b.pid}: RSS {b.rss_mb:.1f} -> {a.rss_mb:.1f} MB "
            f"({a.rss_mb - b.rss_mb:+.1f}), fds {b.fds} -> {a.fds} ({a.fds - b.fds:+d}), "
            f"sockets {b.sockets} -> {a.sockets} ({a.sockets - b.sockets:+d})"
        )

    assert run.result.requests >= CONCURRENCY, run.summary()
    assert run.result.errors == 0, run.summary()
    assert _processes() == processes  # no replica restarted during the soak
    for label in processes:
        b, a = before[label], after[label]
        growth = a.rss_mb - b.rss_mb
        assert growth < MAX_GROWTH_MB and growth < MAX_GROWTH_SHARE * b.rss_mb, (label, b, a)
        assert a.fds - b.fds <= MAX_FD_GROWTH, (label, b, a)
        assert a.sockets - b.sockets <= MAX_FD_GROWTH, (label, b, a)
