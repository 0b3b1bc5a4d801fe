"""The Ray Data path at sizes no sample corpus reaches, through the real CLI."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foundation.settings import Settings
from ingest_jobs import pipeline, ray_executor
from ingest_jobs.sources import PreparedSource, chunk_id, chunk_rows
from ingest_jobs.token_counts import token_counter
from retrieval.search import embedding_input
from serve_app.wiring import ingest_config
from tests.ingest_jobs.test_pipeline import snapshot

ROOT = Path(__file__).resolve().parents[2]
TINY_PAGES = 2000
# Pages of several chunks each, so the pipeline has several encode calls left when the first
# document is written (600 one-line pages fit in two calls: Ray could finish before the kill).
NODE_KILL_PAGES = 300
NODE_KILL_SECTIONS = 6
# One chunk per section under MiniLM's budget. Two sentences each: the test's three runs each
# embed all 1,800 chunks, which at 600 characters took MiniLM about 4x as long (this was the
# suite's longest test). The pages and chunks, so the rows in flight, are as before: the
# first write still commits ~32 of the 300 pages, and the kill lands with most still to come.
NODE_KILL_SECTION_CHARS = 150


def _tiny_pages(tmp_path: Path, line: str, pages: int = TINY_PAGES) -> Path:
    root = tmp_path / "tiny"
    root.mkdir()
    for n in range(pages):
        (root / f"page-{n:04d}.md").write_text(f"{line} {n}\n", encoding="utf-8")
    return root


def _sectioned_pages(root: Path, pages: int, sections: int, section_chars: int) -> Path:
    """``pages`` pages of ``sections`` sections of about ``section_chars`` characters each."""
    root.mkdir()
    for n in range(pages):
        parts = [f"# Manual {n}\n"]
        for j in range(sections):
            sentence = f"Room {n}-{j} on floor {j} logged {n * j % 97} people at sensor s{j}. "
            parts.append(f"## Part {j}\n\n{sentence * (section_chars // len(sentence))}\n")
        (root / f"manual-{n:03d}.md").write_text("\n".join(parts), encoding="utf-8")
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

    monkeypatch.setattr(ray_executor, "start_ray", fake_start)
    with pytest.raises(Stop):  # raised by the call itself: nothing deferred to iteration
        ray_executor.iter_ray(ray_executor.RayWork([], 1, 200, 1), ingest_config(Settings()), None)
    assert started_on == [threading.current_thread()]


@pytest.mark.parametrize(
    ("docs", "chunks", "text_chars", "blocks"),
    [
        (10_000, 10_032, 15_000_000, 20),  # a block per call of ~512 chunks: a short tail
        (200, 30_000, 40_000_000, 59),  # large pages: by chunks, still one call a block
        (100, 120, 50_000, 8),  # small: at least 8 blocks
        (3, 3, 100, 3),  # never more blocks than documents
        (1_000, 1_000, 400_000_000, 95),  # long text: blocks of ~4 MiB
    ],
)
def test_a_block_is_one_actor_call_of_at_most_about_512_chunks(
    docs: int, chunks: int, text_chars: int, blocks: int, tmp_path: Path
) -> None:
    prepared = [
        PreparedSource(f"page-{n}.md", None, "", "0" * 64, "", [], {}, tmp_path / f"page-{n}.md")
        for n in range(docs)
    ]
    work = ray_executor.RayWork.of(prepared, chunks, text_chars, 200, 1)
    assert work.blocks == blocks and len(work.items) == docs


def test_auto_runs_small_corpora_in_process_and_joins_a_running_cluster(
    monkeypatch: Any,
) -> None:
    settings = ingest_config(Settings(ingest_ray_min_chunks=1000))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert pipeline.choose_executor("auto", 999, settings) == "local"
    assert pipeline.choose_executor("auto", 1000, settings) == "ray"
    assert pipeline.choose_executor("local", 10**6, settings) == "local"  # forced stays forced
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    settings = ingest_config(Settings(ingest_ray_min_chunks=1000))  # RAY_ADDRESS: read at load
    assert pipeline.choose_executor("auto", 1, settings) == "ray"  # no cluster start to pay
    assert pipeline.choose_executor("local", 1, settings) == "local"


@pytest.mark.slow
@pytest.mark.integration
async def test_two_thousand_tiny_pages_on_the_ray_path_all_arrive_past_a_killed_worker(
    db_url: str, tmp_path: Path, minilm: Any
) -> None:
    """974 one-line pages used to end the process with exit 1 and no message after ~730
    documents (Ray's raylet was killed when the row feed's thread ended). Here the embedding
    worker is also SIGKILLed once documents are being written: Ray Data starts a new actor and
    retries the lost batch, and the writer takes each chunk once."""
    import signal

    root = _tiny_pages(tmp_path, "sensor note")
    # float32 weights, as the session's MiniLM (auto is bfloat16 where the CPU has it)
    env = {**os.environ, "DATABASE_URL": db_url, "HF_HUB_OFFLINE": "1"}
    env["EMBEDDING_DTYPE"] = "float32"
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr:  # a file: the run's logs must never block it
        proc = await asyncio.create_subprocess_exec(
            *_ray_ingest(root, "--json-lines"), cwd=ROOT, env=env, stdout=PIPE, stderr=stderr
        )
    assert proc.stdout is not None
    killed: list[int] = []
    killed_at = 0
    report: dict[str, Any] = {}
    async for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "progress" and event["done"] > 0 and not killed:
            killed_at = event["done"]
            killed = _processes(proc.pid, b"MapBatches(_ChunkEmbedActor)")
            for worker in killed:
                os.kill(worker, signal.SIGKILL)
        if event["event"] == "report":
            report = event
    assert await proc.wait() == 0 and len(killed) == 1, log.read_text()[-3000:]
    assert (report["new"], report["chunks_written"]) == (TINY_PAGES, TINY_PAGES)
    assert report["executor"] == "ray" and killed_at < TINY_PAGES // 2  # killed mid-run
    stored = await snapshot(db_url)
    assert len(stored["documents"]) == len(stored["chunks"]) == TINY_PAGES
    # each page's one chunk, with the id and the vector a clean in-process ingest gives it
    expected = sorted(
        (chunk_id(p.as_posix(), 0, p.read_text().strip()), p.as_posix()) for p in root.iterdir()
    )
    assert [(c[0], c[1]) for c in stored["chunks"]] == expected
    texts = [embedding_input(str(c[4]), str(c[3])) for c in stored["chunks"][::50]]
    worst = float(np.abs(minilm.encode(texts) - stored["embeddings"][::50]).max())
    assert worst <= 1e-5


LARGE_PAGES = 200
SECTIONS_PER_PAGE = 44
SECTION_BYTES = 28_000  # ~7,000 estimated tokens: one chunk per section at the 8,192 budget
OBJECT_STORE_MB = 75  # Ray's minimum object store


def _large_pages(tmp_path: Path) -> Path:
    return _sectioned_pages(tmp_path / "large", LARGE_PAGES, SECTIONS_PER_PAGE, SECTION_BYTES)


def _digest_vector(text: str, dimensions: int = 384) -> list[float]:
    """A deterministic unit vector from the text's digest: cheap at 250 MB of text, where the
    scripted server's hashed bag of words (a digest per word) would take minutes."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    vector = np.random.default_rng(seed).standard_normal(dimensions)
    return [float(v) for v in vector / np.linalg.norm(vector)]


@pytest.mark.slow
@pytest.mark.integration
async def test_two_hundred_large_pages_several_times_the_object_store_stream_through(
    db_url: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """200 pages of 1.2 MB (~250 MB, 3x Ray's smallest object store) on a 75 MB object store:
    the workers read the files themselves, the pipeline streams, every chunk arrives once
    with its vector, and the driver never holds the corpus (its peak memory stays well below
    the corpus size)."""
    from local_world.scripted_llm import ScriptedLLM, create_llm_app
    from local_world.scripted_llm import embeddings as scripted_embeddings
    from local_world.servers import run_in_thread

    root = _large_pages(tmp_path)
    corpus_mb = sum(p.stat().st_size for p in root.iterdir()) / 2**20
    assert corpus_mb > 3 * OBJECT_STORE_MB
    monkeypatch.setattr(scripted_embeddings, "embed_text", _digest_vector)
    with run_in_thread(create_llm_app(ScriptedLLM())) as llm_url:
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "EMBEDDING_BACKEND": "openai",
            "EMBEDDING_BASE_URL": llm_url + "/v1",
            "EMBEDDING_MODEL": "digest-384",
            "EMBEDDING_DIM": "384",
            "LLM_API_KEY": "test-key",
            "CHUNK_MAX_TOKENS": "8192",
            "INGEST_OBJECT_STORE_MB": str(OBJECT_STORE_MB),
            "HF_HUB_OFFLINE": "1",
        }
        out, err = tmp_path / "stdout.json", tmp_path / "stderr.log"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *_ray_ingest(root, "--json"), cwd=ROOT, env=env, stdout=stdout, stderr=stderr
            )
            peak_kb = await _peak_rss_kb(proc)
    assert proc.returncode == 0, err.read_text()[-3000:]
    report = json.loads(out.read_text())
    assert report["executor"] == "ray" and report["new"] == LARGE_PAGES
    # holding the corpus would take more than its size on top of the interpreter
    assert peak_kb / 1024 < 0.75 * corpus_mb, f"driver peak {peak_kb / 1024:.0f} MiB"
    expected = {}
    for page in sorted(root.iterdir()):
        doc = PreparedSource(page.as_posix(), None, page.read_text(), "", "", [], {})
        for row in chunk_rows(doc, token_counter(None), 8191 - 48):
            expected[row["id"]] = _digest_vector(embedding_input(row["section"], row["text"]))
    assert report["chunks_written"] == len(expected) >= LARGE_PAGES * SECTIONS_PER_PAGE
    import asyncpg
    from pgvector.asyncpg import register_vector

    conn = await asyncpg.connect(db_url)
    await register_vector(conn)
    try:
        rows = await conn.fetch("SELECT id, embedding FROM chunks")
    finally:
        await conn.close()
    assert {r["id"] for r in rows} == set(expected)
    sample = rows[:: max(1, len(rows) // 200)]
    worst = max(float(np.abs(r["embedding"].to_numpy() - expected[r["id"]]).max()) for r in sample)
    assert worst <= 1e-6


async def _peak_rss_kb(proc: asyncio.subprocess.Process) -> int:
    """The process's high-water resident memory (VmHWM), sampled until it exits."""
    peak = 0
    while proc.returncode is None:
        peak = max(peak, _vm_hwm_kb(proc.pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), 0.2)
    return peak


def _vm_hwm_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:")), 0)


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


def _processes(pid: int, marker: bytes) -> list[int]:
    """Descendants of ``pid`` whose command line holds ``marker``."""
    found = []
    for child in _descendants(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in command:
            found.append(child)
    return found


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

    root = _sectioned_pages(
        tmp_path / "sectioned", NODE_KILL_PAGES, NODE_KILL_SECTIONS, NODE_KILL_SECTION_CHARS
    )
    env = {**os.environ, "DATABASE_URL": db_url, "HF_HUB_OFFLINE": "1"}
    command = _ray_ingest(root, "--json-lines")
    # The run's Ray notices the lost raylet by its GCS's health checks: every 0.5 s here
    # (Ray's default 3 s, 5 misses: ~15 s of a dead node before the process ends)
    killed_env = {**env, "RAY_health_check_period_ms": "500"}
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=ROOT,
        env=killed_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        limit=2**22,
    )  # the failure report lists every source not ingested: one long line
    assert proc.stdout is not None and proc.stderr is not None
    killed: list[int] = []
    report: dict[str, Any] = {}
    async for line in proc.stdout:
        assert line.startswith(b"{"), f"stdout is the report only: {line!r}"
        event = json.loads(line)
        if event["event"] == "progress" and event["done"] > 0 and not killed:
            killed = _processes(proc.pid, b"raylet/raylet")
            for raylet in killed:
                os.kill(raylet, signal.SIGKILL)
        if event["event"] == "report":
            report = event
    err = (await proc.stderr.read()).decode()
    assert await proc.wait() == 1 and killed, err[-2000:]
    assert report["failed"] is True and 0 < report["new"] < NODE_KILL_PAGES
    assert len(report["not_ingested"]) == NODE_KILL_PAGES - report["new"]
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
    assert (finished["new"], finished["unchanged"]) == (NODE_KILL_PAGES - stored, stored)
    after = await snapshot(db_url)
    assert len(after["documents"]) == NODE_KILL_PAGES
    assert len(after["chunks"]) == NODE_KILL_PAGES * NODE_KILL_SECTIONS  # one per section
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
