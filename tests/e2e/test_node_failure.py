"""Node failure (issue 8, item 7): the application on a two-node Ray cluster on this machine.

A head node and a worker node, each started with ``ray start`` (the worker joins the head's
GCS on ports of its own; the HTTP proxy runs on the head only). Ingress, AgentLoop and
ToolProxy run two replicas each; Serve's default SPREAD scheduling puts one of each on either
node, which the test checks through the Ray state API before anything else. Under a steady
load, the worker node alone is stopped (SIGTERM to its process group: its raylet, agents and
the replica processes it hosts, as ``ray stop`` does on a machine of its own; never a
machine-wide ``ray stop``, which would take down every Ray on this host). The application
keeps answering: the failed requests and the error window are reported and bounded, the
worker is reported dead, every deployment is back at its replica count on the head node, and
every request after that succeeds."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.e2e.stack_helpers import (
    AgentStack,
    agent_stack,
    claims,
    replica_actors,
    run_load_with,
    running_replicas,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STAFF = claims("u-staff", ("northwind", "business_staff"))
HARBOR = "bld-northwind-harbor"
SPREAD = ("Ingress", "AgentLoop", "ToolProxy")  # two replicas each, one per node
TARGETS = {**dict.fromkeys(SPREAD, 2), "Retriever": 1, "Reranker": 1}
QUESTION = "Node failure load: what is Harbor Warehouse?"


@pytest.fixture(scope="module")
def stack(sample_docs_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentStack]:
    fixed = {"num_replicas": 2, "autoscaling_config": None}
    with agent_stack(
        sample_docs_url,
        tmp_path_factory.mktemp("node-failure-home"),
        env={"LOG_LEVEL": "WARNING", "ASK_TIMEOUT_SECONDS": "60"},
        app_args={"per_deployment": dict.fromkeys(SPREAD, fixed)},
        num_cpus=4,
        worker_resources={"worker_node": 1},
        worker_cpus=2,
    ) as running:
        yield running


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_app_survives_its_worker_node_stopping_under_load(stack: AgentStack) -> None:
    import ray
    from ray.util.state import list_nodes

    worker = stack.worker
    assert worker is not None and worker.node_id
    nodes = {n.node_id: n for n in list_nodes(filters=[("state", "=", "ALIVE")])}
    (head_id,) = [node_id for node_id, n in nodes.items() if n.is_head_node]
    assert set(nodes) == {head_id, worker.node_id}, nodes
    print(f"[node-failure] head {head_id[:12]}, worker {worker.node_id[:12]} (same host)")

    placement = {d: replica_actors(d) for d in TARGETS}
    for deployment, actors in placement.items():
        where = ["head" if a.node_id == head_id else "worker" for a in actors]
        print(f"[node-failure] {deployment}: {len(actors)} replica(s) on {sorted(where)}")
    for deployment in SPREAD:
        on = {a.node_id for a in placement[deployment]}
        assert on == {head_id, worker.node_id}, f"{deployment} not spread over both nodes"
    on_worker = [int(a.pid) for d in TARGETS for a in placement[d] if a.node_id != head_id]

    stack.llm.script(
        {"tool_calls": [{"name": "get_building", "arguments": {"building_id": HARBOR}}]},
        {"text": "Harbor Warehouse is Northwind's warehouse.", "delay_ms": 20},
        key=QUESTION,
        mode="loop",
    )
    stop_took: list[float] = []
    run = run_load_with(
        f"{stack.url}/ask",
        lambda i: {"question": QUESTION},
        STAFF,
        concurrency=8,
        seconds=30,
        action=lambda: stop_took.append(worker.stop(signal.SIGTERM)),
        action_at=5,
        probe_body=lambda i: {"question": f"{QUESTION} (probe {i})"},
    )
    assert run.action_at is not None and stop_took
    print(f"[node-failure] worker node stopped in {stop_took[0]:.2f} s; load: {run.summary()}")
    window = run.error_window()
    if window is not None:
        print(f"[node-failure] error window {window[1] - window[0]:.2f} s long")
    assert run.result.requests >= 30, run.summary()
    assert run.result.errors <= 0.2 * run.result.requests, run.summary()
    # the window closed while the load still ran: the last 10 s of it were all successes
    assert not run.failures or max(run.failures) < run.result.seconds - 10, run.summary()
    assert {status for _, status, _ in run.probes} <= {200, 500, 502, 503}, run.summary()

    def worker_dead() -> bool:
        entries = [n for n in ray.nodes() if n["NodeID"] == worker.node_id]  # type: ignore[no-untyped-call]
        return bool(entries) and not entries[0]["Alive"]

    wait_until(worker_dead, 60, "the GCS to mark the worker node dead")
    wait_until(lambda: not any(_alive(p) for p in on_worker), 60, "the worker's replicas to exit")
    stopped_at = worker.stopped_at or time.monotonic()

    def recovered() -> bool:
        for deployment, target in TARGETS.items():
            actors = replica_actors(deployment)
            if running_replicas(deployment) != target or len(actors) != target:
                return False
            if any(a.node_id != head_id for a in actors):
                return False
        return True

    wait_until(recovered, 180, "every deployment back at its replica count on the head")
    print(
        f"[node-failure] replica counts {TARGETS} recovered on the head "
        f"{time.monotonic() - stopped_at:.1f} s after the worker was stopped"
    )
    after = run_load_with(
        f"{stack.url}/ask", lambda i: {"question": QUESTION}, STAFF, concurrency=4, seconds=5
    )
    print(f"[node-failure] after recovery: {after.summary()}")
    assert after.result.requests > 0
    assert after.result.errors == 0, after.summary()
