"""``POST /ingest`` and ``GET /ingest/{run_id}`` on the ``LocalBackend``: admin only (Cedar),
202 and a run that progresses to ``succeeded`` (small documentation roots in a temporary
folder, a fresh migrated database, the real MiniLM), idempotent re-runs, 409 while running,
a failed run's message, 404 for unknown runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import (
    ADMIN,
    CUSTOMER,
    NORTHWIND_ADMIN,
    NORTHWIND_STAFF,
    SECRET,
    is_envelope,
)

from foundation.eval_tokens import mint_eval_token
from foundation.settings import Settings
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer
from serve_app.local_backend import LocalBackend

pytestmark = pytest.mark.integration

SettingsFactory = Callable[..., Settings]
BackendFactory = Callable[..., LocalBackend]
ClientFactory = Callable[..., httpx.AsyncClient]


@pytest.fixture
def docs_roots(tmp_path: Path) -> list[str]:
    public = tmp_path / "docs" / "user"
    staff = tmp_path / "docs" / "staff"
    public.mkdir(parents=True)
    staff.mkdir(parents=True)
    (public / "alerts.md").write_text(
        "# Alerts\n\nAlerts fire when a room passes its capacity.\n\n"
        "## Cooldown\n\nThe default cooldown is 15 minutes.\n",
        encoding="utf-8",
    )
    (staff / "runbook.md").write_text(
        "# Runbook\n\nRotate gateway keys every 90 days.\n", encoding="utf-8"
    )
    return [f"{public}=", f"{staff}=role:business_staff"]


@pytest.fixture
def client_for(
    make_settings: SettingsFactory,
    make_backend: BackendFactory,
    authorizer: CedarAuthorizer,
    asgi_client: ClientFactory,
) -> Callable[..., tuple[httpx.AsyncClient, LocalBackend]]:
    def make(**overrides: Any) -> tuple[httpx.AsyncClient, LocalBackend]:
        settings = make_settings(**overrides)
        backend = make_backend(settings)
        return asgi_client(create_app(backend, settings, authorizer)), backend

    return make


async def wait_for(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """Poll the run until it is no longer pending or running (at most two minutes)."""
    async with asyncio.timeout(120):
        while True:
            response = await client.get(f"/ingest/{run_id}", headers=ADMIN)
            assert response.status_code == 200, response.text
            run: dict[str, Any] = response.json()
            if run["status"] not in ("pending", "running"):
                return run
            await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    "headers",
    [NORTHWIND_STAFF, NORTHWIND_ADMIN, CUSTOMER],
    ids=["business_staff", "business_admin", "standard_customer"],
)
async def test_ingest_is_403_below_admin(
    headers: dict[str, str], client_for: Callable[..., Any], db_url: str, docs_roots: list[str]
) -> None:
    client, backend = client_for(database_url=db_url, doc_roots=docs_roots)
    response = await client.post("/ingest", headers=headers)
    assert response.status_code == 403
    assert response.json() == {
        "error": {"code": "forbidden", "message": "ingesting documents requires the admin role"}
    }
    assert (await client.get("/ingest/anything", headers=headers)).status_code == 403
    assert backend._runs == {}  # nothing was started


async def test_ingest_needs_credentials(client_for: Callable[..., Any], db_url: str) -> None:
    client, _ = client_for(database_url=db_url)
    response = await client.post("/ingest")
    assert response.status_code == 401 and is_envelope(response.json(), "unauthenticated")


async def test_admin_ingest_is_202_then_progresses_to_succeeded(
    client_for: Callable[..., Any], db_url: str, docs_roots: list[str]
) -> None:
    client, backend = client_for(database_url=db_url, doc_roots=docs_roots)
    response = await client.post("/ingest", headers=ADMIN)
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["status"] in ("pending", "running") and run["submitted_at"]
    assert response.headers["location"] == f"/ingest/{run['run_id']}"

    done = await wait_for(client, run["run_id"])
    assert done["status"] == "succeeded", done
    assert done["progress"] == {"done": 2, "total": 2}
    counts = done["counts"]
    assert (counts["discovered"], counts["new"], counts["unchanged"]) == (2, 2, 0)
    assert counts["chunks_written"] >= 2 and done["finished_at"] and done["message"] is None
    store = await backend.store.get()
    assert await store.counts() == (2, counts["chunks_written"])

    # a second run finds nothing to do; with prune=true a removed source is deleted
    again = await client.post("/ingest", headers=ADMIN, json={"prune": False})
    second = await wait_for(client, again.json()["run_id"])
    assert second["status"] == "succeeded"
    assert (second["counts"]["new"], second["counts"]["unchanged"]) == (0, 2)
    assert second["progress"] == {"done": 0, "total": 0}


async def test_prune_removes_documents_whose_source_is_gone(
    client_for: Callable[..., Any], db_url: str, docs_roots: list[str]
) -> None:
    client, backend = client_for(database_url=db_url, doc_roots=docs_roots)
    first = await client.post("/ingest", headers=ADMIN)
    assert (await wait_for(client, first.json()["run_id"]))["status"] == "succeeded"
    staff_root = Path(docs_roots[1].partition("=")[0])
    (staff_root / "runbook.md").unlink()
    pruned = await client.post("/ingest", headers=ADMIN, json={"prune": True})
    run = await wait_for(client, pruned.json()["run_id"])
    assert run["status"] == "succeeded" and run["counts"]["pruned"] == 1
    store = await backend.store.get()
    assert (await store.counts())[0] == 1


async def test_a_second_run_while_one_is_running_is_409(
    client_for: Callable[..., Any], db_url: str, docs_roots: list[str]
) -> None:
    client, _ = client_for(database_url=db_url, doc_roots=docs_roots)
    first = await client.post("/ingest", headers=ADMIN)
    assert first.status_code == 202
    second = await client.post("/ingest", headers=ADMIN)
    assert second.status_code == 409
    assert is_envelope(second.json(), "ingest_in_progress")
    assert first.json()["run_id"] in second.json()["error"]["message"]
    assert (await wait_for(client, first.json()["run_id"]))["status"] == "succeeded"


async def test_an_eval_token_admin_may_ingest(
    client_for: Callable[..., Any], db_url: str, docs_roots: list[str]
) -> None:
    client, _ = client_for(database_url=db_url, doc_roots=docs_roots)
    token = mint_eval_token(SECRET, "evals", ["admin"], [])
    response = await client.post("/ingest", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 202
    assert (await wait_for(client, response.json()["run_id"]))["status"] == "succeeded"


async def test_a_failed_run_reports_why(
    client_for: Callable[..., Any], db_url: str, tmp_path: Path
) -> None:
    client, _ = client_for(database_url=db_url, doc_roots=[f"{tmp_path / 'missing'}="])
    response = await client.post("/ingest", headers=ADMIN)
    assert response.status_code == 202
    run = await wait_for(client, response.json()["run_id"])
    assert run["status"] == "failed" and run["finished_at"]
    assert "is not a directory" in run["message"]
    assert "Traceback" not in run["message"]


async def test_a_run_against_a_down_database_fails_cleanly(
    client_for: Callable[..., Any], docs_roots: list[str]
) -> None:
    client, _ = client_for(doc_roots=docs_roots)  # the default test URL: nothing listens
    response = await client.post("/ingest", headers=ADMIN)
    assert response.status_code == 202
    run = await wait_for(client, response.json()["run_id"])
    assert run["status"] == "failed" and run["message"]


async def test_unknown_run_is_404(client_for: Callable[..., Any], db_url: str) -> None:
    client, _ = client_for(database_url=db_url)
    response = await client.get("/ingest/ingest-000000000000", headers=ADMIN)
    assert response.status_code == 404
    assert response.json() == {
        "error": {"code": "not_found", "message": "no ingestion run 'ingest-000000000000'"}
    }


async def test_closing_the_backend_stops_a_running_ingest(
    make_settings: SettingsFactory,
    make_backend: BackendFactory,
    db_url: str,
    docs_roots: list[str],
) -> None:
    from foundation.identity import AuthUser
    from serve_app.backend import IngestRequest

    backend = make_backend(make_settings(database_url=db_url, doc_roots=docs_roots))
    admin = AuthUser.from_claims_header(ADMIN["x-gateway-claims"])
    run = await backend.start_ingest(admin, IngestRequest())
    await backend.close()
    status = await backend.ingest_status(run.run_id)
    assert status is not None and status.status == "stopped" and status.finished_at
