"""twin-service simulator over real HTTP: authorization, no existence oracle, live data."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from lw_helpers import ACME_STAFF, ADMIN, CUSTOMER, NORTHWIND_ADMIN, PINNED, Running, claims

from local_world.claims import HEADER
from local_world.clock import FixedClock
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import World, build_world

ALL_BUILDINGS = {
    "bld-northwind-harbor",
    "bld-northwind-hq",
    "bld-acme-tower",
    "bld-acme-labs",
    "bld-civic-library",
    "bld-civic-townhall",
}


async def test_missing_or_invalid_claims_are_401(twin: Running, http: httpx.AsyncClient) -> None:
    for headers in ({}, {HEADER: "%%%"}, {HEADER: base64.b64encode(b'{"sub": 1}').decode()}):
        response = await http.get(f"{twin.url}/buildings", headers=headers)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == "unauthenticated"


async def test_members_see_only_their_domains(twin: Running, http: httpx.AsyncClient) -> None:
    response = await http.get(f"{twin.url}/buildings", headers=ACME_STAFF)
    assert response.status_code == 200
    assert {b["buildingId"] for b in response.json()} == {"bld-acme-tower", "bld-acme-labs"}

    two_domains = claims("m", ("acme", "standard_customer"), ("civic", "business_staff"))
    response = await http.get(f"{twin.url}/buildings", headers=two_domains)
    assert {b["domain"] for b in response.json()} == {"acme", "civic"}

    nobody = await http.get(f"{twin.url}/buildings", headers=claims("n"))
    assert nobody.status_code == 200 and nobody.json() == []


async def test_admin_sees_everything(twin: Running, http: httpx.AsyncClient) -> None:
    response = await http.get(f"{twin.url}/buildings", headers=ADMIN)
    assert {b["buildingId"] for b in response.json()} == ALL_BUILDINGS
    # ...including buildings of domains the admin is not a member of:
    detail = await http.get(f"{twin.url}/buildings/bld-civic-library", headers=ADMIN)
    assert detail.status_code == 200


async def test_building_json_is_camel_case(twin: Running, http: httpx.AsyncClient) -> None:
    response = await http.get(f"{twin.url}/buildings/bld-northwind-harbor", headers=NORTHWIND_ADMIN)
    assert response.json() == {
        "buildingId": "bld-northwind-harbor",
        "name": "Harbor Warehouse",
        "domain": "northwind",
        "domainName": "Northwind Logistics",
        "address": "12 Quay Road, Port Ellis",
        "floors": 2,
        "roomCount": 4,
        "capacity": 108,
    }
    rooms = await http.get(
        f"{twin.url}/buildings/bld-northwind-harbor/rooms", headers=NORTHWIND_ADMIN
    )
    assert rooms.json()[0] == {
        "roomId": "room-harbor-dock-a",
        "buildingId": "bld-northwind-harbor",
        "name": "Loading Dock A",
        "floor": 0,
        "capacity": 40,
        "type": "loading_dock",
    }
    assert {r["buildingId"] for r in rooms.json()} == {"bld-northwind-harbor"}
    room = await http.get(f"{twin.url}/rooms/room-harbor-cold-store", headers=NORTHWIND_ADMIN)
    assert room.json()["name"] == "Cold Store"


@pytest.mark.parametrize(
    ("unknown", "forbidden"),
    [
        ("/buildings/bld-does-not-exist", "/buildings/bld-acme-tower"),
        ("/buildings/bld-does-not-exist/rooms", "/buildings/bld-acme-labs/rooms"),
        ("/rooms/room-does-not-exist", "/rooms/room-acme-tower-lobby"),
        ("/rooms/room-does-not-exist/occupancy", "/rooms/room-acme-tower-cafeteria/occupancy"),
    ],
)
async def test_unknown_and_forbidden_look_identical(
    twin: Running, http: httpx.AsyncClient, unknown: str, forbidden: str
) -> None:
    a = await http.get(twin.url + unknown, headers=NORTHWIND_ADMIN)
    b = await http.get(twin.url + forbidden, headers=NORTHWIND_ADMIN)
    assert a.status_code == b.status_code == 404
    assert a.content == b.content
    assert a.headers["content-type"] == b.headers["content-type"] == "application/json"
    assert a.json()["error"]["code"] == "not_found"
    # the forbidden one does exist, for someone allowed to see it:
    assert (await http.get(twin.url + forbidden, headers=ACME_STAFF)).status_code == 200


async def test_occupancy_is_deterministic_under_a_pinned_clock(
    twin: Running, http: httpx.AsyncClient, clock: FixedClock, world: World
) -> None:
    url = f"{twin.url}/rooms/room-library-reading/occupancy"
    first = (await http.get(url, headers=CUSTOMER)).json()
    second = (await http.get(url, headers=CUSTOMER)).json()
    assert first == second
    room = world.room("room-library-reading")
    assert room is not None
    sensor = world.occupancy_sensor(room.id)
    assert sensor is not None
    reading = world.reading_at(sensor, clock())
    assert reading is not None
    assert first == {
        "roomId": "room-library-reading",
        "buildingId": "bld-civic-library",
        "occupancy": reading.value,
        "capacity": 90,
        "utilisation": round(int(reading.value) / 90, 3),
        "timestamp": PINNED,
        "sensorId": "sen-library-reading-occupancy",
    }
    # a fresh world with the same seed serves the same numbers
    assert build_world(world.seed).reading_at(sensor, clock()) == reading


async def test_occupancy_changes_over_time(
    twin: Running, http: httpx.AsyncClient, clock: FixedClock, world: World
) -> None:
    rooms = [r.id for r in world.rooms if world.occupancy_sensor(r.id) is not None]

    async def snapshot() -> list[int]:
        values = []
        for room_id in rooms:
            body = (await http.get(f"{twin.url}/rooms/{room_id}/occupancy", headers=ADMIN)).json()
            values.append(body["occupancy"])
        return values

    before = await snapshot()
    clock.advance(hours=3, minutes=17)
    after = await snapshot()
    assert before != after
    assert sum(1 for a, b in zip(before, after, strict=True) if a != b) >= len(rooms) // 2


async def test_room_without_occupancy_sensor_reports_null(
    twin: Running, http: httpx.AsyncClient
) -> None:
    for room_id in ("room-acme-labs-quiet", "room-acme-labs-wet-lab"):
        body = (await http.get(f"{twin.url}/rooms/{room_id}/occupancy", headers=ACME_STAFF)).json()
        assert body["occupancy"] is None and body["utilisation"] is None
        assert body["sensorId"] is None
        assert body["capacity"] > 0


async def test_a_different_seed_serves_different_numbers(
    http: httpx.AsyncClient, clock: FixedClock
) -> None:
    url_path = "/rooms/room-acme-tower-cafeteria/occupancy"
    values = []
    for seed in (1, 2, 3):
        with run_in_thread(create_twin_app(build_world(seed), clock=clock)) as url:
            values.append((await http.get(url + url_path, headers=ADMIN)).json()["occupancy"])
    assert len(set(values)) > 1


async def test_request_log_records_and_redacts(twin: Running, http: httpx.AsyncClient) -> None:
    headers = {**ACME_STAFF, "authorization": "Bearer s3cret", "cookie": "session=s3cret"}
    await http.get(f"{twin.url}/buildings/bld-acme-tower?x=1", headers=headers)
    log = (await http.get(f"{twin.url}/_requests")).json()["requests"]
    assert len(log) == 1
    entry = log[0]
    assert entry["method"] == "GET"
    assert entry["path"] == "/buildings/bld-acme-tower"
    assert entry["query"] == "x=1"
    assert entry["status"] == 200
    assert entry["sub"] == "alice"
    assert entry["headers"]["authorization"] == "[redacted]"
    assert entry["headers"]["cookie"] == "[redacted]"
    assert entry["headers"][HEADER] == ACME_STAFF[HEADER]
    assert "s3cret" not in json.dumps(log)

    assert (await http.delete(f"{twin.url}/_requests")).status_code == 204
    assert (await http.get(f"{twin.url}/_requests")).json() == {"requests": []}
    assert twin.control.requests() == []


async def test_leak_foreign_buildings_and_rooms(twin: Running, http: httpx.AsyncClient) -> None:
    response = await http.post(
        f"{twin.url}/_control",
        json={"leak_foreign_buildings": True, "leak_foreign_rooms": True},
        headers=ADMIN,
    )
    assert response.status_code == 200
    assert response.json()["faults"]["leak_foreign_buildings"] is True
    buildings = (await http.get(f"{twin.url}/buildings", headers=ACME_STAFF)).json()
    assert {b["buildingId"] for b in buildings} == ALL_BUILDINGS
    rooms = (await http.get(f"{twin.url}/buildings/bld-acme-labs/rooms", headers=ACME_STAFF)).json()
    assert {r["buildingId"] for r in rooms} == ALL_BUILDINGS
    # detail endpoints still enforce authorization
    forbidden = await http.get(f"{twin.url}/buildings/bld-civic-library", headers=ACME_STAFF)
    assert forbidden.status_code == 404


async def test_injected_failures(twin: Running, http: httpx.AsyncClient) -> None:
    twin.control.set_faults(fail_rate=1.0)
    response = await http.get(f"{twin.url}/buildings", headers=ADMIN)
    assert response.status_code == 500
    assert response.json() == {"error": {"code": "internal", "message": "injected failure"}}
    twin.control.set_faults(fail_rate=0.0, garbage=True)
    garbage = await http.get(f"{twin.url}/buildings", headers=ADMIN)
    assert garbage.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        garbage.json()
    statuses = [entry.status for entry in twin.control.requests()]
    assert statuses == [500, 200]
