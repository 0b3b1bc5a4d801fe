"""The pieces the Serve benchmarks share: the scripted world in its own process, the agent's
settings pointing at it, the single-process baseline, and a local Ray with Serve started on
a loopback port. A library for the benchmarks, not one itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SERVE_PORT, BASELINE_PORT = 8013, 8014
TWIN_PORT, SENSOR_PORT, LLM_PORT = 8121, 8122, 8123


def agent_env(**extra: str) -> dict[str, str]:
    """The agent's settings for the scripted world of ``scripted_world``."""
    return {
        "LLM_BASE_URL": f"http://127.0.0.1:{LLM_PORT}/v1",
        "LLM_API_KEY": "bench",
        "ANSWER_MODEL": "local/scripted",
        "TWIN_SERVICE_URL": f"http://127.0.0.1:{TWIN_PORT}",
        "SENSOR_SERVICE_URL": f"http://127.0.0.1:{SENSOR_PORT}",
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


@contextmanager
def scripted_world(script: Mapping[str, Any]) -> Iterator[None]:
    """The twin/sensor simulators and the scripted model (answering with ``script``) in their
    own process (``python -m local_world``), so they do not share the load generator's
    interpreter."""
    path = Path(tempfile.mkdtemp()) / "script.json"
    path.write_text(json.dumps(script))
    ports = ["--twin-port", str(TWIN_PORT), "--sensor-port", str(SENSOR_PORT)]
    llm = ["--llm-port", str(LLM_PORT), "--llm-script", str(path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_world", *ports, *llm],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        _stop(proc)


@contextmanager
def single_process_baseline(env: Mapping[str, str]) -> Iterator[str]:
    """The same ``Agent`` in one uvicorn process (the spec's architecture); yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve_app.api.single_process", "--port", str(BASELINE_PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    try:
        yield f"http://127.0.0.1:{BASELINE_PORT}"
    finally:
        _stop(proc)


@contextmanager
def local_serve(num_cpus: int = 4) -> Iterator[str]:
    """A private local Ray with Serve's proxy on 127.0.0.1:SERVE_PORT; yields its URL."""
    import ray
    from ray import serve

    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        serve.start(
            http_options={"host": "127.0.0.1", "port": SERVE_PORT},
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        yield f"http://127.0.0.1:{SERVE_PORT}"
    finally:
        if ray.is_initialized():
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
