"""Simulated twin-service: buildings, rooms and live room occupancy, over real HTTP.

Authorization works as in the real service: the caller's ``x-gateway-claims`` header decides
which domains they see (admin sees all). A missing or invalid header is a 401; an unknown
building or room and one the caller may not see give the *same* 404 body.

Routes (JSON, camelCase):

* ``GET /buildings`` -> ``[Building]`` (only visible ones)
* ``GET /buildings/{buildingId}`` -> ``Building``
* ``GET /buildings/{buildingId}/rooms`` -> ``[Room]``
* ``GET /rooms/{roomId}`` -> ``Room``
* ``GET /rooms/{roomId}/occupancy`` -> ``Occupancy``

``Building``: ``buildingId, name, domain, domainName, address, floors, roomCount, capacity``.
``Room``: ``roomId, buildingId, name, floor, capacity, type``.
``Occupancy``: ``roomId, buildingId, occupancy, capacity, utilisation, timestamp, sensorId``
(``occupancy``/``utilisation`` are ``null`` for a room without an occupancy sensor, or whose
sensor is offline).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from local_world._service import (
    FASTAPI_TELEMETRY_OFF,
    Faults,
    ServiceControl,
    caller,
    install,
    not_found,
)
from local_world.clock import Clock, format_instant, system_clock
from local_world.world import Building, Room, World, build_world


def building_json(world: World, building: Building) -> dict[str, Any]:
    rooms = world.rooms_in(building.id)
    domain = world.domain(building.domain)
    return {
        "buildingId": building.id,
        "name": building.name,
        "domain": building.domain,
        "domainName": domain.name if domain else building.domain,
        "address": building.address,
        "floors": building.floors,
        "roomCount": len(rooms),
        "capacity": sum(room.capacity for room in rooms),
    }


def room_json(room: Room) -> dict[str, Any]:
    return {
        "roomId": room.id,
        "buildingId": room.building_id,
        "name": room.name,
        "floor": room.floor,
        "capacity": room.capacity,
        "type": room.type,
    }


def create_twin_app(
    world: World | None = None,
    *,
    clock: Clock = system_clock,
    faults: Faults | None = None,
    seed: int = 0,
) -> FastAPI:
    """The twin-service simulator. ``faults`` sets the initial fault knobs (``fail_rate``,
    ``latency_ms``, ``garbage``, ``leak_foreign_rooms`` for room lists, and
    ``leak_foreign_buildings`` for ``GET /buildings``); ``seed`` fixes the failure dice."""
    world = world if world is not None else build_world()
    app = FastAPI(
        title="local twin-service", docs_url=None, redoc_url=None, telemetry=FASTAPI_TELEMETRY_OFF
    )
    control = ServiceControl("twin-service", faults, seed=seed, world=world.name)
    install(app, control)

    @app.get("/buildings")
    async def list_buildings(request: Request) -> list[dict[str, Any]]:
        claims = caller(request)
        if control.faults.leak_foreign_buildings:
            buildings = list(world.buildings)
        else:
            buildings = world.visible_buildings(claims)
        return [building_json(world, b) for b in buildings]

    @app.get("/buildings/{building_id}")
    async def get_building(building_id: str, request: Request) -> dict[str, Any]:
        building = world.visible_building(caller(request), building_id)
        if building is None:
            raise not_found("building")
        return building_json(world, building)

    @app.get("/buildings/{building_id}/rooms")
    async def list_rooms(building_id: str, request: Request) -> list[dict[str, Any]]:
        building = world.visible_building(caller(request), building_id)
        if building is None:
            raise not_found("building")
        rooms = world.rooms_in(building.id)
        if control.faults.leak_foreign_rooms:
            rooms += [r for r in world.rooms if r.building_id != building.id]
        return [room_json(r) for r in rooms]

    @app.get("/rooms/{room_id}")
    async def get_room(room_id: str, request: Request) -> dict[str, Any]:
        room = world.visible_room(caller(request), room_id)
        if room is None:
            raise not_found("room")
        return room_json(room)

    @app.get("/rooms/{room_id}/occupancy")
    async def get_occupancy(room_id: str, request: Request) -> dict[str, Any]:
        room = world.visible_room(caller(request), room_id)
        if room is None:
            raise not_found("room")
        now = clock()
        sensor = world.occupancy_sensor(room.id)
        reading = world.reading_at(sensor, now) if sensor is not None else None
        count = int(reading.value) if reading is not None else None
        return {
            "roomId": room.id,
            "buildingId": room.building_id,
            "occupancy": count,
            "capacity": room.capacity,
            "utilisation": round(count / room.capacity, 3) if count is not None else None,
            "timestamp": format_instant(reading.timestamp if reading else now),
            "sensorId": sensor.id if sensor is not None else None,
        }

    return app
