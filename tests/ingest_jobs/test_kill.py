"""A real ``kill -9`` of the ingestion process mid-run, at several points."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from tests.ingest_jobs.test_pipeline import assert_same_store, snapshot

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _corpus(root: Path, pages: int) -> Path:
    for i in range(pages):
        path = root / f"page-{i:03d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = "\n\n".join(
            f"## Part {j}\n\nRoom {i}-{j} reports occupancy every {j + 5} seconds; "
            f"the capacity of floor {j} in building {i} is {10 * j + i} people. " * 3
            for j in range(6)
        )
        path.write_text(f"---\ntitle: Page {i}\n---\n# Page {i}\n\n{body}\n")
    return root


def _ingest_cmd(root: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "serve_app.cli",
        "ingest",
        "--root",
        str(root),
        "--executor",
        "local",
        "--quiet",
        "--json",
    ]


async def _run(cmd: list[str], env: dict[str, str]) -> int:
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    return proc.returncode


async def _documents(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM documents"))
    finally:
        await conn.close()


@pytest.mark.parametrize("kill_after_docs", [1, 7])
async def test_kill_9_mid_ingest_then_rerun_equals_clean_ingest(
    db_url: str, tmp_path: Path, kill_after_docs: int
) -> None:
    root = _corpus(tmp_path / "docs", 24)
    env = {**os.environ, "DATABASE_URL": db_url, "HF_HUB_OFFLINE": "1"}
    proc = await asyncio.create_subprocess_exec(
        *_ingest_cmd(root),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    killed = False
    while time.monotonic() < deadline and proc.returncode is None:
        if await _documents(db_url) >= kill_after_docs:
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
            break
        await asyncio.sleep(0.005)
    await asyncio.wait_for(proc.wait(), timeout=60)
    assert killed, "the ingestion finished before it could be killed"
    written = await _documents(db_url)
    assert kill_after_docs <= written < 24

    conn = await asyncpg.connect(db_url)
    try:
        half = await conn.fetchval(
            "SELECT count(*) FROM documents d WHERE chunk_count = 0 OR chunk_count <> "
            "(SELECT count(*) FROM chunks c WHERE c.document_id = d.id)"
        )
    finally:
        await conn.close()
    assert half == 0, "a killed run left a half-written document"

    assert await _run(_ingest_cmd(root), env) == 0
    resumed = await snapshot(db_url)

    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DELETE FROM documents")
    finally:
        await conn.close()
    assert await _run(_ingest_cmd(root), env) == 0
    assert_same_store(resumed, await snapshot(db_url))
