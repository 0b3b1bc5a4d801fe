"""The agent on an estate it was not written for (issue 42, item 5): the second local world
(local_world/worlds/second.yaml: UUID building ids, numeric room ids, a sensor type the
tools do not list), served by the same simulators in process, asked through the small-model
strategy with composed answers. Ids are resolved by lookup and by the words that introduce
them, never by their spelling; a type the tools do not list is reported, not dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_helpers import FakeRetriever, mesh_user

from agent.loop import Agent
from agent.testing import ScriptedModel
from agent.tools.downstream import Downstream
from agent.tools.executor import LocalToolExecutor
from foundation.settings import Settings
from local_world.clock import FixedClock
from local_world.sensor_service import create_sensor_app
from local_world.twin_service import create_twin_app
from local_world.world import build_world
from serve_app.authz import load_authorizer
from serve_app.wiring import build_agent
from tests.shipped_tools import shipped_registry

SECOND = Path(__file__).resolve().parents[2] / "local_world" / "worlds" / "second.yaml"
HOSPITAL = "b1cb1816-7d85-457c-9f32-2a1422d00e17"  # aurelia-health
LIBRARY = "ce9c02e4-aafb-4062-97ff-bbaaeca05990"  # tidewater.edu: not ines's
INES = mesh_user("ines", ("aurelia-health", "business_staff"))
TWIN, SENSORS = "http://second-twin.local", "http://second-sensors.local"


@pytest.fixture
async def second_agent(tmp_path: Path, pinned_clock: FixedClock) -> AsyncIterator[Agent]:
    world = build_world(path=SECOND)
    client = httpx.AsyncClient(
        mounts={
            TWIN: httpx.ASGITransport(app=create_twin_app(world, clock=pinned_clock)),
            SENSORS: httpx.ASGITransport(app=create_sensor_app(world, clock=pinned_clock)),
        }
    )
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path / "home",
        twin_service_url=TWIN,
        sensor_service_url=SENSORS,
        answer_model="local/scripted",
        tool_calling_mode="json_schema",
        plan_first="on",
    )
    tools = LocalToolExecutor(
        shipped_registry(timeout_seconds=10.0),
        downstream=Downstream(twin_url=TWIN, sensor_url=SENSORS, client=client),
        authorizer=load_authorizer(),
        retriever=FakeRetriever(),
        clock=pinned_clock,
    )
    # No model reply is scripted: every answer here is the service's, composed from the tools.
    model = ScriptedModel(tool_calling_mode="json_schema")
    yield build_agent(settings, llm=model, tools=tools)
    await client.aclose()


def calls(answer: Any) -> dict[str, dict[str, Any]]:
    return {t.name: t.arguments for t in answer.tool_calls if t.ok}


async def test_a_building_named_by_its_uuid(second_agent: Agent) -> None:
    answer = await second_agent.answer(f"Which rooms does building {HOSPITAL} have?", INES)
    assert calls(answer)["get_building"] == {"building_id": HOSPITAL}
    assert (answer.decision, answer.answered_by) == ("answered", "service")
    assert "Emergency Waiting Area" in answer.answer and "Chapel" in answer.answer


async def test_a_room_by_its_number(second_agent: Agent) -> None:
    answer = await second_agent.answer("What is the temperature in room 4711 right now?", INES)
    assert calls(answer)["get_latest_sensor_data"] == {
        "room_id": "4711",
        "sensor_type": "temperature",
    }
    assert answer.decision == "answered" and "°C" in answer.answer


async def test_a_sensor_type_the_tools_do_not_list_is_reported(second_agent: Agent) -> None:
    answer = await second_agent.answer(
        f"Which sensors are installed in room 4711 of building {HOSPITAL}?", INES
    )
    assert "list_sensors" in calls(answer)
    assert "sound level" in answer.answer  # sound_level: not in the tools' sensor_type enum


async def test_another_tenants_uuid_is_not_found(second_agent: Agent) -> None:
    answer = await second_agent.answer(f"Which rooms does building {LIBRARY} have?", INES)
    assert "Okafor" not in answer.answer and "Study Commons" not in answer.answer
    assert "could not find" in answer.answer
