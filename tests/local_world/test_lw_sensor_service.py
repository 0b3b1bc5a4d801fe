"""sensor-service simulator over real HTTP: registry, readings, history bounds, faults."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx
import pytest
from lw_helpers import ACME_STAFF, ADMIN, CUSTOMER, NORTHWIND_ADMIN, PINNED, Running, claims

from local_world._service import ApiError, Faults
from local_world.clock import FixedClock, format_instant, parse_instant
from local_world.sensor_service import create_sensor_app, parse_interval
from local_world.world import World

DEVICE_KEYS = {"_id", "buildingId", "roomId", "sensorId", "sensorType", "installedAt"}


async def test_building_registry(sensor: Running, http: httpx.AsyncClient, world: World) -> None:
    response = await http.get(
        f"{sensor.url}/sensors/buildings/bld-northwind-harbor", headers=NORTHWIND_ADMIN
    )
    assert response.status_code == 200
    devices = response.json()
    assert all(set(d) == DEVICE_KEYS for d in devices)
    assert {d["buildingId"] for d in devices} == {"bld-northwind-harbor"}
    assert {d["sensorId"] for d in devices} == {
        s.id for s in world.sensors_in_building("bld-northwind-harbor")
    }
    dock_a = [d for d in devices if d["roomId"] == "room-harbor-dock-a"]
    assert sorted(d["sensorType"] for d in dock_a) == sorted(
        ["occupancy", "co2", "temperature", "humidity", "door_counter"]
    )
    assert {"sensorId": "sen-harbor-dock-a-co2", "sensorType": "co2"}.items() <= next(
        d for d in dock_a if d["sensorType"] == "co2"
    ).items()


async def test_room_registry(sensor: Running, http: httpx.AsyncClient) -> None:
    base = f"{sensor.url}/sensors/buildings/bld-acme-labs/rooms"
    wet = (await http.get(f"{base}/room-acme-labs-wet-lab", headers=ACME_STAFF)).json()
    assert {d["sensorType"] for d in wet} == {"co2", "temperature", "humidity"}
    assert {d["roomId"] for d in wet} == {"room-acme-labs-wet-lab"}
    quiet = await http.get(f"{base}/room-acme-labs-quiet", headers=ACME_STAFF)
    assert quiet.status_code == 200 and quiet.json() == []
    # an unknown room, and a room of another (even visible) building, are 404s
    for room_id in ("room-nope", "room-acme-tower-lobby"):
        missing = await http.get(f"{base}/{room_id}", headers=ACME_STAFF)
        assert missing.status_code == 404
        assert missing.json() == {"error": {"code": "not_found", "message": "room not found"}}


@pytest.mark.parametrize(
    ("unknown", "forbidden"),
    [
        ("/sensors/buildings/bld-nope", "/sensors/buildings/bld-civic-library"),
        (
            "/sensors/buildings/bld-nope/rooms/room-library-reading",
            "/sensors/buildings/bld-civic-library/rooms/room-library-reading",
        ),
        ("/sensors/sen-nope/latest", "/sensors/sen-library-reading-co2/latest"),
        ("/sensors/sen-nope/history", "/sensors/sen-library-reading-co2/history"),
        (
            "/sensors/sen-nope/history?interval=bogus",
            "/sensors/sen-library-reading-co2/history?interval=bogus",
        ),
    ],
)
async def test_unknown_and_forbidden_look_identical(
    sensor: Running, http: httpx.AsyncClient, unknown: str, forbidden: str
) -> None:
    a = await http.get(sensor.url + unknown, headers=ACME_STAFF)
    b = await http.get(sensor.url + forbidden, headers=ACME_STAFF)
    assert a.status_code == b.status_code == 404
    assert a.content == b.content
    assert (await http.get(sensor.url + forbidden.split("?")[0], headers=CUSTOMER)).is_success


async def test_missing_claims_are_401(sensor: Running, http: httpx.AsyncClient) -> None:
    response = await http.get(f"{sensor.url}/sensors/sen-library-reading-co2/latest")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


async def test_latest_is_pinned_then_moves(
    sensor: Running, http: httpx.AsyncClient, clock: FixedClock, world: World
) -> None:
    url = f"{sensor.url}/sensors/sen-nwhq-open-office-co2/latest"
    first = (await http.get(url, headers=NORTHWIND_ADMIN)).json()
    assert first == (await http.get(url, headers=NORTHWIND_ADMIN)).json()
    device = world.sensor("sen-nwhq-open-office-co2")
    assert device is not None
    expected = world.reading_at(device, clock())
    assert expected is not None
    assert first == {
        "sensorId": "sen-nwhq-open-office-co2",
        "sensorType": "co2",
        "buildingId": "bld-northwind-hq",
        "roomId": "room-nwhq-open-office",
        "value": expected.value,
        "unit": "ppm",
        "timestamp": PINNED,
        "status": "ok",
    }
    clock.advance(seconds=59)  # same one-minute sample
    assert (await http.get(url, headers=NORTHWIND_ADMIN)).json() == first
    clock.advance(hours=6)
    later = (await http.get(url, headers=NORTHWIND_ADMIN)).json()
    assert later["timestamp"] == format_instant(parse_instant(PINNED) + timedelta(hours=6))
    assert later["value"] != first["value"]


async def test_offline_sensor_is_registered_but_reports_nothing(
    sensor: Running, http: httpx.AsyncClient
) -> None:
    registry = await http.get(
        f"{sensor.url}/sensors/buildings/bld-northwind-harbor/rooms/room-harbor-dock-b",
        headers=NORTHWIND_ADMIN,
    )
    assert "sen-harbor-dock-b-temperature" in {d["sensorId"] for d in registry.json()}
    latest = await http.get(
        f"{sensor.url}/sensors/sen-harbor-dock-b-temperature/latest", headers=NORTHWIND_ADMIN
    )
    assert latest.status_code == 200
    body = latest.json()
    assert (body["status"], body["value"], body["timestamp"]) == ("offline", None, None)
    history = await http.get(
        f"{sensor.url}/sensors/sen-harbor-dock-b-temperature/history", headers=NORTHWIND_ADMIN
    )
    assert history.json()["points"] == [] and history.json()["status"] == "offline"


async def test_history_matches_latest_and_is_aligned(
    sensor: Running, http: httpx.AsyncClient
) -> None:
    base = f"{sensor.url}/sensors/sen-acme-tower-cafeteria-occupancy"
    latest = (await http.get(f"{base}/latest", headers=ACME_STAFF)).json()
    params = {"from": "2025-03-04T08:07:00Z", "to": PINNED, "interval": "PT15M"}
    history = (await http.get(f"{base}/history", params=params, headers=ACME_STAFF)).json()
    assert history["intervalSeconds"] == 900
    assert history["unit"] == "people"
    stamps = [p["timestamp"] for p in history["points"]]
    assert stamps[0] == "2025-03-04T08:15:00Z"
    assert stamps[-1] == PINNED
    assert len(stamps) == 10
    assert history["points"][-1]["value"] == latest["value"]


async def test_history_defaults_and_clamps_to_now(sensor: Running, http: httpx.AsyncClient) -> None:
    base = f"{sensor.url}/sensors/sen-library-reading-humidity/history"
    default = (await http.get(base, headers=CUSTOMER)).json()
    assert (default["from"], default["to"]) == ("2025-03-03T10:30:00Z", PINNED)
    assert len(default["points"]) == 97  # 24 h at 15 minutes, both ends included
    future = (
        await http.get(
            base,
            params={"from": "2025-03-04T10:00:00Z", "to": "2025-03-05T10:00:00Z", "interval": "5m"},
            headers=CUSTOMER,
        )
    ).json()
    assert future["points"][-1]["timestamp"] == PINNED  # no readings from the future
    offset = await http.get(
        base,
        params={"from": "2025-03-04T11:00:00+01:00", "to": "2025-03-04T11:30:00+01:00"},
        headers=CUSTOMER,
    )
    assert [p["timestamp"] for p in offset.json()["points"]] == [
        "2025-03-04T10:00:00Z",
        "2025-03-04T10:15:00Z",
        "2025-03-04T10:30:00Z",
    ]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"from": "2025-02-20T00:00:00Z", "to": PINNED, "interval": "1d"}, "7 days"),
        ({"from": "2025-03-02T00:00:00Z", "to": PINNED, "interval": "1m"}, "2000"),
        ({"from": PINNED, "to": "2025-03-04T10:00:00Z"}, "after"),
        ({"interval": "soon"}, "duration"),
        ({"interval": "90s"}, "whole number of minutes"),
        ({"interval": "0m"}, "whole number of minutes"),
        ({"from": "yesterday"}, "ISO-8601"),
    ],
)
async def test_history_bounds_are_400s(
    sensor: Running, http: httpx.AsyncClient, params: dict[str, str], fragment: str
) -> None:
    response = await http.get(
        f"{sensor.url}/sensors/sen-library-reading-co2/history", params=params, headers=CUSTOMER
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert fragment in error["message"]


async def test_history_limits_are_inclusive(sensor: Running, http: httpx.AsyncClient) -> None:
    base = f"{sensor.url}/sensors/sen-library-reading-co2/history"
    start = parse_instant(PINNED) - timedelta(minutes=1999)
    response = await http.get(
        base,
        params={"from": format_instant(start), "to": PINNED, "interval": "1m"},
        headers=CUSTOMER,
    )
    assert response.status_code == 200
    assert len(response.json()["points"]) == 2000
    week = await http.get(
        base,
        params={"from": "2025-02-25T10:00:00Z", "to": "2025-03-04T10:00:00Z", "interval": "2h"},
        headers=CUSTOMER,
    )
    assert week.status_code == 200
    assert len(week.json()["points"]) == 7 * 12 + 1


def test_interval_formats() -> None:
    assert parse_interval("15m") == parse_interval("PT15M") == parse_interval("900") == 900
    assert parse_interval("1h") == parse_interval("PT1H") == 3600
    assert parse_interval("P1D") == parse_interval("1d") == 86400
    assert parse_interval("PT1H30M") == 5400
    for bad in ("PT", "P", "15x", "-5m", "PT30S", "8d"):
        with pytest.raises(ApiError):
            parse_interval(bad)


async def test_leak_mode_returns_foreign_devices(sensor: Running, http: httpx.AsyncClient) -> None:
    control = await http.post(
        f"{sensor.url}/_control", json={"leak_foreign_rooms": True}, headers=ADMIN
    )
    assert control.status_code == 200
    building = await http.get(f"{sensor.url}/sensors/buildings/bld-acme-labs", headers=ACME_STAFF)
    buildings = {d["buildingId"] for d in building.json()}
    assert "bld-acme-labs" in buildings and "bld-northwind-harbor" in buildings
    room = await http.get(
        f"{sensor.url}/sensors/buildings/bld-acme-labs/rooms/room-acme-labs-server",
        headers=ACME_STAFF,
    )
    rooms = {(d["buildingId"], d["roomId"]) for d in room.json()}
    assert ("bld-acme-labs", "room-acme-labs-server") in rooms
    assert ("bld-acme-labs", "room-acme-labs-wet-lab") in rooms  # another room, same building
    assert any(b != "bld-acme-labs" for b, _ in rooms)  # and other buildings
    # the leak never turns a forbidden building into a visible one
    forbidden = await http.get(
        f"{sensor.url}/sensors/buildings/bld-civic-library", headers=ACME_STAFF
    )
    assert forbidden.status_code == 404

    reset = await http.post(f"{sensor.url}/_control", json={"reset": True}, headers=ADMIN)
    assert reset.json()["faults"]["leak_foreign_rooms"] is False
    clean = await http.get(f"{sensor.url}/sensors/buildings/bld-acme-labs", headers=ACME_STAFF)
    assert {d["buildingId"] for d in clean.json()} == {"bld-acme-labs"}


async def test_control_endpoint_is_admin_only(sensor: Running, http: httpx.AsyncClient) -> None:
    url = f"{sensor.url}/_control"
    assert (await http.post(url, json={"garbage": True})).status_code == 401
    assert (
        await http.post(url, json={"garbage": True}, headers=NORTHWIND_ADMIN)
    ).status_code == 403
    unknown = await http.post(url, json={"explode": True}, headers=ADMIN)
    assert unknown.status_code == 400
    out_of_range = await http.post(url, json={"fail_rate": 2}, headers=ADMIN)
    assert out_of_range.status_code == 400
    assert sensor.control.faults == Faults()
    state = (await http.get(url)).json()
    assert state["service"] == "sensor-service"
    assert state["faults"]["garbage"] is False


async def test_control_is_refused_off_loopback(world: World) -> None:
    # The only test that is not over a socket: it needs a non-loopback peer address.
    app = create_sensor_app(world)
    transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://sensor") as client:
        assert (
            await client.post("/_control", json={"garbage": True}, headers=ADMIN)
        ).status_code == 403
        assert (await client.get("/_requests")).status_code == 403


async def test_faults_latency_failures_garbage_and_path_prefix(
    sensor: Running, http: httpx.AsyncClient
) -> None:
    latest = f"{sensor.url}/sensors/sen-library-reading-co2/latest"
    registry = f"{sensor.url}/sensors/buildings/bld-civic-library"
    await http.post(
        f"{sensor.url}/_control",
        json={"latency_ms": 400, "path_prefix": "/sensors/sen-"},
        headers=ADMIN,
    )
    started = time.monotonic()
    assert (await http.get(latest, headers=CUSTOMER)).status_code == 200
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    assert (await http.get(registry, headers=CUSTOMER)).status_code == 200
    assert time.monotonic() - started < 0.4

    sensor.control.set_faults(latency_ms=0, fail_rate=1.0)
    failed = await http.get(latest, headers=CUSTOMER)
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "internal"
    assert (await http.get(registry, headers=CUSTOMER)).status_code == 200

    sensor.control.set_faults(fail_rate=0.0, garbage=True, path_prefix=None)
    garbage = await http.get(registry, headers=CUSTOMER)
    assert garbage.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        garbage.json()


async def test_partial_failure_rate_is_seeded(world: World, http: httpx.AsyncClient) -> None:
    from local_world.servers import run_in_thread

    outcomes = []
    for _ in range(2):
        app = create_sensor_app(world, faults=Faults(fail_rate=0.5), seed=7)
        with run_in_thread(app) as url:
            codes = [
                (
                    await http.get(
                        f"{url}/sensors/sen-library-reading-co2/latest", headers=CUSTOMER
                    )
                ).status_code
                for _ in range(20)
            ]
        outcomes.append(codes)
    assert outcomes[0] == outcomes[1]
    assert 500 in outcomes[0] and 200 in outcomes[0]


async def test_no_sensor_request_can_be_asserted(
    twin: Running, sensor: Running, http: httpx.AsyncClient
) -> None:
    await http.get(f"{twin.url}/rooms/room-acme-tower-lobby", headers=ACME_STAFF)
    assert sensor.control.requests() == []
    assert (await http.get(f"{sensor.url}/_requests")).json() == {"requests": []}
    await http.get(
        f"{sensor.url}/sensors/buildings/bld-acme-tower", headers=claims("x", ("acme", "admin"))
    )
    assert sensor.control.paths() == ["/sensors/buildings/bld-acme-tower"]
    assert twin.control.paths() == ["/rooms/room-acme-tower-lobby"]
