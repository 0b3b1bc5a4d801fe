"""The Ray Data path at sizes no sample corpus reaches, through the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from foundation.settings import Settings
from ingest_jobs import pipeline
from tests.ingest_jobs.test_pipeline import snapshot

ROOT = Path(__file__).resolve().parents[2]
TINY_PAGES = 2000


def _tiny_pages(tmp_path: Path, line: str) -> Path:
    root = tmp_path / "tiny"
    root.mkdir()
    for n in range(TINY_PAGES):
        (root / f"page-{n:04d}.md").write_text(f"{line} {n}\n", encoding="utf-8")
    return root


def _ray_ingest(root: Path, output: str) -> list[str]:
    command = [sys.executable, "-m", "serve_app.cli", "ingest", "--root", str(root)]
    return [*command, "--executor", "ray", output]


def test_ray_starts_on_the_calling_thread_not_the_row_feeds(monkeypatch: Any) -> None:
    """Ray's local processes die with the thread that started them (PR_SET_PDEATHSIG): the
    pipeline must start Ray when it is built, on the caller's thread, not lazily on the
    short-lived thread that drains its rows."""
    started_on: list[threading.Thread] = []

    class Stop(Exception):
        pass

    def fake_start(settings: Settings) -> None:
        started_on.append(threading.current_thread())
        raise Stop

    monkeypatch.setattr(pipeline, "start_ray", fake_start)
    with pytest.raises(Stop):  # raised by the call itself: nothing deferred to iteration
        pipeline._iter_ray([], Settings(), None, pipeline.IngestOptions(roots=[]))
    assert started_on == [threading.current_thread()]


def test_auto_runs_small_corpora_in_process_and_joins_a_running_cluster(
    monkeypatch: Any,
) -> None:
    settings = Settings(ingest_ray_min_chunks=1000)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert pipeline.choose_executor("auto", 999, settings) == "local"
    assert pipeline.choose_executor("auto", 1000, settings) == "ray"
    assert pipeline.choose_executor("local", 10**6, settings) == "local"  # forced stays forced
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert pipeline.choose_executor("auto", 1, settings) == "ray"  # no cluster start to pay
    assert pipeline.choose_executor("local", 1, settings) == "local"


@pytest.mark.slow
@pytest.mark.integration
async def test_two_thousand_tiny_pages_on_the_ray_path_all_arrive(
    db_url: str, tmp_path: Path
) -> None:
    """974 one-line pages used to end the process with exit 1 and no message after ~730
    documents (Ray's raylet was killed when the row feed's thread ended)."""
    root = _tiny_pages(tmp_path, "sensor note")
    env = {**os.environ, "DATABASE_URL": db_url, "HF_HUB_OFFLINE": "1"}
    command = _ray_ingest(root, "--json")
    proc = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert (report["new"], report["chunks_written"]) == (TINY_PAGES, TINY_PAGES)
    assert report["executor"] == "ray"
    stored = await snapshot(db_url)
    assert len(stored["documents"]) == TINY_PAGES


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _raylets(pid: int) -> list[int]:
    raylets = []
    for child in _descendants(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"raylet/raylet" in command:
            raylets.append(child)
    return raylets


@pytest.mark.slow
@pytest.mark.integration
async def test_a_ray_node_killed_mid_run_fails_loudly_and_a_rerun_finishes(
    db_url: str, tmp_path: Path
) -> None:
    """SIGKILL to the run's raylet while documents are being written: Ray ends the process
    connected to it with a bare exit(1), so the pipeline runs in a child process and the
    writer reports what failed and what the store holds; a re-run finishes the job."""
    import signal

    import asyncpg

    from foundation.database import asyncpg_url

    root = _tiny_pages(tmp_path, "door count note")
    env = {**os.environ, "DATABASE_URL": db_url, "HF_HUB_OFFLINE": "1"}
    command = _ray_ingest(root, "--json-lines")
    proc = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, limit=2**22
    )  # the failure report lists every source not ingested: one long line
    assert proc.stdout is not None and proc.stderr is not None
    killed: list[int] = []
    report: dict[str, Any] = {}
    async for line in proc.stdout:
        assert line.startswith(b"{"), f"stdout is the report only: {line!r}"
        event = json.loads(line)
        if event["event"] == "progress" and event["done"] > 0 and not killed:
            killed = _raylets(proc.pid)
            for raylet in killed:
                os.kill(raylet, signal.SIGKILL)
        if event["event"] == "report":
            report = event
    err = (await proc.stderr.read()).decode()
    assert await proc.wait() == 1 and killed, err[-2000:]
    assert report["failed"] is True and 0 < report["new"] < TINY_PAGES
    assert len(report["not_ingested"]) == TINY_PAGES - report["new"]
    assert "ingestion failed (ray): RayPipelineLost" in err
    assert f"{report['new']} document(s) written whole" in err
    conn = await asyncpg.connect(asyncpg_url(db_url))
    try:
        stored = await conn.fetchval("SELECT count(*) FROM documents")
    finally:
        await conn.close()
    assert stored == report["new"]
    again = await asyncio.to_thread(
        subprocess.run,
        [*command[:-1], "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    finished = json.loads(again.stdout)
    assert (finished["new"], finished["unchanged"]) == (TINY_PAGES - stored, stored)
    after = await snapshot(db_url)
    assert len(after["documents"]) == len(after["chunks"]) == TINY_PAGES
    # the store equals a clean ingest of the same pages (documents, chunks, ACLs)
    conn = await asyncpg.connect(asyncpg_url(db_url))
    try:
        await conn.execute("DELETE FROM documents")
    finally:
        await conn.close()
    clean = [*command[:-3], "--executor", "local", "--json"]
    done = await asyncio.to_thread(
        subprocess.run, clean, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = await snapshot(db_url)
    assert (fresh["documents"], fresh["chunks"]) == (after["documents"], after["chunks"])
