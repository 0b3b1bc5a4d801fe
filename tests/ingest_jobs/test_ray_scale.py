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

    monkeypatch.setattr(pipeline, "_start_ray", fake_start)
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
    root = tmp_path / "tiny"
    root.mkdir()
    for n in range(TINY_PAGES):
        (root / f"page-{n:04d}.md").write_text(f"sensor note {n}\n", encoding="utf-8")
    env = {**os.environ, "DATABASE_URL": db_url, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "serve_app.cli", "ingest", "--root", str(root)]
    command += ["--executor", "ray", "--json"]
    proc = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert (report["new"], report["chunks_written"]) == (TINY_PAGES, TINY_PAGES)
    assert report["executor"] == "ray"
    stored = await snapshot(db_url)
    assert len(stored["documents"]) == TINY_PAGES
