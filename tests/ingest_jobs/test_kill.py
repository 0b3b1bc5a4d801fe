"""Ingestion crash-safety (issue 8, item 6): a real ``kill -9`` of the ingestion process
mid-run - two points with the real MiniLM, then many seeds at random points (between and
inside write transactions, inside the prune) - after which every document is whole and a
re-run equals a clean ingest; a reader during replacements never sees half a document; and a
page the store cannot hold is skipped instead of failing every run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest

from serve_app.wiring import ingest_config
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


async def test_kill_9_mid_ingest_then_rerun_equals_clean_ingest(
    db_url: str, tmp_path: Path
) -> None:
    # One kill point with the real MiniLM (three cold interpreters, ~45 s); the many-seed
    # test below kills after every document count, and at many other points.
    kill_after_docs = 7
    root = _corpus(tmp_path / "docs", 24)
    # float32 weights whatever the CPU: with EMBEDDING_DTYPE=auto a bfloat16-capable machine
    # embeds in bfloat16, whose vectors move by more than the tolerance below when the resumed
    # run batches the remaining chunks differently from a clean run.
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "HF_HUB_OFFLINE": "1",
        "EMBEDDING_DTYPE": "float32",
        # Small batches: the embedder gets 8 batches a call, and documents finish (and are
        # written) call by call, so a kill after 7 of the 24 can land between two writes.
        "EMBEDDING_BATCH_SIZE": "2",
    }
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


# --- many seeds: kill -9 at random points, fresh and updating runs (issue 8, item 6) -----------
#
# The ingestion process runs the real CLI code (`serve_app.cli.main(["ingest", ...])`, what
# `agent-service ingest` runs) with the local executor, forked from `forkserver.py` (imports
# done once: a run costs ~0.5 s instead of ~4 s) - every 6th seed a fresh
# `python -m serve_app.cli` instead. Its embedder is the scripted model server's
# `/v1/embeddings` (deterministic hashed vectors, over HTTP, through the real
# `OpenAIEmbedder`), so many seeds fit in two minutes; the MiniLM test above covers the real
# model. Kill points, chosen per seed:
#
# * delay:          SIGKILL after a random delay in [0, 1.1 x a clean run], anywhere:
#                   start-up, migration check, discovery, embedding, writing, pruning;
# * after_docs:     once k of the documents to write are committed (between transactions);
# * before_delete:  inside a document's write transaction, blocked on its per-source advisory
#                   lock (the test holds it), before the old version is deleted;
# * mid_copy:       inside a document's write transaction after the old version is deleted
#                   and the new row inserted, halfway through the COPY of its chunks (the
#                   test holds an uncommitted row with the id of one of the new chunks, so
#                   the COPY waits on it);
# * mid_prune:      inside the prune's DELETE (the test holds a row lock on a page to prune).
#
# Scenarios: "fresh" (empty store) and "update" (the store holds version 1 of the files;
# the files are version 2: changed text, a changed front-matter ACL, a changed folder
# default ACL under unchanged files, a new page, a deleted page to prune, an empty page, a
# 40-section page). After the kill, every document in the store must be exactly its version
# 1 or its version 2 (row, chunks, ACLs, embeddings): no half-written or half-replaced one.
# After a re-run, the store must equal a clean ingest of version 2.

KILL_SEEDS = 40  # every scenario x kill point at least twice (9 pairs); CI time is bounded
EMBEDDER = "hashed-bow-384"


def _section_text(page: str, j: int, extra: str = "") -> str:
    return (
        f"## Part {j}\n\nRoom {page}-{j} reports occupancy every {j + 5} seconds; the capacity "
        f"of floor {j} is {10 * j + 7} people{extra}. " * 3
    )


def _page(
    page: str, sections: int, *, acl: str | None = None, extra: dict[int, str] | None = None
) -> str:
    front = f"---\ntitle: {page}\n" + (f"permissions: {acl}\n" if acl else "") + "---\n"
    body = "\n\n".join(_section_text(page, j, (extra or {}).get(j, "")) for j in range(sections))
    return f"{front}# {page}\n\n{body}\n"


def _versions() -> tuple[dict[str, str], dict[str, str]]:
    v1: dict[str, str] = {f"pub/page-{i:02d}.md": _page(f"p{i}", 5) for i in range(12)}
    v1["pub/big.md"] = _page("big", 40)
    v1["pub/empty.md"] = "---\ntitle: Empty\n---\n"
    v1["pub/acme.md"] = _page("acme", 3, acl="[domain:acme]")
    v1["pub/gone.md"] = _page("gone", 3)
    v1.update({f"staff/s-{i}.md": _page(f"s{i}", 4) for i in range(4)})
    v2 = dict(v1)
    v2["pub/page-01.md"] = _page("p1", 5, extra={2: " after the retrofit"})
    v2["pub/page-02.md"] = _page("p2", 5, acl="[role:admin]")
    v2["pub/acme.md"] = _page("acme", 3, acl="[domain:globex]")
    v2["pub/big.md"] = _page("big", 40, extra={j: " (revised)" for j in range(20, 40)})
    v2["pub/new.md"] = _page("new", 6)
    del v2["pub/gone.md"]
    return v1, v2


def _write_version(root: Path, pages: dict[str, str]) -> None:
    for folder in ("pub", "staff"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for old in (root / folder).glob("*.md"):
            if f"{folder}/{old.name}" not in pages:
                old.unlink()
    for rel, text in pages.items():
        (root / rel).write_text(text, encoding="utf-8")


@dataclass
class DocState:
    row: tuple[Any, ...]
    chunks: list[tuple[Any, ...]]
    vectors: Any

    def same(self, other: DocState | None) -> bool:
        return (
            other is not None
            and self.row == other.row
            and self.chunks == other.chunks
            and self.vectors.shape == other.vectors.shape
            and bool(np.allclose(self.vectors, other.vectors, atol=1e-6))
        )


async def store_state(conn: asyncpg.Connection) -> dict[str, DocState]:
    """Every column a clean ingest determines, per source (not ids or timestamps)."""
    docs = await conn.fetch(
        "SELECT id, source, title, content_hash, fingerprint, permissions, metadata::text AS m, "
        "chunk_count FROM documents"
    )
    rows = await conn.fetch(
        "SELECT document_id, id, ordinal, text, section, kind, token_count, permissions, "
        "acl_match, metadata::text AS m, embedding::text AS e FROM chunks "
        "ORDER BY document_id, ordinal"
    )
    by_doc: dict[int, list[asyncpg.Record]] = {}
    for r in rows:
        by_doc.setdefault(r["document_id"], []).append(r)
    out: dict[str, DocState] = {}
    for d in docs:
        chunks = by_doc.get(d["id"], [])
        out[d["source"]] = DocState(
            row=tuple(d)[1:],
            chunks=[tuple(c)[1:-1] for c in chunks],
            vectors=np.array([json.loads(c["e"]) for c in chunks], dtype=np.float32),
        )
    return out


def assert_store_equals(got: dict[str, DocState], want: dict[str, DocState]) -> None:
    assert sorted(got) == sorted(want)
    for source, state in want.items():
        assert got[source].same(state), f"{source} differs from a clean ingest"


SNAPSHOT_SQL = """
DROP SCHEMA IF EXISTS snap CASCADE;
CREATE SCHEMA snap;
CREATE TABLE snap.documents AS SELECT * FROM documents;
CREATE TABLE snap.chunks AS
    SELECT c.*, d.source AS doc_source FROM chunks c JOIN documents d ON d.id = c.document_id;
"""
RESTORE_SQL = """
TRUNCATE documents CASCADE;
INSERT INTO documents (source, title, content_hash, fingerprint, permissions, metadata,
                       chunk_count)
    SELECT source, title, content_hash, fingerprint, permissions, metadata, chunk_count
    FROM snap.documents;
INSERT INTO chunks (id, document_id, ordinal, text, section, kind, token_count, embedding,
                    permissions, metadata)
    SELECT s.id, d.id, s.ordinal, s.text, s.section, s.kind, s.token_count, s.embedding,
           s.permissions, s.metadata
    FROM snap.chunks s JOIN documents d ON d.source = s.doc_source;
"""


def _cli_env(db_url: str, embed_url: str, root: Path, staff_default: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": db_url,
        "EMBEDDING_BACKEND": "openai",
        "EMBEDDING_BASE_URL": embed_url,
        "EMBEDDING_MODEL": EMBEDDER,
        "EMBEDDING_DIM": "384",
        "LLM_API_KEY": "test-key",
        "LLM_MAX_RETRIES": "0",
        "DOC_ROOTS": f"{root / 'pub'}=,{root / 'staff'}={staff_default}",
        "HF_HUB_OFFLINE": "1",
    }


INGEST_ARGV = ["ingest", "--executor", "local", "--prune", "--json", "--quiet"]
FRESH_INTERPRETER_EVERY = 6  # every 6th seed: `python -m serve_app.cli`, not the fork server


class Run:
    """One ingestion process: a child of the fork server, or a fresh interpreter."""

    def __init__(self, pid: int, out: Path, err: Path, proc: Any = None) -> None:
        self.pid, self.out, self.err, self.proc = pid, out, err, proc
        self.exit: int | None = None


class Launcher:
    """Starts `agent-service ingest` runs: forked from ``tests.ingest_jobs.forkserver`` (the
    imports done once), or as a fresh ``python -m serve_app.cli`` subprocess."""

    def __init__(self, server: asyncio.subprocess.Process, logs: Path) -> None:
        self.server = server
        self.logs = logs
        self.runs = 0

    @classmethod
    async def start(cls, logs: Path) -> Launcher:
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.ingest_jobs.forkserver",
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        launcher = cls(server, logs)
        assert (await launcher._read()) == {"ready": True}
        return launcher

    async def _read(self) -> dict[str, Any]:
        assert self.server.stdout is not None
        line = await asyncio.wait_for(self.server.stdout.readline(), timeout=120)
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def _ask(self, **request: Any) -> dict[str, Any]:
        assert self.server.stdin is not None
        self.server.stdin.write((json.dumps(request) + "\n").encode())
        await self.server.stdin.drain()
        return await self._read()

    async def spawn(self, env: dict[str, str], *, fresh: bool = False) -> Run:
        self.runs += 1
        out, err = self.logs / f"run-{self.runs}.out", self.logs / f"run-{self.runs}.err"
        if fresh:
            with out.open("wb") as o, err.open("wb") as e:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "serve_app.cli", *INGEST_ARGV,
                    cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                )  # fmt: skip
            return Run(proc.pid, out, err, proc)
        answer = await self._ask(
            op="spawn", argv=INGEST_ARGV, env=env, stdout=str(out), stderr=str(err)
        )
        return Run(int(answer["pid"]), out, err)

    async def poll(self, run: Run) -> int | None:
        if run.exit is None:
            if run.proc is not None:
                run.exit = run.proc.returncode
            else:
                run.exit = (await self._ask(op="poll", pid=run.pid))["exit"]
        return run.exit

    async def wait(self, run: Run) -> int:
        if run.exit is None:
            if run.proc is not None:
                run.exit = await asyncio.wait_for(run.proc.wait(), timeout=120)
            else:
                run.exit = (await self._ask(op="wait", pid=run.pid))["exit"]
        assert run.exit is not None
        return run.exit

    async def complete(self, env: dict[str, str], *, fresh: bool = False) -> dict[str, Any]:
        """Run to completion; the report."""
        run = await self.spawn(env, fresh=fresh)
        code = await self.wait(run)
        assert code == 0, run.err.read_text()[-2000:]
        report: dict[str, Any] = json.loads(run.out.read_text())
        return report

    async def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        await asyncio.wait_for(self.server.wait(), timeout=30)


class Watcher:
    """The test's own connection: polls the store and pg_stat_activity, holds the locks."""

    def __init__(self, conn: asyncpg.Connection, blocker: asyncpg.Connection) -> None:
        self.conn = conn
        self.blocker = blocker
        self.mine = {conn.get_server_pid(), blocker.get_server_pid()}

    async def others(self, wait_event: str | None = None) -> int:
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND NOT pid = ANY($1::int[])"
        )
        if wait_event is not None:
            sql += " AND wait_event_type = 'Lock' AND wait_event = $2"
            return int(await self.conn.fetchval(sql, list(self.mine), wait_event))
        return int(await self.conn.fetchval(sql, list(self.mine)))

    async def settle(self) -> None:
        """Wait until the killed process's server backends are gone (their transactions
        rolled back)."""
        deadline = time.monotonic() + 60
        while await self.others():
            assert time.monotonic() < deadline, "a killed ingestion's backend never ended"
            await asyncio.sleep(0.01)


async def _kill_at(
    launcher: Launcher,
    watcher: Watcher,
    env: dict[str, str],
    kind: str,
    param: Any,
    targets: dict[str, str],
    *,
    fresh: bool,
) -> tuple[bool, float]:
    """Start an ingestion, kill -9 it at the kill point; (killed before it finished,
    seconds from start to kill)."""
    blocker = watcher.blocker
    txn = None
    if kind == "before_delete":
        await blocker.execute("SELECT pg_advisory_lock(hashtext($1))", param)
    elif kind == "mid_copy":
        txn = blocker.transaction()
        await txn.start()
        doc_id = await blocker.fetchval(
            "INSERT INTO documents (source, content_hash, fingerprint) "
            "VALUES ('zz-blocker', '-', '-') RETURNING id"
        )
        await blocker.execute(
            "INSERT INTO chunks (id, document_id, ordinal, text, kind, token_count, embedding) "
            "VALUES ($1, $2, 0, 'blocker', 'prose', 1, $3::text::vector)",
            param[1],
            doc_id,
            "[" + ",".join(["1"] + ["0"] * 383) + "]",
        )
    elif kind == "mid_prune":
        txn = blocker.transaction()
        await txn.start()
        await blocker.execute("SELECT 1 FROM documents WHERE source = $1 FOR UPDATE", param)
    started = time.monotonic()
    run = await launcher.spawn(env, fresh=fresh)
    deadline = started + 90
    try:
        while await launcher.poll(run) is None:
            assert time.monotonic() < deadline, f"kill point {kind} {param} never reached"
            if kind == "delay":
                if time.monotonic() - started >= param:
                    break
            elif kind == "after_docs":
                done = await watcher.conn.fetchval(
                    "SELECT count(*) FROM documents d JOIN unnest($1::text[], $2::text[]) "
                    "AS t(s, f) ON d.source = t.s AND d.fingerprint = t.f",
                    list(targets),
                    list(targets.values()),
                )
                if done >= param:
                    break
            elif await watcher.others("advisory" if kind == "before_delete" else "transactionid"):
                # before_delete: waiting for the test's per-source advisory lock; mid_copy: the
                # COPY waiting on the test's uncommitted chunk id; mid_prune: the prune's
                # DELETE waiting on the test's row lock
                break
            await asyncio.sleep(0.002)
        seconds = time.monotonic() - started
        if run.exit is None:
            if run.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    run.proc.send_signal(signal.SIGKILL)
            else:  # the fork server reaps only when asked: the pid is still this child's
                os.kill(run.pid, signal.SIGKILL)
        code = await launcher.wait(run)
        assert code in (-signal.SIGKILL, 0), run.err.read_text()[-2000:]
        return code == -signal.SIGKILL, seconds
    finally:
        if kind == "before_delete":
            await blocker.execute("SELECT pg_advisory_unlock(hashtext($1))", param)
        elif txn is not None:
            await txn.rollback()
        await watcher.settle()


async def test_kill_9_at_random_points_across_seeds_leaves_whole_documents(
    db_url: str, tmp_path: Path
) -> None:
    import random

    from local_world.scripted_llm import ScriptedLLM, create_llm_app
    from local_world.servers import run_in_thread

    root = tmp_path / "docs"
    v1, v2 = _versions()
    started_all = time.monotonic()
    with run_in_thread(create_llm_app(ScriptedLLM())) as llm_url:
        env_v1 = _cli_env(db_url, llm_url + "/v1", root, "role:business_staff")
        env_v2 = _cli_env(db_url, llm_url + "/v1", root, "role:business_admin")
        conn = await asyncpg.connect(db_url)
        blocker = await asyncpg.connect(db_url)
        watcher = Watcher(conn, blocker)
        launcher = await Launcher.start(tmp_path)
        try:
            # the two clean references, through the same CLI
            _write_version(root, v1)
            await launcher.complete(env_v1)
            old = await store_state(conn)
            await conn.execute(SNAPSHOT_SQL)
            _write_version(root, v2)
            await conn.execute("TRUNCATE documents CASCADE")
            clean_started = time.monotonic()
            await launcher.complete(env_v2)
            clean_seconds = time.monotonic() - clean_started
            new = await store_state(conn)
            assert len(new) == len(v2) and len(old) == len(v1)
            assert new[(root / "pub/empty.md").as_posix()].chunks == []

            lines: list[str] = []
            kinds: Counter[str] = Counter()
            for seed in range(KILL_SEEDS):
                rng = random.Random(seed)
                scenario = rng.choice(["fresh", "update"])
                await conn.execute(
                    "TRUNCATE documents CASCADE" if scenario == "fresh" else RESTORE_SQL
                )
                before = await store_state(conn)
                pending = {
                    s: st.row[3] for s, st in new.items() if not st.same(before.get(s))
                }  # source -> the fingerprint it will get
                present = {c[0] for st in before.values() for c in st.chunks}
                copyable = [
                    (s, c[0]) for s in sorted(pending) for c in new[s].chunks if c[0] not in present
                ]
                kind = rng.choice(
                    ["delay", "after_docs", "before_delete", "mid_copy"]
                    + (["mid_prune"] if scenario == "update" else [])
                )
                param: Any
                if kind == "delay":
                    param = round(rng.uniform(0.0, 1.1 * clean_seconds), 3)
                elif kind == "after_docs":
                    param = rng.randrange(1, len(pending))
                elif kind == "before_delete":
                    param = rng.choice(sorted(pending))
                elif kind == "mid_copy":
                    param = rng.choice(copyable)
                else:
                    param = rng.choice(sorted(set(old) - set(new)))
                fresh = seed % FRESH_INTERPRETER_EVERY == FRESH_INTERPRETER_EVERY - 1
                killed, seconds = await _kill_at(
                    launcher, watcher, env_v2, kind, param, pending, fresh=fresh
                )

                # no document is half-written or half-replaced: each is exactly v1 or v2
                after = await store_state(conn)
                at_new = at_old = 0
                for source, state in after.items():
                    if state.same(new.get(source)):
                        at_new += source in pending
                    else:
                        assert scenario == "update" and state.same(old.get(source)), (
                            f"seed {seed}: {source} is neither version after the kill"
                        )
                        at_old += 1
                assert set(after) <= set(new) | (set(old) if scenario == "update" else set())
                for source in set(new) - set(after):
                    assert source in pending

                report = await launcher.complete(env_v2, fresh=fresh)
                assert_store_equals(await store_state(conn), new)
                # the re-run did exactly what the kill left undone
                left = [s for s in pending if not after.get(s, None) or not after[s].same(new[s])]
                assert report["new"] + report["replaced"] == len(left), (seed, report)
                assert report["pruned"] == len(set(after) - set(new))

                where = (
                    param if not isinstance(param, tuple) else f"{Path(param[0]).name}#{param[1]}"
                )
                if isinstance(where, str) and "/" in where:
                    where = Path(where).name
                kinds[f"{kind}{'' if killed else ' (finished first)'}"] += 1
                lines.append(
                    f"seed {seed:2d} {'cli ' if fresh else 'fork'} {scenario:6s} {kind}({where}) "
                    f"{'killed' if killed else 'finished first'} at "
                    f"{seconds:.2f}s: {at_new}/{len(pending)} written, {at_old} at v1, "
                    f"{len(set(new) - set(after))} absent; re-run wrote "
                    f"{report['new'] + report['replaced']}, pruned {report['pruned']}"
                )
        finally:
            await launcher.close()
            await conn.execute("DROP SCHEMA IF EXISTS snap CASCADE")
            await blocker.close()
            await conn.close()
    print("\ningestion crash-safety:", f"clean run {clean_seconds:.2f}s;", dict(kinds))
    print("\n".join(lines))
    print(
        f"{KILL_SEEDS} seeds, all whole and equal to a clean ingest after a re-run; "
        f"{time.monotonic() - started_all:.1f} s"
    )


# --- a reader during replacements never sees half a document --------------------------------------


async def test_a_reader_never_sees_a_half_replaced_document(db_url: str) -> None:
    """One source is replaced back and forth between two versions (different chunks,
    different counts, different ACLs) through ``PgDocumentStore.write_document``, as fast as
    it goes, while readers on their own connections look at it: a plain SQL reader (the
    document row and its chunks in one statement) must see exactly version A or exactly
    version B, never a mix, a count that disagrees or nothing; hybrid searches as a caller who
    may see only A and as one who may see only B must get all of their version or none of
    it, never a chunk of the other."""
    from local_world.scripted_llm import embed_text
    from retrieval.store import ChunkRecord, DocumentRecord, PgDocumentStore

    source = "docs/replaced.md"

    def version(tag: str, n: int, acl: list[str], src: str = source) -> DocumentRecord:
        chunks = [
            ChunkRecord(
                id=f"{tag}{i:04d}",
                ordinal=i,
                text=f"occupancy report {tag} part {i}",
                section=f"Part {i}",
                kind="prose",
                token_count=5,
                embedding=np.asarray(embed_text(f"occupancy report {tag} part {i}"), np.float32),
            )
            for i in range(n)
        ]
        return DocumentRecord(src, tag, tag, f"fp-{tag}", acl, chunks)

    a, b = version("a", 40, ["domain:acme"]), version("b", 57, ["role:admin"])
    ids = {"fp-a": [c.id for c in a.chunks], "fp-b": [c.id for c in b.chunks]}
    store = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=6)
    replacements = 150
    seen: Counter[str] = Counter()
    done = asyncio.Event()

    async def sql_reader() -> None:
        async with store.pool.acquire() as conn:
            while not done.is_set():
                rows = await conn.fetch(
                    "SELECT d.fingerprint, d.chunk_count, d.permissions, "
                    "array_agg(c.id ORDER BY c.ordinal) AS ids, "
                    "array_agg(DISTINCT array_to_string(c.permissions, ',')) AS acls "
                    "FROM documents d JOIN chunks c ON c.document_id = d.id "
                    "WHERE d.source = $1 GROUP BY d.id",
                    source,
                )
                assert len(rows) == 1, rows  # never absent, never two
                row = rows[0]
                fp = row["fingerprint"]
                assert list(row["ids"]) == ids[fp], "a mix of two versions"
                assert row["chunk_count"] == len(ids[fp])
                assert list(row["acls"]) == [",".join(row["permissions"])]
                seen[f"sql {fp}"] += 1

    async def search_reader(label: str, acl: list[str], mine: DocumentRecord) -> None:
        query = np.asarray(embed_text("occupancy report part"), np.float32)
        own = {c.id for c in mine.chunks}
        while not done.is_set():
            cands = await store.hybrid_candidates(
                "occupancy report", query, acl, k_vector=100, k_keyword=100
            )
            got = {c.chunk_id for c in cands if c.source == source}
            assert got <= own, f"{label} saw a chunk of the version it may not see"
            vec = {c.chunk_id for c in cands if c.vector_rank is not None}
            assert vec in (set(), own), f"{label} saw part of its version ({len(vec)} chunks)"
            seen[f"{label} {'all' if vec else 'none'}"] += 1

    try:
        await store.write_document(a)
        for i in range(5):  # neighbours, visible to nobody in particular
            await store.write_document(version(f"n{i}", 5, ["domain:other"], f"docs/n{i}.md"))
        readers = [
            asyncio.create_task(sql_reader()),
            asyncio.create_task(sql_reader()),
            asyncio.create_task(search_reader("acme caller", ["domain:acme"], a)),
            asyncio.create_task(search_reader("admin caller", ["role:admin"], b)),
        ]
        started = time.monotonic()
        for i in range(replacements):
            outcome = await store.write_document(b if i % 2 == 0 else a)
            assert outcome == "replaced"
            await asyncio.sleep(0)
        done.set()
        await asyncio.gather(*readers)
        seconds = time.monotonic() - started
    finally:
        done.set()
        await store.close()
    print(
        f"\nconcurrent reader: {replacements} replacements in {seconds:.1f}s; reads: "
        + ", ".join(f"{k} {v}" for k, v in sorted(seen.items()))
        + "; every read saw exactly one whole version"
    )
    for key in ("sql fp-a", "sql fp-b", "acme caller all", "acme caller none"):
        assert seen[key] > 0, f"no read saw {key}: the readers did not interleave"


# --- a file the store cannot hold is skipped, not fatal to every run ------------------------------


async def test_a_file_with_a_nul_character_is_skipped_and_the_run_finishes(
    db_url: str, tmp_path: Path
) -> None:
    """Regression: U+0000 (valid UTF-8, but not storable in PostgreSQL text or jsonb) in a
    page's text, or as a YAML escape in its title, permissions or other front matter, used to
    abort the run at that page's write - and every re-run again at the same page, so the
    ingestion could never finish. Such a page is now skipped with a clear reason."""
    from foundation.settings import Settings
    from ingest_jobs.pipeline import IngestOptions, run_ingest
    from retrieval.store import PgDocumentStore
    from tests.ingest_jobs.corpus import HashedEmbedder

    root = tmp_path / "docs"
    root.mkdir()
    pages = {
        "a-good.md": "# Good\n\nOccupancy is counted per room.\n",
        "b-nul-text.md": "# Text\n\nA stray \x00 byte.\n",
        "c-nul-title.md": '---\ntitle: "Ti\\0tle"\n---\n# T\n\nBody.\n',
        "d-nul-acl.md": '---\npermissions: ["domain:acme\\u0000"]\n---\n# A\n\nBody.\n',
        "e-nul-meta.md": '---\nowner: ["ops", "x\\x00"]\n---\n# M\n\nBody.\n',
        "f-good.md": "# Also good\n\nDoor counters reset nightly.\n",
    }
    for name, text in pages.items():
        (root / name).write_text(text, encoding="utf-8")
    embedder = HashedEmbedder()
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path / "home",
        embedding_backend="openai",
        embedding_model=embedder.name,
        embedding_dim=384,
    )
    options = IngestOptions(roots=[(root, [])], executor="local")
    store = await PgDocumentStore.connect(db_url, embedding_dim=384, max_size=2)
    try:
        first = await run_ingest(store, ingest_config(settings), options, embedder=embedder)
        assert (first.new, first.skipped) == (2, 4), first.as_dict()
        assert all("NUL" in reason for reason in first.skip_reasons), first.skip_reasons
        assert sorted(Path(s).name for s in await store.documents()) == ["a-good.md", "f-good.md"]
        again = await run_ingest(store, ingest_config(settings), options, embedder=embedder)
        assert (again.unchanged, again.skipped, again.new) == (2, 4, 0)
    finally:
        await store.close()
    print("\n" + "\n".join(first.skip_reasons))
