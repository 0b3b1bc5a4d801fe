"""Shared pieces of the end-to-end stacks: a free port, a scoped environment for the local
Ray's workers (they inherit the driver's environment), waiting for /readyz, a Ray head (and a
worker node) of their own, one Ray head with Serve that the test session's stacks share
(``serve_cluster``), the whole application with the simulators (``agent_stack``), replica
processes via the Ray state API, and load with an action in the middle."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bench.loadgen import LoadResult
from local_world.claims import claims_headers

if TYPE_CHECKING:
    from local_world._service import ServiceControl
    from local_world.scripted_llm import ScriptedLLM


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def scoped_environ(set_vars: Mapping[str, str], unset: tuple[str, ...] = ()) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*set_vars, *unset)}
    for key in unset:
        os.environ.pop(key, None)
    os.environ.update(set_vars)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def wait_ready(url: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)


@contextmanager
def ray_cluster(
    num_cpus: int = 4, object_store_mb: int = 150, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """A Ray head node of its own (``ray start --head --block``) on free ports, dashboard and
    Jobs API included; yields its GCS address. Stopping it stops only this cluster. (An
    in-process ``ray.init`` always puts the dashboard agent on port 52365, which another
    process on the machine may hold: then the Jobs API has no agent.) ``env``: the node's
    environment, which its workers inherit (default: this process's)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    gcs, dashboard, agent = free_port(), free_port(), free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    proc = subprocess.Popen(
        [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--dashboard-agent-listen-port={agent}",
            f"--object-store-memory={object_store_mb * 1024 * 1024}",
            "--disable-usage-stats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # A throwaway cluster on 127.0.0.1 for one test module; the driver here runs with
        # token auth off (this process imported Ray before any RAY_AUTH_MODE could apply).
        env={**(os.environ if env is None else env), "RAY_AUTH_MODE": "disabled"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{dashboard}/", timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("`ray start --head` exited")
            time.sleep(0.5)
        yield f"127.0.0.1:{gcs}"
    finally:
        # A short grace, then SIGKILL to the whole group: `ray start --block`'s own SIGTERM
        # shutdown waits on every process in turn (~35 s) for a cluster that holds nothing.
        os.killpg(proc.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=3)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # As `ray stop` would: forget this cluster, so a later `ray.init()` does not try it.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{gcs}"):
            current.unlink()


# --- the whole application on a local Ray (fault injection, node failure, soak) -----------------

STACK_APP = "agent"
# Variables no stack's replicas may see (a real provider's key, a real trace exporter)
STACK_UNSET = (
    "OPENROUTER_API_KEY",
    "DEEPSEEK_API_KEY",
    "GOOGLE_API_KEY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


@dataclass
class SharedServe:
    """One Ray head with Serve (HTTP on ``url``, proxy on the head) that the session's stacks
    deploy their applications on one after another, each with its settings in its replicas'
    environment (``build_app``'s ``env``), and delete when their module ends: a cluster start
    (``ray start``, the driver's connection, Serve's controller and proxy) and its stop, about
    10 s, once per session instead of once per module."""

    address: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self) -> None:
        """Connect this process to the shared cluster (again, after a test module that ran a
        cluster of its own) and start Serve on it, or find the Serve already running there."""
        import ray
        from ray import serve

        if ray.is_initialized() and not self.connected():
            ray.shutdown()
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False)
        serve.start(
            http_options={"host": "127.0.0.1", "port": self.port}, proxy_location="HeadOnly"
        )

    def connected(self) -> bool:
        """Whether this process is connected to the shared cluster (Ray names it by the
        node's IP address, not 127.0.0.1: compared by the GCS port)."""
        import ray

        if not ray.is_initialized():
            return False
        port = str(ray.get_runtime_context().gcs_address).rsplit(":", 1)[-1]
        return port == self.address.rsplit(":", 1)[-1]

    @contextmanager
    def app(self, *apps: tuple[Any, str, str | None]) -> Iterator[str]:
        """Deploy ``(application, name, route_prefix)`` each, yield the HTTP URL, delete them
        afterwards (the cluster stays for the next module)."""
        from ray import serve

        self.connect()
        try:
            for application, name, prefix in apps:
                serve.run(application, name=name, route_prefix=prefix)
            yield self.url
        finally:
            self.delete(*(name for _, name, _ in apps))

    def delete(self, *names: str, timeout: float = 60) -> None:
        """Delete applications, their replicas killed rather than drained: a graceful stop
        waits seconds per replica (the local LLM's ~15 s), as ``ray.shutdown`` of a cluster
        of its own never did."""
        import ray
        from ray import serve
        from ray.util.state import list_actors

        for name in names:
            with suppress(Exception):
                serve.delete(name, _blocking=False)
        with suppress(Exception):
            for actor in list_actors(
                address=self.address,
                filters=[("state", "=", "ALIVE")],
                limit=1000,
                raise_on_missing_output=False,
            ):
                app = actor.class_name.split(":")[1] if ":" in actor.class_name else ""
                if actor.class_name.startswith("ServeReplica:") and app in names:
                    with suppress(Exception):
                        ray.kill(ray.get_actor(actor.name, namespace=actor.ray_namespace))

        def gone() -> bool:
            return not set(names) & set(serve.status().applications)

        wait_until(gone, timeout, f"Serve to delete {', '.join(names)}", interval=0.1)


@contextmanager
def serve_cluster(num_cpus: int = 4, object_store_mb: int = 150) -> Iterator[SharedServe]:
    """The session's shared Ray head (``ray_cluster``), its environment this process's less
    ``STACK_UNSET``; the driver leaves it (``ray.shutdown``) before it stops."""
    import ray

    env = {k: v for k, v in os.environ.items() if k not in STACK_UNSET}
    env.update({"HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    with ray_cluster(num_cpus=num_cpus, object_store_mb=object_store_mb, env=env) as address:
        try:
            yield SharedServe(address, free_port())
        finally:
            if ray.is_initialized():
                ray.shutdown()


class ThreadServer:
    """An ASGI app served by ``run_in_thread`` on a fixed port that can be stopped and started
    again: a downstream service that goes down (connection refused) and comes back."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._running: AbstractContextManager[str] | None = None

    def start(self) -> str:
        from local_world.servers import run_in_thread

        if self._running is None:
            running = run_in_thread(self.app, port=self.port)
            running.__enter__()
            self._running = running
        return self.url

    def stop(self) -> None:
        if self._running is not None:
            running, self._running = self._running, None
            running.__exit__(None, None, None)


@dataclass
class WorkerNode:
    """A second Ray node on this machine (``ray start --address=<head> --block``)."""

    proc: subprocess.Popen[bytes]
    node_manager_port: int
    log_path: Path
    node_id: str = ""
    stopped_at: float | None = None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60) -> float:
        """Stop this node only: ``sig`` to its process group (raylet, its agents and its
        workers, i.e. the replicas it hosts), as ``ray stop`` would on a machine of its own.
        Returns the seconds the node took to exit."""
        started = time.monotonic()
        self.stopped_at = started
        if self.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        return time.monotonic() - started

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_worker_node(
    address: str,
    log_dir: Path,
    *,
    num_cpus: int = 2,
    resources: Mapping[str, float] | None = None,
    timeout: float = 90,
) -> WorkerNode:
    """Join a worker node to the (already ``ray.init``-connected) cluster at ``address``, on
    free ports of its own; wait until the GCS lists it alive. On failure, raise with the
    node's own output (so the reason is on record)."""
    import json
    import sys

    import ray

    ports = [free_port() for _ in range(6)]
    log_path = log_dir / "ray-worker-node.log"
    ray_bin = str(Path(sys.executable).with_name("ray"))
    command = [
        ray_bin,
        "start",
        f"--address={address}",
        "--block",
        f"--num-cpus={num_cpus}",
        f"--node-manager-port={ports[0]}",
        f"--object-manager-port={ports[1]}",
        f"--metrics-export-port={ports[2]}",
        f"--dashboard-agent-listen-port={ports[3]}",
        f"--dashboard-agent-grpc-port={ports[4]}",
        f"--runtime-env-agent-port={ports[5]}",
        f"--object-store-memory={100 * 1024 * 1024}",
        "--disable-usage-stats",
    ]
    if resources:
        command.append(f"--resources={json.dumps(dict(resources))}")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )
    node = WorkerNode(proc, ports[0], log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in ray.nodes():  # type: ignore[no-untyped-call]
            if entry.get("NodeManagerPort") == ports[0] and entry.get("Alive"):
                node.node_id = str(entry["NodeID"])
                return node
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    node.stop(signal.SIGKILL)
    raise RuntimeError(
        f"the worker node did not join {address} (exit code {proc.returncode}):\n"
        + node.output()[-4000:]
    )


@dataclass
class AgentStack:
    """The five-deployment application on a Ray head of its own (and optionally a worker
    node), with the scripted model server and the twin/sensor simulators in this process."""

    url: str
    address: str
    llm: ScriptedLLM
    twin: ServiceControl
    sensor: ServiceControl
    twin_server: ThreadServer
    sensor_url: str
    worker: WorkerNode | None = None
    app: str = STACK_APP


@contextmanager
def agent_stack(
    database_url: str,
    home: Path,
    *,
    env: Mapping[str, str] | None = None,
    app_args: dict[str, Any] | None = None,
    num_cpus: int = 4,
    worker_resources: Mapping[str, float] | None = None,
    worker_cpus: int = 2,
    shared: SharedServe | None = None,
) -> Iterator[AgentStack]:
    """Start everything, deploy ``build_app(app_args)`` (HTTP proxy on the head only), wait
    for /readyz, yield the stack; stop everything afterwards. ``env`` is added to the
    environment the Ray nodes (and so every replica) start with. ``worker_resources`` (custom
    resources, may be empty) also starts a worker node before the deployment.

    With ``shared`` (and no worker node), the application goes on that cluster instead of a
    Ray head of its own, ``env`` in its replicas' environment, and is deleted afterwards."""
    import ray
    from ray import serve

    from deployments.graph import build_app
    from local_world.scripted_llm import ScriptedLLM, create_llm_app
    from local_world.sensor_service import create_sensor_app
    from local_world.servers import run_in_thread
    from local_world.twin_service import create_twin_app
    from local_world.world import build_world

    world = build_world()
    llm = ScriptedLLM()
    twin_app, sensor_app = create_twin_app(world), create_sensor_app(world)
    twin_server = ThreadServer(twin_app)
    with ExitStack() as stack:
        stack.callback(twin_server.stop)
        twin_url = twin_server.start()
        sensor_url = stack.enter_context(run_in_thread(sensor_app))
        llm_url = stack.enter_context(run_in_thread(create_llm_app(llm)))
        full_env = {
            "DATABASE_URL": database_url,
            "AGENT_SERVICE_HOME": str(home),
            "LLM_BASE_URL": f"{llm_url}/v1",
            "LLM_API_KEY": "test-key",
            "ANSWER_MODEL": "local/scripted",
            "TWIN_SERVICE_URL": twin_url,
            "SENSOR_SERVICE_URL": sensor_url,
            "HF_HUB_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            **(env or {}),
        }
        stack.enter_context(scoped_environ(full_env, STACK_UNSET))
        if shared is not None and worker_resources is None:
            app = build_app({**(app_args or {}), "env": full_env})
            url = stack.enter_context(shared.app((app, STACK_APP, "/")))
            yield _ready_stack(
                url, shared.address, llm, twin_app, sensor_app, sensor_url, twin_server
            )
            return
        if ray.is_initialized():  # connected to the shared cluster: this stack has its own
            ray.shutdown()
        address = stack.enter_context(ray_cluster(num_cpus=num_cpus))
        port = free_port()
        worker: WorkerNode | None = None
        try:
            ray.init(address=address, log_to_driver=False)
            if worker_resources is not None:
                worker = start_worker_node(
                    address, home, num_cpus=worker_cpus, resources=worker_resources
                )
            serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
            serve.run(build_app(app_args), name=STACK_APP, route_prefix="/")
            url = f"http://127.0.0.1:{port}"
            yield _ready_stack(
                url, address, llm, twin_app, sensor_app, sensor_url, twin_server, worker
            )
        finally:
            # No serve.shutdown(): it drains every replica gracefully (~12 s) and the cluster
            # is killed next anyway.
            if ray.is_initialized():
                ray.shutdown()
            if worker is not None:
                worker.stop(signal.SIGKILL)


def _ready_stack(
    url: str,
    address: str,
    llm: ScriptedLLM,
    twin_app: Any,
    sensor_app: Any,
    sensor_url: str,
    twin_server: ThreadServer,
    worker: WorkerNode | None = None,
) -> AgentStack:
    """Wait for the application's /readyz; the stack."""
    from local_world._service import get_control

    wait_ready(url)
    ready = httpx.get(f"{url}/readyz", timeout=10)
    if ready.status_code != 200:
        raise RuntimeError(f"the stack never became ready: {ready.text}")
    return AgentStack(
        url=url,
        address=address,
        llm=llm,
        twin=get_control(twin_app),
        sensor=get_control(sensor_app),
        twin_server=twin_server,
        sensor_url=sensor_url,
        worker=worker,
    )


# --- replicas and their processes ----------------------------------------------------------------


def state_address() -> str | None:
    """The GCS address of the cluster this process is connected to, for Ray's state API:
    without one it asks the cluster last started with ``ray start`` on this machine (after the
    node failure module's own, none; or another test run's)."""
    import ray

    return str(ray.get_runtime_context().gcs_address) if ray.is_initialized() else None


def replica_actors(deployment: str, app: str = STACK_APP) -> list[Any]:
    """The ALIVE replica actors of ``app``'s ``deployment`` (``ActorState``: pid, node_id)."""
    from ray.util.state import list_actors

    return list(
        list_actors(
            address=state_address(),
            filters=[
                ("class_name", "=", f"ServeReplica:{app}:{deployment}"),
                ("state", "=", "ALIVE"),
            ],
            timeout=30,
        )
    )


def proxy_actors() -> list[Any]:
    from ray.util.state import list_actors

    alive = [("class_name", "=", "ProxyActor"), ("state", "=", "ALIVE")]
    return list(list_actors(address=state_address(), filters=alive))


def running_replicas(deployment: str, app: str = STACK_APP) -> int:
    """Replicas Serve reports RUNNING for ``deployment`` (``serve.status()``)."""
    from ray import serve

    application = serve.status().applications.get(app)
    if application is None or deployment not in application.deployments:
        return 0
    states = application.deployments[deployment].replica_states  # keys: the state's value
    return int(
        sum(n for state, n in states.items() if str(getattr(state, "value", state)) == "RUNNING")
    )


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.5
) -> float:
    """Poll ``predicate`` until true; the seconds it took. Fails with ``what`` on timeout."""
    started = time.monotonic()
    last_error: Exception | None = None
    while True:
        try:
            if predicate():
                return time.monotonic() - started
        except Exception as exc:  # e.g. the state API busy while a node goes away
            last_error = exc
        if time.monotonic() - started > timeout:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    rss_mb: float
    fds: int
    sockets: int

    def line(self) -> str:
        return f"pid {self.pid}: RSS {self.rss_mb:.1f} MB, {self.fds} fds ({self.sockets} sockets)"


def process_usage(pid: int) -> ProcessUsage:
    """Resident memory (``VmRSS``) and open file descriptors of a local process (/proc)."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    fd_dir = Path(f"/proc/{pid}/fd")
    fds = sockets = 0
    for entry in fd_dir.iterdir():
        fds += 1
        with suppress(OSError):
            if os.readlink(entry).startswith("socket:"):
                sockets += 1
    return ProcessUsage(pid, rss_kb / 1024.0, fds, sockets)


# --- load with something happening in the middle -------------------------------------------------


@dataclass
class LoadRun:
    """A bench.loadgen run, every request's completion time (seconds since the start) and
    outcome, plus the status codes a probe saw while the load ran."""

    result: LoadResult
    outcomes: list[tuple[float, bool]]
    probes: list[tuple[float, int, str]]  # (seconds, HTTP status or 0, error code)
    action_at: float | None = None
    action_seconds: float | None = None

    @property
    def failures(self) -> list[float]:
        return [t for t, ok in self.outcomes if not ok]

    def error_window(self) -> tuple[float, float] | None:
        """(first, last) failed completion, in seconds since the action (or the start)."""
        failures = self.failures
        if not failures:
            return None
        zero = self.action_at or 0.0
        return min(failures) - zero, max(failures) - zero

    def summary(self) -> str:
        window = self.error_window()
        share = 100.0 * self.result.errors / max(1, self.result.requests)
        text = (
            f"{self.result.requests} requests in {self.result.seconds:.1f} s, "
            f"{self.result.errors} errors ({share:.1f}%)"
        )
        if window is not None:
            text += f", errors from {window[0]:+.2f} s to {window[1]:+.2f} s after the action"
        statuses: dict[str, int] = {}
        for _, status, code in self.probes:
            label = f"{status} {code}".strip()
            statuses[label] = statuses.get(label, 0) + 1
        if statuses:
            text += f"; probe statuses {dict(sorted(statuses.items()))}"
        return text


def run_load_with(
    url: str,
    body: Callable[[int], Any],
    headers: Mapping[str, str],
    *,
    concurrency: int,
    seconds: float,
    action: Callable[[], object] | None = None,
    action_at: float = 0.0,
    probe_body: Callable[[int], Any] | None = None,
    request_timeout: float = 60.0,
) -> LoadRun:
    """``bench.loadgen.run_load`` for ``seconds`` at ``concurrency``; ``action`` (blocking,
    run in a thread) starts ``action_at`` seconds in. With ``probe_body``, one more client
    sends requests one after another and records each status and error code (loadgen only
    counts errors)."""
    import asyncio

    from bench.loadgen import run_load

    outcomes: list[tuple[float, bool]] = []
    probes: list[tuple[float, int, str]] = []
    run = LoadRun(LoadResult(0, 0.0, 0, ()), outcomes, probes)

    async def main() -> None:
        started = time.monotonic()
        stop = asyncio.Event()

        def record(_ms: float, ok: bool) -> None:
            outcomes.append((time.monotonic() - started, ok))

        async def act() -> None:
            if action is None:
                return
            await asyncio.sleep(action_at)
            run.action_at = time.monotonic() - started
            await asyncio.to_thread(action)
            run.action_seconds = time.monotonic() - started - run.action_at

        async def probe() -> None:
            if probe_body is None:
                return
            async with httpx.AsyncClient(timeout=request_timeout) as client:
                i = 0
                while not stop.is_set():
                    status, code = 0, "transport_error"
                    try:
                        resp = await client.post(url, json=probe_body(i), headers=dict(headers))
                        status, code = resp.status_code, ""
                        if status >= 400:
                            with suppress(ValueError, KeyError, TypeError, AttributeError):
                                error = resp.json().get("error") or {}
                                code = str(error.get("code", ""))
                    except httpx.HTTPError:
                        pass
                    probes.append((time.monotonic() - started, status, code))
                    i += 1

        async def load() -> LoadResult:
            try:
                return await run_load(
                    url,
                    body,
                    headers,
                    concurrency=concurrency,
                    requests=10**9,
                    seconds=seconds,
                    request_timeout=request_timeout,
                    on_result=record,
                )
            finally:
                stop.set()

        result, _, _ = await asyncio.gather(load(), act(), probe())
        run.result = result

    asyncio.run(main())
    return run


def claims(sub: str, *memberships: tuple[str, str]) -> dict[str, str]:
    """Headers of a mesh-authenticated caller (``(domain, role)`` memberships)."""
    return claims_headers(sub, memberships)


def chunk_id_for(database_url: str, section: str) -> str:
    """The first chunk whose section path contains ``section``: a citation the scripted model
    can make. Its query runs in a thread of its own (Playwright's sync API keeps a loop
    running in the caller's)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import asyncpg

    async def find() -> str:
        conn = await asyncpg.connect(database_url)
        try:
            value: str = await conn.fetchval(
                "SELECT id FROM chunks WHERE section ILIKE $1 ORDER BY ordinal LIMIT 1",
                f"%{section}%",
            )
            return value
        finally:
            await conn.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, find()).result()
