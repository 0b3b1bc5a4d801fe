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

from local_world.claims import HEADER, encode_claims
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


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "local_world", "--twin-port", "0", "--sensor-port", "0", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


@pytest.mark.parametrize("how", ["--world", "LOCAL_WORLD_FILE"])
def test_cli_serves_the_world_file_it_is_given(how: str) -> None:
    second = "local_world/worlds/second.yaml"
    if how == "--world":
        process = _start("--world", second, env={"LOCAL_WORLD_FILE": ""})
    else:
        process = _start(env={"LOCAL_WORLD_FILE": second})
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(4)]
        assert lines[0].split()[:2] == ["world", "second"]
        urls = dict(line.split() for line in lines[1:3])
        ops = {HEADER: encode_claims("ops", [("crowdvision-ops", "admin")])}
        buildings = httpx.get(f"{urls['twin-service']}/buildings", headers=ops).json()
        assert len(buildings) == 6
        assert {b["domain"] for b in buildings} == {
            "aurelia-health",
            "tidewater.edu",
            "solace_hotels",
        }
        control = httpx.get(f"{urls['sensor-service']}/_control").json()
        assert control["world"] == "second"
        latest = httpx.get(
            f"{urls['sensor-service']}/sensors/70B3D57ED008A1E6/latest", headers=ops
        ).json()
        assert latest["sensorType"] == "sound_level" and latest["unit"] == "dBA"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0


def test_cli_refuses_a_bad_world_file_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "estate.yaml"
    text = (ROOT / "local_world" / "worlds" / "second.yaml").read_text(encoding="utf-8")
    bad.write_text(text.replace("capacity: 64", "capacity: lots"), encoding="utf-8")
    process = _start("--world", str(bad))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert f"{bad}: not a valid local world" in err
    assert (
        "domains[0] (aurelia-health).buildings[0] (b1cb1816-7d85-457c-9f32-2a1422d00e17)"
        ".rooms[0] (4711).capacity: Input should be a valid integer" in err
    )
