"""PostgreSQL restarting under load (issue 19, item 5): the single-process app over real HTTP
(uvicorn on 127.0.0.1, the real ``LocalBackend``: agent, tools, knowledge base, conversation
store and usage limits on asyncpg pools) against a PostgreSQL server of this test's own (an
embedded one under the test home, not the session's shared server, which the other tests
use). Six clients send requests one after another, one route each; the server is stopped
(``pg_ctl stop -m fast``: open connections are cut), kept down, and started again on the
same socket, while they run.

What it shows, route by route, and what ``docs/security.md`` section 7.2 reports:

* While the database is down, every request that needs it ends quickly with a 503 and the
  error envelope: ``conversations_unavailable`` (``GET /conversations``,
  ``GET /conversations/{id}``, ``POST /ask`` continuing a conversation), ``limits_unavailable``
  (``POST /ask`` of a caller under ``RATE_LIMIT_*``), the readiness body (``GET /readyz``) -
  never a 500, never a wait until ``ASK_TIMEOUT_SECONDS``.
* ``POST /ask`` starting a new conversation (a caller the limits exempt) still answers 200:
  ``search_docs`` fails as a tool error the model reads (the designed behaviour of a tool
  that fails), and the turn is not stored (``turn: null`` and the note). ``POST /ingest`` is
  accepted (202) and its run fails at once, saying why (``GET /ingest/{id}``).
* Once the server is back, the same service (no restart) answers every route again: the
  pools reconnect on their next use; the time until each route first succeeds is printed.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import ADMIN, NORTHWIND_STAFF, is_envelope

from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from serve_app.local_backend import LocalBackend
from serve_app.threads import NOT_STORED_NOTE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTION = "Database restart load: how do I fix error CV-E1033?"
SEARCH = {"tool_calls": [{"name": "search_docs", "arguments": {"query": "CV-E1033"}}]}
ANSWER = {"text": "Restart the gateway."}
DOWN_AFTER_S = 2.0  # load before the stop
DOWN_FOR_S = 4.0  # the server stays stopped this long
AFTER_S = 6.0  # load after the server is back
FAST_S = 5.0  # a refusal slower than this is not "fast" (the ask timeout is 120 s)
RECOVER_S = 30.0  # every route answers again within this long of the server being back

# route -> the 503 codes it may answer while the database is down (None: the readiness body)
DB_ROUTES: dict[str, set[str] | None] = {
    "ask_thread": {"conversations_unavailable"},
    "ask_limited": {"limits_unavailable"},
    "list": {"conversations_unavailable"},
    "read": {"conversations_unavailable"},
    "readyz": None,
}


def own_server_home() -> Path:
    """This test's PostgreSQL lives beside the session's, in a data directory of its own
    (kept between sessions: initdb is most of a cold start)."""
    root = Path(os.environ.get("AGENT_SERVICE_TEST_HOME", "/tmp/agent-service-tests"))
    return root / "pg-restart"


@dataclass
class Outcome:
    route: str
    started: float  # seconds since the load began
    ended: float
    status: int  # 0: a transport error
    code: str  # the envelope's error code, "" for none
    body: Any

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[Path]:
    """A running embedded server of this module's own; yields its home."""
    from foundation.database import start_embedded, stop_embedded

    home = own_server_home()
    start_embedded(home)
    yield home
    stop_embedded(home)


@pytest.fixture
async def restart_db_url(own_postgres: Path) -> AsyncIterator[str]:
    import asyncpg

    from foundation.database import asyncpg_url, migrate, start_embedded, with_database

    admin_url = start_embedded(own_postgres).admin_url
    name = f"restart_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(asyncpg_url(admin_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = with_database(admin_url, name)
    await asyncio.to_thread(migrate, url, 384)
    yield url
    admin_url = start_embedded(own_postgres).admin_url  # up again, whatever the test did
    conn = await asyncpg.connect(asyncpg_url(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _send(
    http: httpx.AsyncClient, route: str, conversation_id: str, started: float
) -> Outcome:
    begin = time.monotonic() - started
    status, code, body = 0, "transport_error", None
    try:
        if route == "ask_new":
            response = await http.post("/ask", json={"question": QUESTION}, headers=ADMIN)
        elif route == "ask_thread":
            response = await http.post(
                "/ask",
                json={"question": QUESTION, "conversation_id": conversation_id},
                headers=ADMIN,
            )
        elif route == "ask_limited":
            response = await http.post("/ask", json={"question": QUESTION}, headers=NORTHWIND_STAFF)
        elif route == "list":
            response = await http.get("/conversations", headers=ADMIN)
        elif route == "read":
            response = await http.get(f"/conversations/{conversation_id}", headers=ADMIN)
        else:
            response = await http.get("/readyz")
        status, code = response.status_code, ""
        body = response.json()
        if status >= 400 and isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = str(body["error"].get("code", ""))
    except httpx.HTTPError as exc:
        body = repr(exc)
    return Outcome(route, begin, time.monotonic() - started, status, code, body)


def _search_failed(body: Any) -> bool:
    calls = body.get("tool_calls", []) if isinstance(body, dict) else []
    return any(c.get("name") == "search_docs" and not c.get("ok") for c in calls)


async def test_the_service_rides_out_a_postgresql_restart(
    own_postgres: Path,
    restart_db_url: str,
    make_settings: Callable[..., Settings],
    make_backend: Callable[..., LocalBackend],
    serve_local: Callable[..., str],
    llm: ScriptedLLM,
) -> None:
    from foundation.database import start_embedded, stop_embedded

    settings = make_settings(
        database_url=restart_db_url,
        conversation_max_turns=1000,
        history_max_tokens=0,  # the scripted model's step is picked by the message count
        rate_limit_user_per_minute=1_000_000,  # on, never reached; admins are exempt
    )
    llm.script(SEARCH, ANSWER, key=QUESTION, mode="loop")
    url = serve_local(settings, make_backend(settings))
    socket_before = start_embedded(own_postgres).admin_url

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        first = await http.post("/ask", json={"question": QUESTION}, headers=ADMIN)
        assert first.status_code == 200, first.text
        assert first.json()["turn"] == 1 and not _search_failed(first.json()), first.text
        conversation_id = first.json()["conversation_id"]

        outcomes: list[Outcome] = []
        marks: dict[str, float] = {}
        started = time.monotonic()
        stop = asyncio.Event()
        ingest: list[httpx.Response] = []

        async def client(route: str) -> None:
            while not stop.is_set():
                outcomes.append(await _send(http, route, conversation_id, started))
                await asyncio.sleep(0.02)

        async def restart() -> None:
            await asyncio.sleep(DOWN_AFTER_S)
            marks["stopping"] = time.monotonic() - started
            assert await asyncio.to_thread(stop_embedded, own_postgres)
            marks["down"] = time.monotonic() - started
            ingest.append(await http.post("/ingest", json={}, headers=ADMIN))
            if ingest[0].status_code == 202:
                run_id = ingest[0].json()["run_id"]
                for _ in range(100):
                    status = await http.get(f"/ingest/{run_id}", headers=ADMIN)
                    ingest.append(status)
                    if status.json().get("status") not in ("pending", "running"):
                        break
                    await asyncio.sleep(0.05)
            marks["ingest_done"] = time.monotonic() - started
            await asyncio.sleep(max(0.0, DOWN_FOR_S - (marks["ingest_done"] - marks["down"])))
            marks["starting"] = time.monotonic() - started
            await asyncio.to_thread(start_embedded, own_postgres)
            marks["up"] = time.monotonic() - started
            await asyncio.sleep(AFTER_S)
            stop.set()

        routes = ["ask_new", *DB_ROUTES]
        await asyncio.gather(restart(), *(client(route) for route in routes))
        assert start_embedded(own_postgres).admin_url == socket_before  # same address

        # After the load: every route answers, from the same service (no restart).
        final = {route: await _send(http, route, conversation_id, started) for route in routes}

    down, up = marks["down"], marks["up"]
    print(
        f"\n[pg-restart] stop took {down - marks['stopping']:.2f} s, down for "
        f"{marks['starting'] - down:.2f} s, start took {up - marks['starting']:.2f} s; "
        f"{len(outcomes)} requests"
    )
    # Never a 500, never a transport error; every error is a 503 with the envelope.
    assert not [o for o in outcomes if o.status not in (200, 503)], [
        (o.route, o.status, o.code, o.body) for o in outcomes if o.status not in (200, 503)
    ]
    for o in outcomes:
        if o.status == 503 and o.route != "readyz":
            assert is_envelope(o.body), (o.route, o.body)
            assert o.code in (DB_ROUTES.get(o.route) or set()), (o.route, o.code, o.body)

    # While it was down (started after the stop finished, ended before the start began).
    while_down = [o for o in outcomes if o.started >= down and o.ended <= marks["starting"]]
    for route in DB_ROUTES:
        seen = [o for o in while_down if o.route == route]
        assert seen, f"no {route} request while the database was down"
        assert all(o.status == 503 for o in seen), (route, [(o.status, o.code) for o in seen])
        slowest = max(o.seconds for o in seen)
        print(f"[pg-restart] down: {route}: {len(seen)} x 503, slowest {slowest * 1000:.0f} ms")
        assert slowest < FAST_S, (route, slowest)
    # POST /ingest is accepted and its run fails at once, saying why (no hang, no 500).
    assert ingest[0].status_code == 202, ingest[0].text
    finished = ingest[-1].json()
    assert finished["status"] == "failed" and finished["message"], finished
    print(
        f"[pg-restart] down: POST /ingest 202, its run {finished['status']} "
        f"{marks['ingest_done'] - marks['down']:.2f} s later: {finished['message'][:80]!r}"
    )
    answered = [o for o in while_down if o.route == "ask_new"]
    assert answered and all(o.status == 200 for o in answered), answered
    for o in answered:
        assert o.body["turn"] is None and NOT_STORED_NOTE in o.body["notes"], o.body
        assert _search_failed(o.body), o.body["tool_calls"]
    print(
        f"[pg-restart] down: ask_new: {len(answered)} x 200 (search_docs a tool error, turn "
        f"not stored), slowest {max(o.seconds for o in answered) * 1000:.0f} ms"
    )

    # Back up: each route's first success after the start finished, and its last failure.
    for route in routes:
        after = [o for o in outcomes if o.route == route and o.started >= up]
        ok = [o for o in after if o.status == 200 and not _search_failed(o.body)]
        bad = [o for o in outcomes if o.route == route and o.ended > up and o not in ok]
        first_ok = min((o.ended for o in ok), default=float("inf")) - up
        last_bad = max((o.ended for o in bad), default=up) - up
        print(
            f"[pg-restart] back: {route}: first success {first_ok:.2f} s after the server "
            f"was up; last failure {last_bad:+.2f} s; {len(after)} requests after"
        )
        assert first_ok < RECOVER_S, (route, [(o.status, o.code) for o in after])
        assert last_bad < RECOVER_S, route

    for route, outcome in final.items():
        assert outcome.status == 200, (route, outcome.status, outcome.body)
    assert final["ask_new"].body["turn"] == 1 and not _search_failed(final["ask_new"].body)
    assert final["ask_thread"].body["turn"] > 1
    assert final["ask_limited"].body["turn"] == 1
