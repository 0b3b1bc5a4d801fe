"""Running the apps: the in-thread helper and the ``python -m local_world`` entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from lw_helpers import ADMIN

from local_world.servers import run_in_thread

ROOT = Path(__file__).resolve().parents[2]


def test_run_in_thread_serves_then_shuts_down_cleanly() -> None:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    with run_in_thread(app) as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/ping").json() == {"pong": "yes"}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/ping", timeout=1.0)


def test_cli_starts_all_three_and_stops_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"key": "hello", "steps": [{"text": "hi from the CLI"}]}))
    process = subprocess.Popen(
        [
            sys.executable, "-m", "local_world",
            "--twin-port", "0", "--sensor-port", "0", "--llm-port", "0",
            "--llm-script", str(script), "--pin-time", "2025-03-04T10:30:00Z",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        urls = {}
        for _ in range(4):
            line = process.stdout.readline()
            parts = line.split()
            if len(parts) == 2:
                urls[parts[0]] = parts[1]
        assert set(urls) == {"twin-service", "sensor-service", "scripted-llm"}
        buildings = httpx.get(f"{urls['twin-service']}/buildings", headers=ADMIN).json()
        assert len(buildings) == 6
        latest = httpx.get(
            f"{urls['sensor-service']}/sensors/sen-harbor-dock-a-co2/latest", headers=ADMIN
        ).json()
        assert latest["timestamp"] == "2025-03-04T10:30:00Z"
        reply = httpx.post(
            f"{urls['scripted-llm']}/chat/completions",
            headers={"authorization": "Bearer test"},
            json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
        ).json()
        assert reply["choices"][0]["message"]["content"] == "hi from the CLI"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
