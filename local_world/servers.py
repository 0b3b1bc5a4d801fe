"""Run the local-world apps over real HTTP: in a background thread (tests) or from the CLI."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from local_world._service import Faults
from local_world.clock import Clock, FixedClock, system_clock
from local_world.scripted_llm import DEFAULT_EMBEDDING_DIM, ScriptedLLM, create_llm_app
from local_world.sensor_service import create_sensor_app
from local_world.twin_service import create_twin_app
from local_world.world import load_world
from local_world.world_file import WorldFileError

DEFAULT_TWIN_PORT = 8101
DEFAULT_SENSOR_PORT = 8102
# The variable naming the world file (a setting of the service, ``LOCAL_WORLD_FILE``, which
# ``agent-service serve`` passes on as ``--world``); read here only as ``--world``'s default.
WORLD_FILE_VARIABLE = "LOCAL_WORLD_FILE"


def _base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.contextmanager
def run_in_thread(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 10.0,
    shutdown_timeout: float = 5.0,
) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on ``host:port`` (0: a free port) in a daemon thread;
    yield its base URL; stop it on exit (in-flight requests get ``shutdown_timeout``
    seconds, then are cancelled)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=max(1, round(shutdown_timeout)),
    )
    server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # SystemExit from a failed startup, too
            errors.append(exc)

    thread = threading.Thread(target=target, name=f"local-world:{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(shutdown_timeout)
            sock.close()
            raise RuntimeError(f"server on port {bound_port} did not start: {errors or 'timeout'}")
        time.sleep(0.01)
    try:
        yield _base_url(host, bound_port)
    finally:
        server.should_exit = True
        thread.join(shutdown_timeout + 2.0)
        sock.close()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m local_world",
        description="Run the local CrowdVision world: twin-service, sensor-service and "
        "optionally a scripted OpenAI-compatible model server.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--twin-port", type=int, default=DEFAULT_TWIN_PORT)
    parser.add_argument("--sensor-port", type=int, default=DEFAULT_SENSOR_PORT)
    parser.add_argument(
        "--llm-port", type=int, default=None, help="also start the scripted LLM (0: free port)"
    )
    parser.add_argument(
        "--llm-script",
        type=Path,
        action="append",
        default=[],
        help="JSON script file to preload (a script object or a list of them); repeatable",
    )
    parser.add_argument(
        "--embedding-dim",
        type=int,
        default=DEFAULT_EMBEDDING_DIM,
        help="scripted LLM embedding size when a request names no 'dimensions'",
    )
    parser.add_argument(
        "--world",
        type=Path,
        default=os.environ.get(WORLD_FILE_VARIABLE) or None,
        help="the estate to serve: a world file (YAML or JSON, local_world/README.md); "
        f"default: ${WORLD_FILE_VARIABLE}, else the sample world",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="readings seed (default: the world file's)"
    )
    parser.add_argument(
        "--pin-time", default=None, help="freeze the clock at this ISO-8601 instant"
    )
    parser.add_argument("--latency-ms", type=int, default=0, help="sensor-service latency")
    parser.add_argument("--fail-rate", type=float, default=0.0, help="sensor-service 500 rate")
    parser.add_argument(
        "--leak-foreign-rooms",
        action="store_true",
        help="sensor-service registry answers include other buildings' devices",
    )
    return parser.parse_args(argv)


def _load_llm(paths: Sequence[Path], embedding_dim: int) -> ScriptedLLM:
    llm = ScriptedLLM(embedding_dim=embedding_dim)
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        many = isinstance(data, list) and all(isinstance(s, dict) and "steps" in s for s in data)
        for script in data if many else [data]:
            llm.load(script)
    return llm


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    clock: Clock = FixedClock(args.pin_time) if args.pin_time else system_clock
    try:
        world = load_world(args.world, args.seed)
    except WorldFileError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 2
    sensor_faults = Faults(
        fail_rate=args.fail_rate,
        latency_ms=args.latency_ms,
        leak_foreign_rooms=args.leak_foreign_rooms,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with contextlib.ExitStack() as stack:
        twin = stack.enter_context(
            run_in_thread(create_twin_app(world, clock=clock), host=args.host, port=args.twin_port)
        )
        sensor = stack.enter_context(
            run_in_thread(
                create_sensor_app(world, clock=clock, faults=sensor_faults),
                host=args.host,
                port=args.sensor_port,
            )
        )
        lines = [
            f"world           {world.name} ({args.world or 'the sample world'})",
            f"twin-service    {twin}",
            f"sensor-service  {sensor}",
        ]
        env = [f"TWIN_SERVICE_URL={twin}", f"SENSOR_SERVICE_URL={sensor}"]
        if args.llm_port is not None:
            llm_app = create_llm_app(_load_llm(args.llm_script, args.embedding_dim))
            llm = stack.enter_context(run_in_thread(llm_app, host=args.host, port=args.llm_port))
            lines.append(f"scripted-llm    {llm}/v1")
            env.append(f"LLM_BASE_URL={llm}/v1")
        print("\n".join(lines), flush=True)
        print("# " + " ".join(env), flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
