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
every request after that succeeds.

Then, on the same cluster (issue 19, item 5), the hard losses:

* **the worker's raylet killed** (SIGKILL, no shutdown): a new worker node joins, the
  spread deployments' head replicas are replaced until one of each runs on it, and its
  raylet is SIGKILLed under load. Its ``ray start --block`` then kills the node's other
  daemons, and the replica processes exit with their raylet: the node is gone without
  telling the GCS, which finds out through its health checks. Measured as above, plus how
  long the GCS took to mark the node dead.
* **the head's GCS killed** (SIGKILL of ``gcs_server``): without GCS fault tolerance (an
  external Redis, or the alpha RocksDB backend; neither is set up here) Ray cannot recover
  from it, so the test does not pretend: it records what the callers get. The head's
  ``ray start --block`` is paused first so it does not tear the node down at once (as
  ``agent-service serve``'s non-blocking ``ray start --head`` would not); the surviving
  processes give up on the GCS after ``RAY_gcs_rpc_server_reconnect_timeout_s`` (set to
  ``GCS_RECONNECT_S`` here; Ray's default is 60 s). This test runs last: it ends the cluster."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack_helpers import (
    STACK_APP,
    AgentStack,
    LoadRun,
    WorkerNode,
    agent_stack,
    claims,
    run_load_with,
    running_replicas,
    start_worker_node,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STAFF = claims("u-staff", ("northwind", "business_staff"))
HARBOR = "bld-northwind-harbor"
SPREAD = ("Ingress", "AgentLoop", "ToolProxy")  # two replicas each, one per node
TARGETS = {**dict.fromkeys(SPREAD, 2), "Retriever": 1, "Reranker": 1}
QUESTION = "Node failure load: what is Harbor Warehouse?"
GCS_RECONNECT_S = 15  # RAY_gcs_rpc_server_reconnect_timeout_s on this cluster (Ray: 60)


@pytest.fixture(scope="module")
def stack(sample_docs_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentStack]:
    fixed = {"num_replicas": 2, "autoscaling_config": None}
    with agent_stack(
        sample_docs_url,
        tmp_path_factory.mktemp("node-failure-home"),
        env={
            "LOG_LEVEL": "WARNING",
            "ASK_TIMEOUT_SECONDS": "60",
            # read by every Ray process of the cluster: how long one waits for a lost GCS
            "RAY_gcs_rpc_server_reconnect_timeout_s": str(GCS_RECONNECT_S),
        },
        app_args={"per_deployment": dict.fromkeys(SPREAD, fixed)},
        num_cpus=4,
        worker_resources={"worker_node": 1},
        worker_cpus=2,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def node_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("node-failure-nodes")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _head_id(worker: WorkerNode) -> str:
    from ray.util.state import list_nodes

    # (with a dead node on record, the filtered listing counts as "truncated": allow it)
    alive = list_nodes(filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
    nodes = {n.node_id: n for n in alive}
    (head_id,) = [node_id for node_id, n in nodes.items() if n.is_head_node]
    assert set(nodes) == {head_id, worker.node_id}, nodes
    return head_id


def _replicas(deployment: str) -> list[Any]:
    """``replica_actors``, allowing the listing Ray calls "truncated" once dead replicas
    of an earlier loss are on record."""
    from ray.util.state import list_actors

    return list(
        list_actors(
            filters=[
                ("class_name", "=", f"ServeReplica:{STACK_APP}:{deployment}"),
                ("state", "=", "ALIVE"),
            ],
            timeout=30,
            raise_on_missing_output=False,
        )
    )


def _worker_alive(worker: WorkerNode) -> bool:
    import ray

    entries = [n for n in ray.nodes() if n["NodeID"] == worker.node_id]  # type: ignore[no-untyped-call]
    return bool(entries) and bool(entries[0]["Alive"])


def _script_load(stack: AgentStack) -> None:
    stack.llm.script(
        {"tool_calls": [{"name": "get_building", "arguments": {"building_id": HARBOR}}]},
        {"text": "Harbor Warehouse is Northwind's warehouse.", "delay_ms": 20},
        key=QUESTION,
        mode="loop",
    )


def _lose_the_worker(
    stack: AgentStack,
    worker: WorkerNode,
    lose: Callable[[], object],
    tag: str,
    *,
    seconds: float = 30,
    clean_tail: float = 10,
    max_error_share: float | None = 0.2,
) -> LoadRun:
    """Check that the spread deployments run one replica on each node, run the load with
    ``lose`` 5 s in, then wait for the GCS to mark the worker dead, for its replicas to exit
    and for every deployment to be back at its replica count on the head; then a short load
    must see no error. The errors must have stopped ``clean_tail`` seconds before the load
    ended, and (unless None) stay under ``max_error_share`` of the requests. Prints the
    figures; returns the load run."""
    head_id = _head_id(worker)
    print(f"[{tag}] head {head_id[:12]}, worker {worker.node_id[:12]} (same host)")
    placement = {d: _replicas(d) for d in TARGETS}
    for deployment, actors in placement.items():
        where = ["head" if a.node_id == head_id else "worker" for a in actors]
        print(f"[{tag}] {deployment}: {len(actors)} replica(s) on {sorted(where)}")
    for deployment in SPREAD:
        on = {a.node_id for a in placement[deployment]}
        assert on == {head_id, worker.node_id}, f"{deployment} not spread over both nodes"
    on_worker = [int(a.pid) for d in TARGETS for a in placement[d] if a.node_id != head_id]

    # When the GCS marks the worker dead (polled while the load runs).
    marked_dead: list[float] = []
    polling = threading.Event()

    def poll_dead() -> None:
        while not polling.is_set() and not marked_dead:
            try:
                if not _worker_alive(worker):
                    marked_dead.append(time.monotonic())
            except Exception:  # the GCS busy while the node goes away: poll again
                pass
            time.sleep(0.25)

    poller = threading.Thread(target=poll_dead, daemon=True)
    poller.start()
    _script_load(stack)
    try:
        run = run_load_with(
            f"{stack.url}/ask",
            lambda i: {"question": QUESTION},
            STAFF,
            concurrency=8,
            seconds=seconds,
            action=lose,
            action_at=5,
            probe_body=lambda i: {"question": f"{QUESTION} (probe {i})"},
        )
        wait_until(lambda: bool(marked_dead), 90, "the GCS to mark the worker node dead")
    finally:
        polling.set()
        poller.join(timeout=5)
    assert run.action_at is not None and worker.stopped_at is not None
    lost_at = worker.stopped_at
    print(f"[{tag}] load: {run.summary()}")
    print(f"[{tag}] the GCS marked the worker dead {marked_dead[0] - lost_at:.1f} s after the loss")
    window = run.error_window()
    if window is not None:
        print(f"[{tag}] error window {window[1] - window[0]:.2f} s long")
    assert run.result.requests >= 30, run.summary()
    if max_error_share is not None:
        assert run.result.errors <= max_error_share * run.result.requests, run.summary()
    # the window closed while the load still ran: its last seconds were all successes
    assert not run.failures or max(run.failures) < run.result.seconds - clean_tail, run.summary()
    assert {status for _, status, _ in run.probes} <= {200, 500, 502, 503, 504}, run.summary()

    wait_until(lambda: not any(_alive(p) for p in on_worker), 60, "the worker's replicas to exit")

    def recovered() -> bool:
        for deployment, target in TARGETS.items():
            actors = _replicas(deployment)
            if running_replicas(deployment) != target or len(actors) != target:
                return False
            if any(a.node_id != head_id for a in actors):
                return False
        return True

    wait_until(recovered, 180, "every deployment back at its replica count on the head")
    print(
        f"[{tag}] replica counts {TARGETS} recovered on the head "
        f"{time.monotonic() - lost_at:.1f} s after the worker was lost"
    )
    after = run_load_with(
        f"{stack.url}/ask", lambda i: {"question": QUESTION}, STAFF, concurrency=4, seconds=5
    )
    print(f"[{tag}] after recovery: {after.summary()}")
    assert after.result.requests > 0
    assert after.result.errors == 0, after.summary()
    return run


def test_the_app_survives_its_worker_node_stopping_under_load(stack: AgentStack) -> None:
    worker = stack.worker
    assert worker is not None and worker.node_id
    stop_took: list[float] = []
    _lose_the_worker(
        stack, worker, lambda: stop_took.append(worker.stop(signal.SIGTERM)), "node-failure"
    )
    print(f"[node-failure] the worker node took {stop_took[0]:.2f} s to stop")


def _spread_onto(worker: WorkerNode, head_id: str, tag: str) -> None:
    """Replace head replicas of the spread deployments until one of each runs on ``worker``
    (a replacement goes where its deployment has fewest replicas: the new node)."""
    import ray

    started = time.monotonic()
    for _ in range(3):
        missing = [d for d in SPREAD if worker.node_id not in {a.node_id for a in _replicas(d)}]
        if not missing:
            break
        for deployment in missing:
            actor = next(a for a in _replicas(deployment) if a.node_id == head_id)
            ray.kill(ray.get_actor(actor.name, namespace=actor.ray_namespace), no_restart=True)

        def replaced(missing: list[str] = missing) -> bool:
            return all(
                running_replicas(d) == TARGETS[d] and len(_replicas(d)) == TARGETS[d]
                for d in missing
            )

        wait_until(replaced, 120, f"replacements of {missing}")
    print(f"[{tag}] spread onto the new worker in {time.monotonic() - started:.1f} s")


def _raylet(worker: WorkerNode) -> Any:
    import psutil

    for child in psutil.Process(worker.proc.pid).children(recursive=True):
        if child.name() == "raylet":
            return child
    raise AssertionError(f"no raylet under the worker node's `ray start` ({worker.proc.pid})")


def test_the_app_survives_its_worker_raylet_being_killed_under_load(
    stack: AgentStack, node_home: Path
) -> None:
    tag = "raylet-kill"
    worker = start_worker_node(stack.address, node_home, num_cpus=2, resources={"worker_node": 1})
    try:
        head_id = _head_id(worker)
        _spread_onto(worker, head_id, tag)
        raylet = _raylet(worker)

        def kill_raylet() -> None:
            worker.stopped_at = time.monotonic()
            raylet.send_signal(signal.SIGKILL)

        # How many requests fail before the GCS notices is what is measured, not bounded.
        _lose_the_worker(
            stack, worker, kill_raylet, tag, seconds=35, clean_tail=5, max_error_share=None
        )
        exited = worker.proc.wait(timeout=30)
        print(f"[{tag}] the worker's `ray start --block` exited with {exited}")
    finally:
        worker.stop(signal.SIGKILL)


def _head_processes(address: str) -> tuple[Any, Any]:
    """The head's ``gcs_server`` and its ``ray start --head --block`` (found by the GCS
    port in their command lines)."""
    import psutil

    port = address.rsplit(":", 1)[1]
    gcs, monitor = [], []
    for proc in psutil.process_iter(["name", "cmdline"]):
        args = proc.info["cmdline"] or []
        if proc.info["name"] == "gcs_server" and f"--gcs_server_port={port}" in args:
            gcs.append(proc)
        elif "start" in args and "--head" in args and f"--port={port}" in args:
            monitor.append(proc)
    assert len(gcs) == 1 and len(monitor) == 1, (gcs, monitor)
    return gcs[0], monitor[0]


def test_a_killed_gcs_takes_the_service_down_without_fault_tolerance(stack: AgentStack) -> None:
    """Runs last (it ends the cluster). What callers see when the head's GCS is SIGKILLed
    under load, with no GCS fault tolerance configured: recorded, and bounded only by what
    Ray documents (the processes left give up after the reconnect timeout)."""
    import httpx
    import ray

    tag = "gcs-kill"
    gcs, monitor = _head_processes(stack.address)
    # The driver (this process) must not be connected when the GCS dies: after the reconnect
    # timeout Ray would end it, and the test with it.
    ray.shutdown()
    _script_load(stack)
    killed: list[float] = []

    def kill_gcs() -> None:
        monitor.suspend()  # `ray start --block` would kill the node at once (see above)
        killed.append(time.monotonic())
        gcs.kill()

    seconds = GCS_RECONNECT_S + 10
    run = run_load_with(
        f"{stack.url}/ask",
        lambda i: {"question": QUESTION},
        STAFF,
        concurrency=8,
        seconds=seconds,
        action=kill_gcs,
        action_at=3,
        probe_body=lambda i: {"question": f"{QUESTION} (probe {i})"},
        request_timeout=15,
    )
    assert run.action_at is not None and killed
    zero = run.action_at
    ok_after = [t - zero for t, ok in run.outcomes if ok and t > zero]
    failed_after = [t - zero for t, ok in run.outcomes if not ok and t > zero]
    print(f"[{tag}] load: {run.summary()}")
    print(
        f"[{tag}] after the kill: {len(ok_after)} answered (last {max(ok_after, default=0):.1f} s"
        f" after it), {len(failed_after)} failed (first {min(failed_after, default=0):.1f} s "
        f"after it); reconnect timeout {GCS_RECONNECT_S} s"
    )
    statuses: dict[str, list[float]] = {}
    for t, status, code in run.probes:
        if t > zero:
            statuses.setdefault(f"{status} {code}".strip(), []).append(t - zero)
    for label, times in sorted(statuses.items()):
        print(f"[{tag}] probe {label}: {len(times)} from {min(times):.1f} s to {max(times):.1f} s")

    # No recovery: once the processes left gave up on the GCS, nothing answers any more.
    def gone() -> bool:
        try:
            httpx.get(f"{stack.url}/readyz", timeout=5)
        except httpx.HTTPError:
            return True
        return False

    took = wait_until(gone, 90, "the service to stop answering")
    print(
        f"[{tag}] /readyz unreachable {time.monotonic() - killed[0]:.1f} s after the kill "
        f"(waited {took:.1f} s more after the load)"
    )
