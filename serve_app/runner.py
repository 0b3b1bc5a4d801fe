"""``agent-service serve`` / ``stop``: run the whole service on this machine.

``serve`` brings up, in order: the database (embedded unless DATABASE_URL), the local
twin/sensor simulators (unless turned off), a Ray head node of its own (or the cluster
``RAY_ADDRESS`` names; never some other cluster that happens to run here), and the
Serve applications from ``serve_config.yaml`` (the agent app, plus the local LLM app when no
provider key is set), with the resolved settings injected into their runtime environment. It
returns when ``/readyz`` answers 200. Everything it starts is recorded in
``$AGENT_SERVICE_HOME/run/services.json`` so ``stop`` stops exactly that: the head it
started is found by its own temp dir, so other Ray clusters on the machine (a test suite, a
colleague's) are left running, which ``ray stop`` would not do.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import psutil
import yaml

from foundation.settings import Settings, variables
from local_world.world_file import WorldFileError, load_world_file
from serve_app.local_llm.settings import LOCAL_MODEL_PREFIX, LocalLLMConfigError, LocalLLMSettings

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"
LOCAL_LLM_APP = {
    "name": "llm",
    "route_prefix": "/llm",
    "import_path": "deployments.local_llm:build_local_llm_app",
}


class RunnerError(RuntimeError):
    """Something the operator must fix; the message says what."""


@dataclass
class RunState:
    started_ray: bool = False
    ray_address: str = ""  # GCS address of the head this runner started ("" if none)
    ray_temp_dir: str = ""  # that head's --temp-dir: how stop finds its processes
    simulator_pid: int | None = None
    api_url: str = ""
    dashboard_url: str = ""
    local_llm: bool = False
    notes: list[str] = field(default_factory=list)


def _state_file(settings: Settings) -> Path:
    run = settings.home / "run"
    run.mkdir(parents=True, exist_ok=True)
    return run / "services.json"


def load_state(settings: Settings) -> RunState:
    path = _state_file(settings)
    if not path.exists():
        return RunState()
    data = json.loads(path.read_text())
    known = RunState.__dataclass_fields__
    return RunState(**{k: v for k, v in data.items() if k in known})


def save_state(settings: Settings, state: RunState) -> None:
    _state_file(settings).write_text(json.dumps(asdict(state), indent=2))


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


# Serve's own bookkeeping, slowed from its defaults (a 0.1 s control loop, metrics cached
# every 0.1 s): on 2 cores that idle work took ~31% of a core with the whole app idle, and
# llama.cpp's two threads read and wrote ~15-20% slower beside it (2026-12-03: prompt 24.5 ->
# 28.2 tok/s, generation 5.2 -> 6.4 tok/s, medians of 3; idle 31% -> 21%). The cost: Serve
# notices a change (a dead replica, a scaling decision) up to a second later. The
# environment overrides either.
SERVE_QUIET_DEFAULTS = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}


# The operator's cluster, for this process only: a replica runs on the cluster already (and
# Ray sets its own address there), so these are not copied into the replicas' environment.
DRIVER_ONLY_VARIABLES = frozenset({"RAY_ADDRESS", "RAY_DASHBOARD_ADDRESS"})


def ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "token")  # the CLI tools read ~/.ray/auth_token
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    for name, value in SERVE_QUIET_DEFAULTS.items():
        env.setdefault(name, value)
    return env


def ensure_ray_auth_token(env: dict[str, str]) -> None:
    """Token mode needs a token before ``ray start`` (Ray generates one only from
    ``ray.init``): a fresh machine has none. ``ray get-auth-token --generate`` writes
    ``~/.ray/auth_token`` once; an operator's ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH`` or an
    existing file is left alone. The token goes to the file only, never to our output."""
    if env.get("RAY_AUTH_MODE") != "token" or env.get("RAY_AUTH_TOKEN"):
        return
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return  # the operator's file: a missing one is Ray's error to name
    if (Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token").is_file():
        return
    proc = subprocess.run(
        [_bin("ray"), "get-auth-token", "--generate"],
        capture_output=True,  # stdout is the token itself
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RunnerError(
            f"could not create the Ray auth token (`ray get-auth-token --generate`):\n"
            f"{proc.stderr[-2000:]}"
        )


def gcs_port_closed(address: str, timeout: float = 2.0) -> bool:
    """True when nothing accepts a connection at ``address`` (a GCS ``host:port``): the
    cluster is certainly not running. ``ray status`` against a GCS that is gone (killed, or
    its node stopped) retries for ~45 s before it gives up."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return False  # "auto" or another form: let `ray status` decide
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:  # unreachable or slow: not certain, let `ray status` decide
        return False


def ray_running(address: str) -> bool:
    """Whether the Ray cluster at ``address`` (a GCS host:port, or "auto") answers."""
    if gcs_port_closed(address):
        return False
    proc = subprocess.run(
        [_bin("ray"), "status", f"--address={address}"],
        capture_output=True,
        text=True,
        env=ray_env(),
        timeout=60,
    )
    return proc.returncode == 0


def ray_temp_dir(settings: Settings) -> Path:
    """This service home's own Ray temp dir. Short, under the system temp dir: Ray puts unix
    sockets in it, whose paths may not exceed 107 bytes."""
    digest = hashlib.sha256(str(settings.home.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"agent-service-ray-{digest}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ray_processes(temp_dir: str) -> list[psutil.Process]:
    """The processes of the Ray node started with ``temp_dir``: its daemons (they name the
    temp dir in their arguments), the rest of their process group (the client server does
    not), and every descendant (workers and Serve replicas, which run in groups of their
    own under the raylet)."""
    daemons = []
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if any(temp_dir in arg for arg in args):
            daemons.append(proc)
    groups: set[int] = set()
    for proc in daemons:
        try:
            groups.add(os.getpgid(proc.pid))
        except ProcessLookupError:
            continue
    groups.discard(os.getpgid(0))  # never our own group
    found = {proc.pid: proc for proc in daemons}
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in groups:
                found[proc.pid] = proc
        except (ProcessLookupError, psutil.Error):
            continue
    for proc in list(found.values()):
        try:
            found.update({child.pid: child for child in proc.children(recursive=True)})
        except psutil.Error:
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def stop_ray_node(temp_dir: str, grace_s: float = 10.0) -> int:
    """SIGTERM the Ray node started with ``temp_dir``, SIGKILL what is left after
    ``grace_s``; returns how many processes were stopped."""
    procs = ray_processes(temp_dir)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def use_local_llm(settings: Settings) -> bool:
    if settings.serve.start_local_llm is not None:
        return settings.serve.start_local_llm
    return settings.llm.api_key is None


def local_llm_settings(settings: Settings) -> LocalLLMSettings:
    """The local LLM app's settings: ``settings.local_llm`` (``LOCAL_LLM_*``) with the
    service's home."""
    try:
        return LocalLLMSettings.from_section(settings.local_llm, home=settings.home)
    except LocalLLMConfigError as exc:
        raise RunnerError(str(exc)) from None


def local_model_allowlist(names: tuple[str, ...]) -> list[str]:
    """``ALLOWED_MODELS`` for the local models: each served name, bare and with the agent's
    ``local/`` prefix (the local LLM app accepts both)."""
    return [*names, *(f"{LOCAL_MODEL_PREFIX}{name}" for name in names)]


def service_env(settings: Settings, local_llm: bool) -> dict[str, str]:
    """The settings every replica must agree on, made absolute (a replica's working
    directory is the Ray node's), plus every agent-service variable set in this
    environment. With the local LLM: the agent answers with its first model, and unless
    ``ALLOWED_MODELS`` is set, a per-request override may pick any model it serves
    (``LOCAL_LLM_MODELS``) and nothing else."""
    names = {name for variable in variables() for name in variable.names}
    names -= DRIVER_ONLY_VARIABLES
    env = {k: v for k, v in os.environ.items() if k in names or k.startswith("LOCAL_LLM_")}
    env["AGENT_SERVICE_HOME"] = str(settings.home)
    env["DOC_ROOTS"] = ",".join(
        f"{path.resolve()}={' '.join(acl)}" for path, acl in settings.ingestion.doc_root_acls
    )
    world_file = local_world_file(settings)
    if world_file is not None:
        env["LOCAL_WORLD_FILE"] = str(world_file)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["RAY_AUTH_MODE"] = "token"
    if local_llm:
        served = local_llm_settings(settings).served_models
        env["LLM_BASE_URL"] = f"http://127.0.0.1:{settings.serve.port}/llm/v1"
        env["TOOL_CALLING_MODE"] = "json_schema"
        env["ANSWER_MODEL"] = served[0]
        env["LOCAL_LLM_MODEL_NAME"] = settings.local_llm.model_name
        if not settings.llm.allowed_models:
            env["ALLOWED_MODELS"] = ",".join(local_model_allowlist(served))
    return env


def deploy_config(settings: Settings, local_llm: bool) -> dict[str, Any]:
    """``serve_config.yaml`` with the resolved environment injected and the port set."""
    config: dict[str, Any] = yaml.safe_load(SERVE_CONFIG.read_text())
    config.setdefault("http_options", {})
    config["http_options"]["host"] = settings.serve.host
    config["http_options"]["port"] = settings.serve.port
    env = service_env(settings, local_llm)
    apps: list[dict[str, Any]] = config["applications"]
    if local_llm and not any(app["name"] == LOCAL_LLM_APP["name"] for app in apps):
        apps.append(dict(LOCAL_LLM_APP))
    for app in apps:
        runtime_env = app.setdefault("runtime_env", {})
        runtime_env.setdefault("env_vars", {})
        runtime_env["env_vars"] = {**env, **(runtime_env["env_vars"] or {})}
    return config


def _wait_http(url: str, timeout: float, what: str, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(url, timeout=5, headers=headers)
            if resp.status_code == 200:
                return
            last = f"HTTP {resp.status_code}: {resp.text[:300]}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(1.0)
    raise RunnerError(f"{what} did not become ready within {timeout:.0f}s ({last}) at {url}")


def local_world_file(settings: Settings) -> Path | None:
    """LOCAL_WORLD_FILE made absolute (the simulators and the replicas run elsewhere)."""
    file = settings.serve.local_world_file
    return file.resolve() if file is not None else None


def local_world_name(settings: Settings) -> str:
    """The name of the world LOCAL_WORLD_FILE holds (the sample's when unset); a file that is
    not a valid world stops ``serve`` here, with the file and the bad field named."""
    try:
        return load_world_file(local_world_file(settings)).name
    except WorldFileError as exc:
        raise RunnerError(f"LOCAL_WORLD_FILE: {exc}") from None


def _served_world(twin_url: str) -> str | None:
    """The name of the world a running twin simulator serves (``GET /_control``), if it says."""
    try:
        body = httpx.get(f"{twin_url}/_control", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    world = body.get("world") if isinstance(body, dict) else None
    return world if isinstance(world, str) else None


def start_simulators(settings: Settings, state: RunState) -> None:
    twin_url = settings.tools.twin_service_url
    twin = urlparse(twin_url)
    sensor = urlparse(settings.tools.sensor_service_url)
    if twin.hostname not in {"127.0.0.1", "localhost"}:
        state.notes.append(f"TWIN_SERVICE_URL is {twin_url}: simulators skipped")
        return
    world = local_world_name(settings)
    try:
        httpx.get(f"{twin_url}/buildings", timeout=1)
    except httpx.HTTPError:
        pass
    else:
        served = _served_world(twin_url)
        if served is not None and served != world:
            raise RunnerError(
                f"the simulators already running at {twin_url} serve the world {served!r}, "
                f"not {world!r} (LOCAL_WORLD_FILE): stop them first (agent-service stop)"
            )
        state.notes.append("twin-service already answers: simulators not started")
        return
    world_args = []
    if (world_file := local_world_file(settings)) is not None:
        world_args = ["--world", str(world_file)]
    log = (settings.home / "run" / "local_world.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "local_world",
            "--twin-port",
            str(twin.port or 80),
            "--sensor-port",
            str(sensor.port or 80),
            *world_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # survives this command; `stop` ends it by pid
        cwd=PROJECT_ROOT,
    )
    state.simulator_pid = proc.pid
    # Any response (401 without claims) means the simulator is up.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{twin_url}/buildings", timeout=1)
            return
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RunnerError(
                    "the twin/sensor simulators exited; see "
                    f"{settings.home / 'run' / 'local_world.log'}"
                ) from None
            time.sleep(0.3)
    raise RunnerError("the twin/sensor simulators did not start within 30s")


def start_ray(settings: Settings, state: RunState) -> None:
    """Start this service's own Ray head (loopback only), or reuse the one it started before,
    or use the cluster ``RAY_ADDRESS`` names. A cluster that merely runs on this machine is
    never adopted: stopping the service must not stop someone else's work."""
    operator_address = settings.ray.address
    if operator_address:
        if not ray_running(operator_address):
            raise RunnerError(f"RAY_ADDRESS={operator_address}: no Ray cluster answers there")
        state.notes.append(f"using the Ray cluster at RAY_ADDRESS={operator_address}")
        return
    if state.started_ray and state.ray_address and ray_running(state.ray_address):
        state.notes.append(f"reusing the Ray head started earlier ({state.ray_address})")
        return
    temp_dir = ray_temp_dir(settings)
    port = _free_port()
    cmd = [
        _bin("ray"),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        f"--ray-client-server-port={_free_port()}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={settings.ray.num_cpus}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={settings.ray.dashboard_port}",
        f"--object-store-memory={settings.ray.object_store_mb * 1024 * 1024}",
        "--disable-usage-stats",
    ]
    env = ray_env()
    ensure_ray_auth_token(env)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, timeout=180
    )
    if proc.returncode != 0:
        stop_ray_node(str(temp_dir))  # whatever half-started
        raise RunnerError(f"`ray start` failed:\n{proc.stderr[-2000:]}")
    state.started_ray = True
    state.ray_address = f"127.0.0.1:{port}"
    state.ray_temp_dir = str(temp_dir)


def serve_deploy(config: dict[str, Any], settings: Settings) -> None:
    path = settings.home / "run" / "serve_config.deployed.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)  # it may hold the provider key
    proc = subprocess.run(
        [_bin("serve"), "deploy", str(path), f"--address={_dashboard_address(settings)}"],
        capture_output=True,
        text=True,
        env=ray_env(),
        cwd=PROJECT_ROOT,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RunnerError(f"`serve deploy` failed:\n{proc.stderr[-2000:]}")


def serve(settings: Settings, *, simulators: bool, local_llm: bool | None) -> RunState:
    state = load_state(settings)
    state.notes = []
    llm = use_local_llm(settings) if local_llm is None else local_llm
    if llm:
        from serve_app.local_llm.model_files import ModelFileError, ensure_model_files

        # Join each served model's parts once, before any replica needs them.
        try:
            ensure_model_files(local_llm_settings(settings))
        except ModelFileError as exc:
            raise RunnerError(str(exc)) from None
    if simulators:
        start_simulators(settings, state)
        save_state(settings, state)  # if Ray fails to start, `stop` still ends them
    start_ray(settings, state)
    save_state(settings, state)
    serve_deploy(deploy_config(settings, llm), settings)
    base = f"http://{settings.serve.host}:{settings.serve.port}"
    prefix = settings.http.api_prefix
    if llm:
        _wait_http(f"{base}/llm/health", settings.serve.ready_timeout_s, "the local LLM app")
    _wait_http(f"{base}{prefix}/readyz", settings.serve.ready_timeout_s, "the agent app")
    state.api_url = f"{base}{prefix}"
    state.dashboard_url = f"http://127.0.0.1:{settings.ray.dashboard_port}"
    state.local_llm = llm
    save_state(settings, state)
    return state


def _dashboard_address(settings: Settings) -> str:
    return settings.ray.dashboard_address or f"http://127.0.0.1:{settings.ray.dashboard_port}"


def stop(settings: Settings) -> list[str]:
    state = load_state(settings)
    done: list[str] = []
    ours = state.started_ray and state.ray_address and ray_running(state.ray_address)
    if ours or settings.ray.address:
        subprocess.run(
            [_bin("serve"), "shutdown", "-y", f"--address={_dashboard_address(settings)}"],
            capture_output=True,
            env=ray_env(),
            timeout=120,
        )
        done.append("Serve applications shut down")
    if state.started_ray and state.ray_temp_dir:
        stopped = stop_ray_node(state.ray_temp_dir)
        if stopped:
            done.append(f"Ray head stopped ({stopped} processes; other Ray clusters untouched)")
    if state.simulator_pid:
        try:
            os.killpg(state.simulator_pid, signal.SIGTERM)
            done.append(f"simulators stopped (pid {state.simulator_pid})")
        except ProcessLookupError:
            pass
    save_state(settings, RunState())
    return done
