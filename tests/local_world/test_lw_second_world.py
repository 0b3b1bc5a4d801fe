"""The second world (``local_world/worlds/second.yaml``) served by the same simulators over
real HTTP: nothing shaped like the sample (other domains, UUID building ids, numeric room ids,
hardware-style sensor ids, other names), the same twin and sensor contracts, the same
authorization, and sensor types the assistant's tools do not list, served like any other."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import httpx
import pytest
from lw_helpers import PINNED, claims

from local_world.clock import FixedClock, parse_instant
from local_world.sensor_service import create_sensor_app
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import SENSOR_TYPES, World, build_world, load_world
from local_world.world_file import WORLDS_DIR

SECOND = WORLDS_DIR / "second.yaml"
# The sensor types the assistant's sensor tools list (their schemas name these five).
TOOLS_LIST = {"occupancy", "co2", "temperature", "humidity", "door_counter"}

HOSPITAL = "b1cb1816-7d85-457c-9f32-2a1422d00e17"  # St. Aurelia General Hospital
REHAB = "5bb7fb0f-d8d9-415b-8725-460b8ce504db"  # Linden Rehabilitation Centre
LIBRARY = "ce9c02e4-aafb-4062-97ff-bbaaeca05990"  # Okafor Science Library
LECTURES = "0583542f-4cd5-413d-8c6e-3438c63be5a9"  # Marsh Hall Lecture Centre
HOTEL = "e35fd989-b021-4ac8-8c31-76236de8809a"  # Solace Grand Marlow Bay
INN = "dde53f64-b9a5-4b5f-b3c1-8c1b55270a2c"  # Solace Airport Inn

INES = claims("ines", ("aurelia-health", "business_staff"))
RAVI = claims(
    "ravi", ("aurelia-health", "standard_customer"), ("tidewater.edu", "standard_customer")
)
MEI = claims("mei", ("Solace_Hotels", "standard_customer"))  # domain names fold case
OPS = claims("ops", ("crowdvision-ops", "admin"))


@pytest.fixture(scope="module")
def second() -> World:
    return load_world(SECOND)


@pytest.fixture(scope="module")
def urls(second: World) -> Iterator[tuple[str, str]]:
    clock = FixedClock(PINNED)
    with (
        run_in_thread(create_twin_app(second, clock=clock)) as twin,
        run_in_thread(create_sensor_app(second, clock=clock)) as sensor,
    ):
        yield twin, sensor


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


# --- the shape ------------------------------------------------------------------------------------


def test_nothing_is_shaped_like_the_sample(second: World) -> None:
    sample = build_world()
    assert {d.id for d in second.domains} == {"aurelia-health", "tidewater.edu", "solace_hotels"}
    assert not {d.id for d in second.domains} & {d.id for d in sample.domains}
    for building in second.buildings:
        assert str(uuid.UUID(building.id)) == building.id
    assert all(re.fullmatch(r"\d{4}", room.id) for room in second.rooms)
    assert second.room("0107") is not None  # a leading zero is kept: ids are strings
    assert all(re.fullmatch(r"[0-9A-F]{16}", sensor.id) for sensor in second.sensors)
    sample_ids = {x.id for x in (*sample.buildings, *sample.rooms, *sample.sensors)}
    sample_names = {x.name for x in (*sample.domains, *sample.buildings, *sample.rooms)}
    mine = [*second.buildings, *second.rooms, *second.sensors]
    assert not {x.id for x in mine} & sample_ids
    assert not {x.name for x in (*second.domains, *second.buildings, *second.rooms)} & sample_names
    prefixes = ("bld-", "room-", "sen-", "rm-", "flr-")
    assert not [x.id for x in mine if x.id.startswith(prefixes)]


def test_its_gaps_and_its_unlisted_sensor_types(second: World) -> None:
    types = {s.type for s in second.sensors}
    assert types - TOOLS_LIST == {"sound_level", "pm2_5"}
    assert set(SENSOR_TYPES) == TOOLS_LIST  # the built-in models are the tools' five
    assert second.sensors_in_room("4731") == []  # the Chapel: no sensors
    assert {s.type for s in second.sensors_in_room("4713")} == {"temperature", "humidity"}
    offline = {s.id: s.type for s in second.sensors if not s.online}
    assert offline == {"A84041000181C620": "occupancy", "70B3D57ED00F6EC1": "sound_level"}
    receptions = [r for r in second.rooms if r.name == "Reception"]
    assert {second.building(r.building_id).domain for r in receptions} == {  # type: ignore[union-attr]
        "aurelia-health",
        "solace_hotels",
    }


def test_its_readings_are_seeded_by_its_file_and_plausible(second: World) -> None:
    assert second.seed == 7
    again = load_world(SECOND)
    t0 = parse_instant(PINNED)
    assert [again.reading_at(s, t0) for s in again.sensors] == [
        second.reading_at(s, t0) for s in second.sensors
    ]
    bounds = {"sound_level": (25.0, 95.0), "pm2_5": (0.0, 60.0)}
    for sensor in second.sensors:
        if not sensor.online or sensor.type not in bounds:
            continue
        series = [r.value for r in second.history(sensor, t0 - timedelta(days=1), t0, 900)]
        low, high = bounds[sensor.type]
        assert len(set(series)) > 3 and all(low <= v <= high for v in series), sensor.id
    explicit = second.sensor("70B3D57ED003CAE5")
    assert explicit is not None and explicit.installed_at == parse_instant("2025-02-17T10:00:00Z")


# --- served over HTTP ---------------------------------------------------------------------------


async def test_each_caller_sees_their_domains(
    urls: tuple[str, str], http: httpx.AsyncClient
) -> None:
    twin, _ = urls

    async def visible(headers: dict[str, str]) -> set[str]:
        return {
            b["buildingId"] for b in (await http.get(f"{twin}/buildings", headers=headers)).json()
        }

    assert await visible(INES) == {HOSPITAL, REHAB}
    assert await visible(RAVI) == {HOSPITAL, REHAB, LIBRARY, LECTURES}
    assert await visible(MEI) == {HOTEL, INN}
    assert await visible(OPS) == {HOSPITAL, REHAB, LIBRARY, LECTURES, HOTEL, INN}
    # a UUID of another tenant and a UUID that exists nowhere get the same 404
    foreign = await http.get(f"{twin}/buildings/{HOTEL}", headers=INES)
    unknown = await http.get(f"{twin}/buildings/{uuid.UUID(int=1)}", headers=INES)
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json() == unknown.json()
    assert (await http.get(f"{twin}/rooms/2240", headers=INES)).json() == (
        await http.get(f"{twin}/rooms/9999", headers=INES)
    ).json()


async def test_twin_contract_with_uuid_and_numeric_ids(
    urls: tuple[str, str], http: httpx.AsyncClient
) -> None:
    twin, _ = urls
    building = (await http.get(f"{twin}/buildings/{LIBRARY}", headers=RAVI)).json()
    assert building == {
        "buildingId": LIBRARY,
        "name": "Okafor Science Library",
        "domain": "tidewater.edu",
        "domainName": "Tidewater University",
        "address": "1 College Walk, Tidewater",
        "floors": 4,
        "roomCount": 3,
        "capacity": 192,
    }
    rooms = (await http.get(f"{twin}/buildings/{LIBRARY}/rooms", headers=RAVI)).json()
    assert [r["roomId"] for r in rooms] == ["0107", "0212", "0301"]
    commons = (await http.get(f"{twin}/rooms/0107", headers=RAVI)).json()
    assert commons["name"] == "Study Commons" and commons["buildingId"] == LIBRARY
    occupancy = (await http.get(f"{twin}/rooms/0107/occupancy", headers=RAVI)).json()
    assert occupancy["roomId"] == "0107" and occupancy["capacity"] == 180
    assert 0 <= occupancy["occupancy"] <= 180 and occupancy["sensorId"] == "70B3D57ED00D184D"
    assert occupancy["timestamp"] == PINNED
    no_sensor = (await http.get(f"{twin}/rooms/4713/occupancy", headers=INES)).json()
    assert no_sensor["occupancy"] is None and no_sensor["sensorId"] is None
    offline = (await http.get(f"{twin}/rooms/5103/occupancy", headers=INES)).json()
    assert offline["occupancy"] is None and offline["sensorId"] == "A84041000181C620"


async def test_sensor_contract_serves_the_unlisted_types(
    urls: tuple[str, str], http: httpx.AsyncClient
) -> None:
    _, sensor = urls
    devices = (await http.get(f"{sensor}/sensors/buildings/{HOSPITAL}", headers=INES)).json()
    by_type = {(d["roomId"], d["sensorType"]): d["sensorId"] for d in devices}
    assert by_type[("4711", "sound_level")] == "70B3D57ED008A1E6"
    assert by_type[("4720", "pm2_5")] == "70B3D57ED004669D"
    assert set(devices[0]) == {
        "_id",
        "buildingId",
        "roomId",
        "sensorId",
        "sensorType",
        "installedAt",
    }
    in_room = await http.get(f"{sensor}/sensors/buildings/{HOSPITAL}/rooms/4731", headers=INES)
    assert in_room.status_code == 200 and in_room.json() == []

    sound = (await http.get(f"{sensor}/sensors/70B3D57ED008A1E6/latest", headers=INES)).json()
    assert sound["sensorType"] == "sound_level" and sound["unit"] == "dBA"
    assert sound["status"] == "ok" and isinstance(sound["value"], float)
    assert sound["roomId"] == "4711" and sound["buildingId"] == HOSPITAL
    dust = (await http.get(f"{sensor}/sensors/70B3D57ED004669D/latest", headers=INES)).json()
    assert dust["unit"] == "µg/m³" and dust["value"] >= 0
    history = await http.get(
        f"{sensor}/sensors/70B3D57ED008A1E6/history",
        params={"from": "2025-03-04T08:30:00Z", "interval": "1h"},
        headers=INES,
    )
    body = history.json()
    assert history.status_code == 200 and body["unit"] == "dBA"
    assert [p["timestamp"] for p in body["points"]] == [
        "2025-03-04T09:00:00Z",
        "2025-03-04T10:00:00Z",
    ]
    quiet = (await http.get(f"{sensor}/sensors/70B3D57ED00F6EC1/latest", headers=RAVI)).json()
    assert quiet["status"] == "offline" and quiet["value"] is None
    assert quiet["sensorType"] == "sound_level"
    # another tenant's unlisted sensor is as unknown as one that does not exist
    hidden = await http.get(f"{sensor}/sensors/70B3D57ED0021672/latest", headers=INES)
    assert hidden.status_code == 404
    assert (
        hidden.json()
        == (await http.get(f"{sensor}/sensors/FFFFFFFFFFFFFFFF/latest", headers=INES)).json()
    )
