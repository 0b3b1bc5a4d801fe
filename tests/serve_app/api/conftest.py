"""Fixtures for the HTTP API tests: the real local-world twin and sensor simulators and the
scripted OpenAI-compatible model server (one each per session, reset per test), the real
Cedar policies, settings pointing at them, and builders for apps, backends and clients (httpx
over ASGI, or real HTTP through uvicorn on 127.0.0.1)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import SECRET, FakeBackend

from foundation.settings import Settings
from local_world.clock import FixedClock
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.sensor_service import create_sensor_app
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import World, build_world
from serve_app.api.app import create_app
from serve_app.api.single_process import create_single_process_app
from serve_app.authz import CedarAuthorizer, load_authorizer
from serve_app.local_backend import LocalBackend
from serve_app.wiring import build_local_backend
from tests.shipped_tools import shipped_registry

PINNED = "2025-03-04T10:30:00Z"


@pytest.fixture(scope="session")
def api_world() -> World:
    return build_world()


@pytest.fixture(scope="session")
def api_clock() -> FixedClock:
    return FixedClock(PINNED)


@pytest.fixture(scope="session")
def twin_url(api_world: World, api_clock: FixedClock) -> Iterator[str]:
    with run_in_thread(create_twin_app(api_world, clock=api_clock)) as url:
        yield url


@pytest.fixture(scope="session")
def sensor_url(api_world: World, api_clock: FixedClock) -> Iterator[str]:
    with run_in_thread(create_sensor_app(api_world, clock=api_clock)) as url:
        yield url


@pytest.fixture(scope="session")
def _scripted_server() -> Iterator[tuple[str, ScriptedLLM]]:
    state = ScriptedLLM()
    with run_in_thread(create_llm_app(state)) as url:
        yield url + "/v1", state


@pytest.fixture
def llm(_scripted_server: tuple[str, ScriptedLLM]) -> Iterator[ScriptedLLM]:
    state = _scripted_server[1]
    state.reset()
    yield state
    state.reset()


@pytest.fixture(scope="session")
def authorizer() -> CedarAuthorizer:
    return load_authorizer()


@pytest.fixture
def make_settings(
    tmp_path: Path,
    twin_url: str,
    sensor_url: str,
    _scripted_server: tuple[str, ScriptedLLM],
) -> Callable[..., Settings]:
    """Settings pointing at the simulators and the scripted model; ``overrides`` win."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "_env_file": None,
            "agent_service_home": tmp_path / "home",
            "database_url": "postgresql://nobody@127.0.0.1:1/none",  # tests set a real one
            "twin_service_url": twin_url,
            "sensor_service_url": sensor_url,
            "llm_base_url": _scripted_server[0],
            "llm_api_key": "test-key",
            "answer_model": "local/scripted",
            "llm_max_retries": 0,
            "llm_timeout_seconds": 10.0,
            "eval_jwt_secret": SECRET,
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
async def make_backend(
    authorizer: CedarAuthorizer, minilm: Any
) -> AsyncIterator[Callable[..., LocalBackend]]:
    """``build_local_backend`` with the session's real MiniLM (loaded once). Backends used
    in-process are closed afterwards; served ones are closed by their app's lifespan."""
    built: list[LocalBackend] = []

    def make(settings: Settings, **kwargs: Any) -> LocalBackend:
        kwargs.setdefault("embedder", minilm)
        kwargs.setdefault("registry", shipped_registry())  # what the route tests pin
        backend = build_local_backend(settings, authorizer=authorizer, **kwargs)
        built.append(backend)
        return backend

    yield make
    for backend in built:
        if not getattr(backend, "_served", False):
            await backend.close()


@pytest.fixture
async def asgi_client() -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """An httpx client calling an app in-process (``raise_app_exceptions=False``: a 500 is
    a response, as over the network)."""
    clients: list[httpx.AsyncClient] = []

    def make(app: Any, **kwargs: Any) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        client = httpx.AsyncClient(transport=transport, base_url="http://testserver", **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def fake_app(
    make_settings: Callable[..., Settings], authorizer: CedarAuthorizer
) -> Callable[..., tuple[Any, FakeBackend]]:
    """``create_app`` over a ``FakeBackend`` (route-level behaviour, no model, no DB)."""

    def make(
        backend: FakeBackend | None = None, **setting_overrides: Any
    ) -> tuple[Any, FakeBackend]:
        fake = backend or FakeBackend()
        app = create_app(fake, make_settings(**setting_overrides), authorizer)
        return app, fake

    return make


@pytest.fixture
def serve_local(
    authorizer: CedarAuthorizer,
) -> Iterator[Callable[..., str]]:
    """Serve the single-process app over a given backend with uvicorn on 127.0.0.1; returns
    its base URL. The app's lifespan starts and closes the backend on the server's loop."""
    stack = contextlib.ExitStack()

    def serve(settings: Settings, backend: Any) -> str:
        inner = getattr(backend, "inner", backend)
        inner._served = True
        app = create_single_process_app(settings, backend=backend, authorizer=authorizer)
        return stack.enter_context(run_in_thread(app))

    with stack:
        yield serve


# --- no test may reach a real model provider (as in tests/serve_app/agent) ------------------------
