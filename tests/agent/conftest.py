"""Fixtures for the agent tests: the real local-world twin and sensor simulators and the
scripted OpenAI-compatible model server, each over real HTTP on 127.0.0.1 (one per session,
reset per test), the real Cedar policies, and builders for tool contexts and agents; and the
in-process set (``local_*``, ``make_local_agent``, ``no_sockets``) at the end of the file."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_helpers import PINNED, FakeRetriever, Mode, Service
from fastapi import FastAPI

from agent.llm.base import LLMClient
from agent.llm.openai_client import OpenAICompatibleClient
from agent.loop import Agent
from agent.tools import (
    Downstream,
    LocalToolExecutor,
    ToolContext,
    ToolRegistry,
)
from foundation.identity import AuthUser
from foundation.settings import Settings
from local_world._service import get_control
from local_world.clock import FixedClock
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.sensor_service import create_sensor_app
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import World, build_world
from serve_app.authz import CedarAuthorizer, load_authorizer
from serve_app.wiring import build_agent, build_downstream
from tests.shipped_tools import shipped_registry


@pytest.fixture(scope="session")
def world() -> World:
    return build_world()


@pytest.fixture(scope="session")
def pinned_clock() -> FixedClock:
    return FixedClock(PINNED)


@pytest.fixture(scope="session")
def _twin_server(world: World, pinned_clock: FixedClock) -> Iterator[Service]:
    app = create_twin_app(world, clock=pinned_clock)
    with run_in_thread(app) as url:
        yield Service(url, get_control(app))


@pytest.fixture(scope="session")
def _sensor_server(world: World, pinned_clock: FixedClock) -> Iterator[Service]:
    app = create_sensor_app(world, clock=pinned_clock)
    with run_in_thread(app) as url:
        yield Service(url, get_control(app))


@pytest.fixture(scope="session")
def _llm_server() -> Iterator[tuple[str, ScriptedLLM]]:
    state = ScriptedLLM()
    with run_in_thread(create_llm_app(state)) as url:
        yield url, state


def _reset(service: Service) -> None:
    service.control.reset_faults()
    service.control.clear_requests()


@pytest.fixture
def clock(pinned_clock: FixedClock) -> FixedClock:
    pinned_clock.set(PINNED)
    return pinned_clock


@pytest.fixture
def twin(_twin_server: Service, clock: FixedClock) -> Iterator[Service]:
    _reset(_twin_server)
    yield _twin_server
    _reset(_twin_server)


@pytest.fixture
def sensor(_sensor_server: Service, clock: FixedClock) -> Iterator[Service]:
    _reset(_sensor_server)
    yield _sensor_server
    _reset(_sensor_server)


@pytest.fixture
def llm(_llm_server: tuple[str, ScriptedLLM]) -> Iterator[ScriptedLLM]:
    _, state = _llm_server
    state.reset()
    yield state
    state.reset()


@pytest.fixture
def llm_url(_llm_server: tuple[str, ScriptedLLM], llm: ScriptedLLM) -> str:
    return _llm_server[0] + "/v1"


@pytest.fixture(scope="session")
def authorizer() -> CedarAuthorizer:
    return load_authorizer()


@pytest.fixture
def settings(twin: Service, sensor: Service, tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path / "home",
        twin_service_url=twin.url,
        sensor_service_url=sensor.url,
        twin_timeout_seconds=5.0,
        answer_model="local/scripted",
        llm_api_key="test-key",  # type: ignore[arg-type]
        llm_max_retries=0,
        llm_timeout_seconds=10.0,
    )


@pytest.fixture
async def downstream(settings: Settings) -> AsyncIterator[Downstream]:
    client = build_downstream(settings)
    yield client
    await client.aclose()


@pytest.fixture
def retriever() -> FakeRetriever:
    return FakeRetriever()


@pytest.fixture
def registry() -> ToolRegistry:
    return shipped_registry(timeout_seconds=10.0)


def _context_factory(
    downstream: Downstream,
    authorizer: CedarAuthorizer,
    retriever: FakeRetriever,
    clock: FixedClock,
) -> Callable[..., ToolContext]:
    """Builds a ``ToolContext`` per user; keyword overrides replace any field."""

    def make(user: AuthUser, **overrides: Any) -> ToolContext:
        values: dict[str, Any] = {
            "user": user,
            "downstream": downstream,
            "authorizer": authorizer,
            "retriever": retriever,
            "clock": clock,
        }
        values.update(overrides)
        return ToolContext(**values)

    return make


@pytest.fixture
def make_ctx(
    settings: Settings,
    downstream: Downstream,
    authorizer: CedarAuthorizer,
    retriever: FakeRetriever,
    clock: FixedClock,
) -> Callable[..., ToolContext]:
    return _context_factory(downstream, authorizer, retriever, clock)


def _agent(
    llm: LLMClient,
    settings: Settings,
    downstream: Downstream,
    authorizer: CedarAuthorizer,
    retriever: FakeRetriever,
    clock: FixedClock,
) -> Agent:
    """An ``Agent`` over the eight shipped tools (10 s timeout) with ``settings``' loop
    config."""
    tools = LocalToolExecutor(
        shipped_registry(timeout_seconds=10.0),
        downstream=downstream,
        authorizer=authorizer,
        retriever=retriever,
        clock=clock,
        observe_payloads=settings.observe_payloads,
    )
    # The fake stands in for a client built from these settings: it speaks their mode.
    mode = getattr(llm, "tool_calling_mode", "native")
    return build_agent(
        settings.model_copy(update={"tool_calling_mode": mode}), llm=llm, tools=tools
    )


@pytest.fixture
async def make_agent(
    settings: Settings,
    llm_url: str,
    downstream: Downstream,
    authorizer: CedarAuthorizer,
    retriever: FakeRetriever,
    clock: FixedClock,
) -> AsyncIterator[Callable[..., Agent]]:
    clients: list[OpenAICompatibleClient] = []

    def make(mode: Mode, **setting_overrides: Any) -> Agent:
        agent_settings = settings.model_copy(
            update={"tool_calling_mode": mode, **setting_overrides}
        )
        client = OpenAICompatibleClient(
            base_url=setting_overrides.get("llm_base_url", llm_url),
            api_key="test-key",
            default_model=agent_settings.answer_model,
            tool_calling_mode=mode,
            timeout_seconds=agent_settings.llm_timeout_seconds,
            max_retries=agent_settings.llm_max_retries,
        )
        clients.append(client)
        return _agent(client, agent_settings, downstream, authorizer, retriever, clock)

    yield make
    for client in clients:
        await client.aclose()


# --- no test may reach a real model provider -----------------------------------------------
# In the spirit of pydantic-ai's ``ALLOW_MODEL_REQUESTS = False``: building an ``openai`` SDK
# client (every LLM client here does) for a base URL that is not a loopback address fails the
# test, so no test can reach (or spend money at) a real provider, whatever its settings.


# --- in-process: the fake model port, the simulators over ASGI, no sockets ---------------------
# For the loop and tool tests: ``agent.testing.ScriptedModel`` instead of the HTTP scripted
# server, and twin/sensor apps reached through ``httpx.ASGITransport``. Every test here runs
# under ``no_sockets`` (``_sockets_guard``, autouse): a test or module that needs the wire (the
# HTTP adapter, a transport fault, timings of real round trips, PostgreSQL) says so with
# ``@pytest.mark.allow_sockets`` and why.

LOCAL_TWIN_URL = "http://twin.in-process"
LOCAL_SENSOR_URL = "http://sensor.in-process"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_sockets: exempt a test from the no_sockets guard (it needs the wire)"
    )


@pytest.fixture
def no_sockets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any attempt to connect a socket (in-process tests must not open one)."""
    if request.node.get_closest_marker("allow_sockets"):
        return

    def refuse(sock: socket.socket, address: Any) -> None:
        raise AssertionError(f"no_sockets: this test tried to connect to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture(autouse=True)
def _sockets_guard(request: pytest.FixtureRequest) -> None:
    """``no_sockets`` for every test of tests/agent but those marked ``allow_sockets``."""
    if not request.node.get_closest_marker("allow_sockets"):
        request.getfixturevalue("no_sockets")


@pytest.fixture(scope="session")
def _twin_app(world: World, pinned_clock: FixedClock) -> FastAPI:
    return create_twin_app(world, clock=pinned_clock)


@pytest.fixture(scope="session")
def _sensor_app(world: World, pinned_clock: FixedClock) -> FastAPI:
    return create_sensor_app(world, clock=pinned_clock)


@pytest.fixture
def local_twin(_twin_app: FastAPI, clock: FixedClock) -> Iterator[Service]:
    """twin-service in process (same control as ``twin``: faults, request log)."""
    service = Service(LOCAL_TWIN_URL, get_control(_twin_app))
    _reset(service)
    yield service
    _reset(service)


@pytest.fixture
def local_sensor(_sensor_app: FastAPI, clock: FixedClock) -> Iterator[Service]:
    service = Service(LOCAL_SENSOR_URL, get_control(_sensor_app))
    _reset(service)
    yield service
    _reset(service)


@pytest.fixture
def local_settings(tmp_path: Path) -> Settings:
    """``settings`` without servers: the downstream URLs are the in-process ones."""
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path / "home",
        twin_service_url=LOCAL_TWIN_URL,
        sensor_service_url=LOCAL_SENSOR_URL,
        twin_timeout_seconds=5.0,
        answer_model="local/scripted",
        llm_api_key="test-key",  # type: ignore[arg-type]
        llm_max_retries=0,
        llm_timeout_seconds=10.0,
    )


@pytest.fixture
async def local_downstream(
    _twin_app: FastAPI, _sensor_app: FastAPI, local_twin: Service, local_sensor: Service
) -> AsyncIterator[Downstream]:
    """``Downstream`` over ASGI: one client, each simulator mounted at its own origin."""
    client = httpx.AsyncClient(
        mounts={
            LOCAL_TWIN_URL: httpx.ASGITransport(app=_twin_app),
            LOCAL_SENSOR_URL: httpx.ASGITransport(app=_sensor_app),
        },
        follow_redirects=False,
    )
    yield Downstream(twin_url=LOCAL_TWIN_URL, sensor_url=LOCAL_SENSOR_URL, client=client)
    await client.aclose()


@pytest.fixture
def make_local_ctx(
    local_downstream: Downstream,
    authorizer: CedarAuthorizer,
    retriever: FakeRetriever,
    clock: FixedClock,
) -> Callable[..., ToolContext]:
    """``make_ctx`` over the in-process simulators."""

    return _context_factory(local_downstream, authorizer, retriever, clock)


@pytest.fixture
def make_local_agent(
    local_settings: Settings,
    local_downstream: Downstream,
    authorizer: CedarAuthorizer,
    retriever: FakeRetriever,
    clock: FixedClock,
) -> Callable[..., Agent]:
    """An ``Agent`` on a fake model (``agent.testing``) and the in-process simulators;
    ``setting_overrides`` as for ``make_agent`` (e.g. ``max_tool_hops=3``)."""

    def make(model: LLMClient, **setting_overrides: Any) -> Agent:
        agent_settings = local_settings.model_copy(update=setting_overrides)
        return _agent(model, agent_settings, local_downstream, authorizer, retriever, clock)

    return make
