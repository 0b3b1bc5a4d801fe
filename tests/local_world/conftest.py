"""Fixtures for the local-world tests: each simulator runs once per session over real HTTP
(uvicorn on 127.0.0.1 in a thread); a per-test fixture resets its faults, request log,
scripts and the pinned clock so tests stay independent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from lw_helpers import PINNED, Running

from local_world.clock import FixedClock
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.sensor_service import create_sensor_app
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import World, build_world


@pytest.fixture(scope="session")
def world() -> World:
    return build_world()


@pytest.fixture(scope="session")
def pinned_clock() -> FixedClock:
    return FixedClock(PINNED)


@pytest.fixture(scope="session")
def _twin_server(world: World, pinned_clock: FixedClock) -> Iterator[Running]:
    app = create_twin_app(world, clock=pinned_clock)
    with run_in_thread(app) as url:
        yield Running(url, app)


@pytest.fixture(scope="session")
def _sensor_server(world: World, pinned_clock: FixedClock) -> Iterator[Running]:
    app = create_sensor_app(world, clock=pinned_clock)
    with run_in_thread(app) as url:
        yield Running(url, app)


@pytest.fixture(scope="session")
def _llm_server() -> Iterator[tuple[str, ScriptedLLM]]:
    llm = ScriptedLLM()
    with run_in_thread(create_llm_app(llm)) as url:
        yield url, llm


def _reset(running: Running) -> None:
    running.control.reset_faults()
    running.control.clear_requests()


@pytest.fixture
def clock(pinned_clock: FixedClock) -> FixedClock:
    pinned_clock.set(PINNED)
    return pinned_clock


@pytest.fixture
def twin(_twin_server: Running, clock: FixedClock) -> Iterator[Running]:
    _reset(_twin_server)
    yield _twin_server
    _reset(_twin_server)


@pytest.fixture
def sensor(_sensor_server: Running, clock: FixedClock) -> Iterator[Running]:
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
    return _llm_server[0]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client
