"""What a PostgreSQL restart looks like to the conversation store, without the server
(the restart itself, under load over HTTP: ``tests/serve_app/api/test_database_restart.py``).

A server shutting down mid-transaction cuts the connection while the transaction's ROLLBACK
is about to run on it; asyncpg then raises ``InternalClientError`` ("cannot switch to state
15; another operation (2) is in progress") instead of a connection error. It must be the
same 503 as any other database failure: in the restart test it was a 500 (once in a few
runs, when the stop landed inside a conversation's transaction)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from conversations.store import PgConversationStore
from foundation.settings import Settings
from serve_app.backend import ConversationsUnavailable
from serve_app.threads import LazyConversationStore
from serve_app.wiring import conversations_config

CUT = asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress")


class CutStore:
    """A ``PgConversationStore`` whose every statement meets the cut connection."""

    async def read(self, owner: str, conversation_id: uuid.UUID) -> Any:
        raise CUT

    async def start(self, owner: str, record: Any) -> Any:
        raise CUT

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("method", ["read", "start"])
async def test_a_transaction_cut_by_a_server_shutdown_is_a_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    async def connect(*args: Any, **kwargs: Any) -> CutStore:
        return CutStore()

    monkeypatch.setattr(PgConversationStore, "connect", connect)
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path,
        database_url="postgresql://nobody@127.0.0.1:1/none",
    )
    store = LazyConversationStore(settings, conversations_config(settings))
    with pytest.raises(ConversationsUnavailable) as info:
        if method == "read":
            await store.read("nina", uuid.uuid4())
        else:
            await store.start("nina", object())  # type: ignore[arg-type]
    assert info.value.status == 503 and info.value.code == "conversations_unavailable"
    assert "state 15" not in info.value.message
    await store.close()
