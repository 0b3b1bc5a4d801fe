"""The ``ConversationStore`` port: one contract run against the in-memory store (unit) and
the PostgreSQL store on the embedded server (integration), then what only PostgreSQL can
show: a turn is written whole or not at all when the write fails or is cancelled half way,
concurrent appends keep the limit and dense turn numbers, the retention prune, and the schema
check."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from conversations.memory import InMemoryConversationStore
from conversations.store import (
    TITLE_CHARS,
    ConversationFull,
    ConversationStore,
    NoSuchConversation,
    PgConversationStore,
    TurnRecord,
    title_of,
)
from foundation.database import DatabaseError
from foundation.records import CitationOut as Citation
from foundation.records import CostOut, UsageOut
from foundation.records import ToolCallTrace as ToolCallRecord


def record(question: str = "How busy is Harbor Warehouse?", **fields: Any) -> TurnRecord:
    values: dict[str, Any] = {
        "question": question,
        "answer": "Harbor Warehouse is at 40% [^c0ffee000001].",
        "decision": "answered",
        "idk": False,
        "model": "local/scripted",
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "citations": (
            Citation(
                chunk_id="c0ffee000001",
                source="user/occupancy.md",
                section="Occupancy > Refresh",
                snippet="Occupancy is refreshed every minute.",
            ),
        ),
        "tool_calls": (
            ToolCallRecord(
                name="get_building",
                arguments={"building_id": "bld-northwind-harbor"},
                ok=True,
                error=None,
                duration_ms=12.5,
            ),
        ),
        "usage": UsageOut(input_tokens=10, output_tokens=5, hops=[]),
        "cost": CostOut(estimated_usd=0.0001, provider_usd=None),
    }
    values.update(fields)
    return TurnRecord(**values)


@pytest.fixture
async def pg(db_url: str) -> AsyncIterator[PgConversationStore]:
    store = await PgConversationStore.connect(db_url, max_size=4)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> ConversationStore:
    if request.param == "memory":
        return InMemoryConversationStore()
    pg_store: PgConversationStore = request.getfixturevalue("pg")
    return pg_store


# --- the contract ---------------------------------------------------------------------------------


async def test_a_conversation_starts_with_its_first_turn_and_reads_back_whole(
    store: ConversationStore,
) -> None:
    first = record()
    conversation, turn = await store.start("nina", first)
    assert (conversation.owner, conversation.turn_count, turn.number) == ("nina", 1, 1)
    assert conversation.title == first.question
    found = await store.read("nina", conversation.id)
    assert found is not None
    read, turns = found
    assert read == conversation
    assert [t.number for t in turns] == [1]
    assert turns[0].record == first  # question, answer, citations, tool trace, usage, cost...
    assert await store.get("nina", conversation.id) == conversation


async def test_turns_append_in_order_and_move_the_conversation_up(
    store: ConversationStore,
) -> None:
    older, _ = await store.start("nina", record("What does CV-E1033 mean?"))
    newer, _ = await store.start("nina", record("How busy is Harbor Warehouse?"))
    page = await store.recent("nina", limit=10)
    assert [c.id for c in page.conversations] == [newer.id, older.id]
    updated, turn = await store.append("nina", older.id, record("how do I fix it?"), max_turns=5)
    assert (updated.turn_count, turn.number) == (2, 2)
    assert updated.updated_at > older.updated_at and updated.title == older.title
    page = await store.recent("nina", limit=10)
    assert [c.id for c in page.conversations] == [older.id, newer.id]
    found = await store.read("nina", older.id)
    assert found is not None
    assert [(t.number, t.record.question) for t in found[1]] == [
        (1, "What does CV-E1033 mean?"),
        (2, "how do I fix it?"),
    ]


async def test_another_owners_conversation_is_exactly_as_absent_as_an_unknown_one(
    store: ConversationStore,
) -> None:
    conversation, _ = await store.start("nina", record())
    unknown = uuid.uuid4()
    for ident in (conversation.id, unknown):
        assert await store.get("eve", ident) is None
        assert await store.read("eve", ident) is None
        assert await store.delete("eve", ident) is False
        with pytest.raises(NoSuchConversation):
            await store.append("eve", ident, record(), max_turns=50)
    assert (await store.recent("eve", limit=10)).conversations == []
    found = await store.read("nina", conversation.id)
    assert found is not None and found[0].turn_count == 1 and len(found[1]) == 1


async def test_a_full_conversation_refuses_a_turn_and_keeps_its_count(
    store: ConversationStore,
) -> None:
    conversation, _ = await store.start("nina", record())
    await store.append("nina", conversation.id, record("second"), max_turns=2)
    with pytest.raises(ConversationFull) as info:
        await store.append("nina", conversation.id, record("third"), max_turns=2)
    assert info.value.max_turns == 2 and info.value.conversation_id == conversation.id
    found = await store.read("nina", conversation.id)
    assert found is not None
    assert found[0].turn_count == 2 and [t.number for t in found[1]] == [1, 2]


async def test_pages_cover_every_conversation_once_newest_first(
    store: ConversationStore,
) -> None:
    made = [(await store.start("nina", record(f"question {i}")))[0] for i in range(5)]
    await store.start("eve", record("not nina's"))
    seen: list[uuid.UUID] = []
    sizes: list[int] = []
    page = await store.recent("nina", limit=2)
    while True:
        seen += [c.id for c in page.conversations]
        sizes.append(len(page.conversations))
        if page.next_cursor is None:
            break
        page = await store.recent("nina", limit=2, after=page.next_cursor)
    assert sizes == [2, 2, 1]
    assert seen == [c.id for c in reversed(made)]
    exact = await store.recent("nina", limit=5)
    assert len(exact.conversations) == 5 and exact.next_cursor is None
    with pytest.raises(ValueError):
        await store.recent("nina", limit=0)


async def test_delete_takes_the_turns_with_it(store: ConversationStore) -> None:
    conversation, _ = await store.start("nina", record())
    await store.append("nina", conversation.id, record("again"), max_turns=5)
    assert await store.delete("nina", conversation.id) is True
    assert await store.read("nina", conversation.id) is None
    assert await store.delete("nina", conversation.id) is False
    with pytest.raises(NoSuchConversation):
        await store.append("nina", conversation.id, record(), max_turns=5)


async def test_delete_all_takes_every_one_of_the_owners_and_no_other(
    store: ConversationStore,
) -> None:
    mine = [(await store.start("nina", record(f"q{i}")))[0] for i in range(3)]
    await store.append("nina", mine[0].id, record("again"), max_turns=5)
    theirs, _ = await store.start("eve", record("eve's"))
    assert await store.delete_all("nina") == 3
    assert (await store.recent("nina", limit=10)).conversations == []
    assert all([await store.read("nina", c.id) is None for c in mine])
    assert await store.read("eve", theirs.id) is not None
    assert await store.delete_all("nina") == 0


async def test_who_wrote_each_answer_is_kept_with_its_turn(store: ConversationStore) -> None:
    conversation, _ = await store.start("nina", record(answered_by="service"))
    await store.append("nina", conversation.id, record(answered_by="model"), max_turns=5)
    await store.append("nina", conversation.id, record(), max_turns=5)  # not recorded
    found = await store.read("nina", conversation.id)
    assert found is not None
    assert [t.record.answered_by for t in found[1]] == ["service", "model", None]


def test_the_title_is_the_first_line_of_the_first_question_within_bounds() -> None:
    assert title_of("  How busy   is it?\nmore lines") == "How busy is it?"
    long = title_of("word " * 100)
    assert len(long) == TITLE_CHARS and long.endswith("…")


# --- PostgreSQL only --------------------------------------------------------------------------


async def _counts(pool: asyncpg.Pool) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM conversations) AS c, "
        "(SELECT count(*) FROM conversation_turns) AS t"
    )
    assert row is not None
    return int(row["c"]), int(row["t"])


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def sleeping(pool: asyncpg.Pool) -> int:
    """Statements of the database that sit in the trigger's pg_sleep."""
    return int(
        await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
    )


FAIL_ON_BOOM = """
CREATE FUNCTION fail_on_boom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.question = 'boom' THEN RAISE EXCEPTION 'simulated failure mid-write'; END IF;
    IF NEW.question = 'slow' THEN PERFORM pg_sleep(30); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_on_boom BEFORE INSERT ON conversation_turns
    FOR EACH ROW EXECUTE FUNCTION fail_on_boom();
"""


@pytest.mark.integration
async def test_a_turn_that_fails_half_way_leaves_nothing(pg: PgConversationStore) -> None:
    """The turn's INSERT fails after the conversation row was written (``start``) or its
    count raised (``append``): the transaction rolls all of it back."""
    await pg.pool.execute(FAIL_ON_BOOM)
    with pytest.raises(asyncpg.RaiseError):
        await pg.start("nina", record("boom"))
    assert await _counts(pg.pool) == (0, 0)
    assert (await pg.recent("nina", limit=10)).conversations == []

    conversation, _ = await pg.start("nina", record())
    with pytest.raises(asyncpg.RaiseError):
        await pg.append("nina", conversation.id, record("boom"), max_turns=5)
    assert await pg.get("nina", conversation.id) == conversation  # count and time unchanged
    assert await _counts(pg.pool) == (1, 1)


@pytest.mark.integration
async def test_a_write_cancelled_half_way_leaves_nothing(pg: PgConversationStore) -> None:
    """What a disconnect or a timeout does to a write in flight: the task is cancelled
    inside the transaction (the turn's INSERT is running); nothing of it stays, and the
    store goes on working."""
    await pg.pool.execute(FAIL_ON_BOOM)
    conversation, _ = await pg.start("nina", record())
    for write in (
        lambda: pg.start("nina", record("slow")),
        lambda: pg.append("nina", conversation.id, record("slow"), max_turns=5),
    ):
        task = asyncio.ensure_future(write())
        await until(lambda: _is(sleeping(pg.pool), 1))  # inside the turn's INSERT
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await until(lambda: _is(sleeping(pg.pool), 0))  # the server-side statement is cancelled too
    assert await _counts(pg.pool) == (1, 1)
    assert await pg.get("nina", conversation.id) == conversation
    _, turn = await pg.append("nina", conversation.id, record("after"), max_turns=5)
    assert turn.number == 2


@pytest.mark.integration
async def test_concurrent_appends_keep_the_limit_and_dense_numbers(
    pg: PgConversationStore,
) -> None:
    conversation, _ = await pg.start("nina", record())
    results = await asyncio.gather(
        *(pg.append("nina", conversation.id, record(f"q{i}"), max_turns=5) for i in range(10)),
        return_exceptions=True,
    )
    stored = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(stored) == 4 and all(isinstance(r, ConversationFull) for r in refused)
    found = await pg.read("nina", conversation.id)
    assert found is not None
    assert found[0].turn_count == 5 and [t.number for t in found[1]] == [1, 2, 3, 4, 5]


@pytest.mark.integration
async def test_text_postgres_cannot_hold_is_kept_as_a_replacement_character(
    pg: PgConversationStore,
) -> None:
    nul = record(
        "what is \x00 this?",
        tool_calls=(
            ToolCallRecord(
                name="search_docs",
                arguments={"query": "a\x00b"},
                ok=False,
                error="bad \x00",
                duration_ms=1.0,
            ),
        ),
    )
    conversation, _ = await pg.start("nina", nul)
    found = await pg.read("nina", conversation.id)
    assert found is not None
    stored = found[1][0].record
    assert stored.question == "what is \ufffd this?"
    assert stored.tool_calls[0].arguments == {"query": "a\ufffdb"}
    assert stored.tool_calls[0].error == "bad \ufffd"


@pytest.mark.integration
async def test_a_turn_stored_before_answered_by_reads_back_without_it(empty_db_url: str) -> None:
    """Migration 0005 adds the column to a table that already holds turns: they stay
    readable (``answered_by`` None, never guessed), and the column takes only the two
    authors."""
    from foundation.database import migrate

    await asyncio.to_thread(migrate, empty_db_url, 384, "0004")
    conn = await asyncpg.connect(empty_db_url)
    try:
        ident = uuid.uuid4()
        await conn.execute(
            "INSERT INTO conversations (id, owner_sub, title, turn_count) "
            "VALUES ($1, 'nina', 'old', 1)",
            ident,
        )
        await conn.execute(
            "INSERT INTO conversation_turns (conversation_id, turn, question, answer, "
            "decision, idk, model) VALUES ($1, 1, 'How busy?', 'Quiet.', 'answered', false, 'm')",
            ident,
        )
        await asyncio.to_thread(migrate, empty_db_url, 384)
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "UPDATE conversation_turns SET answered_by = 'judge' WHERE conversation_id = $1",
                ident,
            )
    finally:
        await conn.close()
    store = await PgConversationStore.connect(empty_db_url, max_size=1)
    try:
        found = await store.read("nina", ident)
        assert found is not None
        (old,) = found[1]
        assert (old.record.answer, old.record.answered_by) == ("Quiet.", None)
        await store.append("nina", ident, record(answered_by="model"), max_turns=5)
        again = await store.read("nina", ident)
        assert again is not None and [t.record.answered_by for t in again[1]] == [None, "model"]
    finally:
        await store.close()


@pytest.mark.integration
async def test_a_database_not_at_head_is_refused_by_name(empty_db_url: str) -> None:
    with pytest.raises(DatabaseError, match="agent-service db up"):
        await PgConversationStore.connect(empty_db_url)


@pytest.mark.integration
async def test_prune_deletes_what_the_ttl_has_passed_in_batches(pg: PgConversationStore) -> None:
    """Five conversations of two owners, three last active 40 days ago (one of which gets a
    turn now, so it is kept): a 30-day prune in batches of 1 deletes the two others and
    their turns, reports them (a dry run first, deleting nothing), and a second finds none."""
    made = [
        (await pg.start(owner, record()))[0] for owner in ("nina", "nina", "eve", "eve", "nina")
    ]
    for conversation in made[:3]:
        await pg.append(conversation.owner, conversation.id, record("again"), max_turns=5)
    await pg.pool.execute(
        "UPDATE conversations SET updated_at = now() - interval '40 days' WHERE id = ANY($1)",
        [c.id for c in made[:3]],
    )
    await pg.append("nina", made[0].id, record("back again"), max_turns=5)
    ttl = timedelta(days=30)
    dry = await pg.prune(ttl, dry_run=True)
    assert (dry.conversations, dry.turns, dry.dry_run) == (2, 4, True)
    assert await _counts(pg.pool) == (5, 9)
    report = await pg.prune(ttl, batch_size=1)
    assert (report.conversations, report.turns, report.batches) == (2, 4, 2)
    assert report.cutoff >= dry.cutoff  # the database's clock, read by each run
    assert await _counts(pg.pool) == (3, 5)
    assert await pg.read("nina", made[0].id) is not None  # a turn today: kept
    assert all([await pg.read(c.owner, c.id) is None for c in made[1:3]])
    assert (await pg.prune(ttl)).conversations == 0
    with pytest.raises(ValueError):
        await pg.prune(timedelta(0))
