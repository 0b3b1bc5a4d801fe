"""``/healthz`` and ``/readyz`` on the ``LocalBackend`` (database reachable, schema at head,
embedding dimension, provider configured), and the single-process server over real HTTP."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_helpers import NORTHWIND_STAFF

from foundation.settings import Settings
from local_world.scripted_llm import ScriptedLLM
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer
from serve_app.local_backend import LocalBackend

pytestmark = pytest.mark.integration

SettingsFactory = Callable[..., Settings]
BackendFactory = Callable[..., LocalBackend]
ClientFactory = Callable[..., httpx.AsyncClient]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def checks(body: dict[str, Any]) -> dict[str, bool]:
    return {c["name"]: c["ok"] for c in body["checks"]}


@pytest.fixture
def readyz(
    make_backend: BackendFactory, authorizer: CedarAuthorizer, asgi_client: ClientFactory
) -> Callable[..., Any]:
    async def get(settings: Settings, **backend_kwargs: Any) -> httpx.Response:
        backend = make_backend(settings, **backend_kwargs)
        client = asgi_client(create_app(backend, settings, authorizer))
        health = await client.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        return await client.get("/readyz")

    return get


async def test_ready_when_everything_is_there(
    readyz: Callable[..., Any], make_settings: SettingsFactory, db_url: str
) -> None:
    response = await readyz(make_settings(database_url=db_url))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ready"] is True
    assert checks(body) == {
        "database": True,
        "schema": True,
        "embedding_dim": True,
        "provider": True,
    }


async def test_503_when_the_database_is_down(
    readyz: Callable[..., Any], make_settings: SettingsFactory
) -> None:
    url = f"postgresql://agent:s3cret-pw@127.0.0.1:{closed_port()}/agent"
    response = await readyz(make_settings(database_url=url))
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert checks(body)["database"] is False and checks(body)["schema"] is False
    assert checks(body)["provider"] is True
    assert "s3cret-pw" not in response.text


async def test_503_when_the_schema_is_missing(
    readyz: Callable[..., Any], make_settings: SettingsFactory, empty_db_url: str
) -> None:
    response = await readyz(make_settings(database_url=empty_db_url))
    assert response.status_code == 503
    body = response.json()
    assert checks(body)["database"] is True and checks(body)["schema"] is False
    schema = next(c for c in body["checks"] if c["name"] == "schema")
    assert "agent-service db up" in schema["detail"]


async def test_503_when_the_embedding_dimension_differs(
    readyz: Callable[..., Any], make_settings: SettingsFactory, db_url: str
) -> None:
    response = await readyz(make_settings(database_url=db_url, embedding_dim=768))
    assert response.status_code == 503
    body = response.json()
    assert checks(body)["embedding_dim"] is False and checks(body)["schema"] is False


async def test_503_when_no_provider_is_configured(
    readyz: Callable[..., Any],
    make_settings: SettingsFactory,
    db_url: str,
    llm: ScriptedLLM,
    _scripted_server: tuple[str, ScriptedLLM],
) -> None:
    from agent.llm.openai_client import OpenAICompatibleClient

    settings = make_settings(
        database_url=db_url, llm_api_key=None, llm_base_url="https://openrouter.ai/api/v1"
    )
    stand_in = OpenAICompatibleClient(
        base_url=_scripted_server[0], api_key="k", default_model="local/scripted"
    )
    try:
        response = await readyz(settings, llm=stand_in)
    finally:
        await stand_in.aclose()
    assert response.status_code == 503
    assert checks(response.json()) == {
        "database": True,
        "schema": True,
        "embedding_dim": True,
        "provider": False,
    }


async def test_the_database_coming_back_makes_the_backend_ready(
    make_settings: SettingsFactory, make_backend: BackendFactory, db_url: str
) -> None:
    backend = make_backend(make_settings(database_url=db_url))
    real_url = await backend.store.url()
    backend.store._url = f"postgresql://x@127.0.0.1:{closed_port()}/x"  # down at first
    assert (await backend.readiness()).ready is False
    backend.store._url = real_url  # ... then back
    assert (await backend.readiness()).ready is True


async def test_single_process_server_over_real_http(
    make_settings: SettingsFactory,
    make_backend: BackendFactory,
    serve_local: Callable[..., str],
    llm: ScriptedLLM,
    db_url: str,
) -> None:
    settings = make_settings(database_url=db_url, api_prefix="/agent")
    backend = make_backend(settings)
    url = serve_local(settings, backend)
    llm.script({"text": "Hello from one process."}, key="Say hello")
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        assert (await client.get("/agent/healthz")).status_code == 200
        ready = await client.get("/agent/readyz")
        assert ready.status_code == 200, ready.text
        assert (await client.get("/readyz")).status_code == 200
        answer = await client.post(
            "/agent/ask", json={"question": "Say hello"}, headers=NORTHWIND_STAFF
        )
        assert answer.status_code == 200 and answer.json()["answer"] == "Hello from one process."
        assert (await client.get("/agent/docs")).status_code == 200
    assert backend.store.opened is not None  # opened at startup by the lifespan
