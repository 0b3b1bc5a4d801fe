"""``agent-service ask --conversation`` and ``agent-service conversations``: the CLI against
the real app over real HTTP (uvicorn on 127.0.0.1; a ``FakeBackend`` answers and keeps the
conversations in memory), and ``conversations prune`` on the real embedded PostgreSQL."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from conversations.store import PgConversationStore, TurnRecord
from foundation.settings import Settings
from local_world.servers import run_in_thread
from serve_app.api.app import create_app
from serve_app.authz import load_authorizer
from serve_app.cli import EXIT_OK, EXIT_USAGE, main
from tests.serve_app.api.api_helpers import FakeBackend, answer


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    settings = Settings(_env_file=None, agent_service_home=tmp_path, llm_api_key="k")  # type: ignore[call-arg]
    backend = FakeBackend(ask_result=answer("Harbor Warehouse is quiet."))
    with run_in_thread(create_app(backend, settings, load_authorizer())) as base:
        yield base


def test_a_thread_from_the_command_line(url: str) -> None:
    nina = ("--url", url, "--sub", "nina")
    code, out = run("ask", "How busy is Harbor Warehouse?", "--no-stream", *nina)
    assert code == EXIT_OK and "Harbor Warehouse is quiet." in out
    [line] = [x for x in out.splitlines() if x.strip().startswith("conversation ")]
    ident = line.split()[1].rstrip(",")
    assert f"conversation {ident}, turn 1 (follow up: --conversation {ident})" in line

    code, out = run("ask", "and its rooms?", "--conversation", ident, *nina)  # streamed
    assert code == EXIT_OK and f"conversation {ident}, turn 2" in out
    code, out = run("ask", "--json", "and now?", "--conversation", ident, *nina)
    assert (json.loads(out)["conversation_id"], json.loads(out)["turn"]) == (ident, 3)

    code, out = run("conversations", "list", *nina)
    assert code == EXIT_OK
    assert out.split()[0] == ident and "3 turns" in out and "How busy is Harbor" in out
    code, out = run("conversations", "show", ident, *nina)
    assert code == EXIT_OK
    assert "[1]" in out and "Q: How busy is Harbor Warehouse?" in out and "Q: and now?" in out
    assert out.count("A: Harbor Warehouse is quiet.") == 2 and "A: ok" in out  # turn 2 streamed
    assert out.count(", written by the model") == 3  # each turn says who wrote its answer

    # another caller: the service's 404, as a usage error naming it
    code, _ = run("conversations", "show", ident, "--url", url, "--sub", "eve")
    assert code == EXIT_USAGE
    code, _ = run("ask", "mine?", "--conversation", ident, "--url", url, "--sub", "eve")
    assert code == EXIT_USAGE

    run("ask", "a second one", "--no-stream", *nina)
    code, out = run("conversations", "delete", ident, *nina)
    assert (code, out.strip()) == (EXIT_OK, f"deleted {ident}")
    assert run("conversations", "delete", *nina)[0] == EXIT_USAGE  # an ID or --all
    code, out = run("conversations", "delete", "--all", *nina)
    assert (code, out.strip()) == (EXIT_OK, "deleted 1 conversation")
    assert run("conversations", "list", *nina)[1].strip() == "no conversations"


async def _seed(db_url: str) -> None:
    """nina's two-turn conversation last active 10 days ago, and eve's of today."""
    store = await PgConversationStore.connect(db_url, max_size=1)
    record = TurnRecord(question="q", answer="a", decision="answered", idk=False, model="m")
    try:
        old, _ = await store.start("nina", record)
        await store.append("nina", old.id, record, max_turns=5)
        await store.start("eve", record)
        await store.pool.execute(
            "UPDATE conversations SET updated_at = now() - interval '10 days' WHERE id = $1",
            old.id,
        )
    finally:
        await store.close()


async def _count(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM conversations"))
    finally:
        await conn.close()


def test_prune_deletes_what_the_ttl_has_passed_and_prints_counts(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asyncio.run(_seed(db_url))  # a loop of its own: the CLI runs its own too (asyncio.run)
    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.delenv("CONVERSATION_TTL_DAYS", raising=False)
    code, out = run("conversations", "prune")  # unset: kept forever
    assert code == EXIT_OK and json.loads(out)["conversations"] == 0
    assert "kept forever" in json.loads(out)["note"]

    monkeypatch.setenv("CONVERSATION_TTL_DAYS", "7")
    code, out = run("conversations", "prune", "--dry-run")
    assert (json.loads(out)["conversations"], json.loads(out)["dry_run"]) == (1, True)
    code, out = run("conversations", "prune", "--batch-size", "10")
    report = json.loads(out)
    assert code == EXIT_OK
    assert (report["ttl_days"], report["conversations"], report["turns"]) == (7, 1, 2)
    assert asyncio.run(_count(db_url)) == 1  # eve's, of today
