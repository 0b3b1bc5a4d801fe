"""Simulated sensor-service: the device registry and sensor readings, over real HTTP.

Authorized exactly like the twin simulator (``x-gateway-claims``; 401 without it; one 404 for
unknown and forbidden). Routes:

* ``GET /sensors/buildings/{buildingId}`` -> ``[Device]``
* ``GET /sensors/buildings/{buildingId}/rooms/{roomId}`` -> ``[Device]`` (``[]`` for a room
  without sensors)
* ``GET /sensors/{sensorId}/latest`` -> ``Latest``
* ``GET /sensors/{sensorId}/history?from=&to=&interval=`` -> ``History``

``Device`` is the Mongo registry record: ``_id, buildingId, roomId, sensorId, sensorType,
installedAt``. ``Latest``: ``sensorId, sensorType, buildingId, roomId, value, unit, timestamp,
status`` (``status`` is ``ok`` or ``offline``; an offline sensor has ``value`` and
``timestamp`` ``null``). ``History``: ``sensorId, sensorType, buildingId, roomId, unit, from,
to, intervalSeconds, points: [{timestamp, value}]``.

History parameters: ``from``/``to`` ISO-8601 instants (``Z`` or an offset; naive means UTC;
defaults ``to`` = now, ``from`` = ``to`` - 24 h), ``interval`` as ``15m``/``1h``/``1d``/``90s``,
plain seconds, or an ISO-8601 duration (``PT15M``); default 15 minutes; a positive multiple
of one minute. Points sit at epoch-aligned instants in ``[from, min(to, now)]``. A window over
7 days or over 2000 points is a 400.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from fastapi import FastAPI, Request

from local_world._service import (
    FASTAPI_TELEMETRY_OFF,
    ApiError,
    Faults,
    ServiceControl,
    caller,
    install,
    not_found,
)
from local_world.clock import Clock, format_instant, parse_instant, system_clock
from local_world.world import (
    SAMPLE_SECONDS,
    Sensor,
    World,
    build_world,
    count_aligned,
)

MAX_WINDOW = timedelta(days=7)
MAX_POINTS = 2000
DEFAULT_INTERVAL_SECONDS = 900
DEFAULT_WINDOW = timedelta(hours=24)

_SHORT = re.compile(r"^(\d+)\s*([smhd]?)$")
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


def parse_interval(text: str) -> int:
    """Seconds in ``15m``, ``1h``, ``900``, ``PT15M`` ...; a positive multiple of 60."""
    value = text.strip()
    seconds: int | None = None
    short = _SHORT.match(value.lower())
    if short:
        seconds = int(short.group(1)) * _UNIT_SECONDS[short.group(2)]
    else:
        iso = _ISO.match(value.upper())
        if iso and any(iso.groups()) and not value.upper().endswith("T"):
            days, hours, minutes, secs = (int(g) if g else 0 for g in iso.groups())
            seconds = days * 86400 + hours * 3600 + minutes * 60 + secs
    if seconds is None:
        raise bad_request(f"interval {text!r} is not a duration like 15m, 1h or PT15M")
    if seconds <= 0 or seconds % SAMPLE_SECONDS:
        raise bad_request("interval must be a positive whole number of minutes")
    if seconds > int(MAX_WINDOW.total_seconds()):
        raise bad_request("interval must not exceed 7 days")
    return seconds


def _instant(name: str, text: str) -> datetime:
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise bad_request(f"'{name}' must be an ISO-8601 timestamp, got {text!r}") from exc


def device_json(sensor: Sensor) -> dict[str, Any]:
    return {
        "_id": sensor.record_id,
        "buildingId": sensor.building_id,
        "roomId": sensor.room_id,
        "sensorId": sensor.id,
        "sensorType": sensor.type,
        "installedAt": format_instant(sensor.installed_at),
    }


def create_sensor_app(
    world: World | None = None,
    *,
    clock: Clock = system_clock,
    faults: Faults | None = None,
    seed: int = 0,
) -> FastAPI:
    """The sensor-service simulator. ``faults`` sets the initial knobs (``fail_rate``,
    ``latency_ms``, ``garbage``, ``leak_foreign_rooms``: registry answers also carry devices
    of other rooms and of other buildings); ``seed`` fixes the failure dice."""
    world = world if world is not None else build_world()
    app = FastAPI(
        title="local sensor-service", docs_url=None, redoc_url=None, telemetry=FASTAPI_TELEMETRY_OFF
    )
    control = ServiceControl("sensor-service", faults, seed=seed, world=world.name)
    install(app, control)

    def leaked(exclude_building: str | None, exclude_room: str | None) -> list[Sensor]:
        if not control.faults.leak_foreign_rooms:
            return []
        return [
            s
            for s in world.sensors
            if s.building_id != exclude_building
            or (exclude_room is not None and s.room_id != exclude_room)
        ]

    @app.get("/sensors/buildings/{building_id}")
    async def building_devices(building_id: str, request: Request) -> list[dict[str, Any]]:
        building = world.visible_building(caller(request), building_id)
        if building is None:
            raise not_found("building")
        devices = world.sensors_in_building(building.id) + leaked(building.id, None)
        return [device_json(s) for s in devices]

    @app.get("/sensors/buildings/{building_id}/rooms/{room_id}")
    async def room_devices(
        building_id: str, room_id: str, request: Request
    ) -> list[dict[str, Any]]:
        claims = caller(request)
        building = world.visible_building(claims, building_id)
        if building is None:
            raise not_found("building")
        room = world.room(room_id)
        if room is None or room.building_id != building.id:
            raise not_found("room")
        devices = world.sensors_in_room(room.id) + leaked(building.id, room.id)
        return [device_json(s) for s in devices]

    @app.get("/sensors/{sensor_id}/latest")
    async def latest(sensor_id: str, request: Request) -> dict[str, Any]:
        sensor = world.visible_sensor(caller(request), sensor_id)
        if sensor is None:
            raise not_found("sensor")
        reading = world.reading_at(sensor, clock())
        return {
            "sensorId": sensor.id,
            "sensorType": sensor.type,
            "buildingId": sensor.building_id,
            "roomId": sensor.room_id,
            "value": reading.value if reading else None,
            "unit": sensor.unit,
            "timestamp": format_instant(reading.timestamp) if reading else None,
            "status": "ok" if reading else "offline",
        }

    @app.get("/sensors/{sensor_id}/history")
    async def history(sensor_id: str, request: Request) -> dict[str, Any]:
        sensor = world.visible_sensor(caller(request), sensor_id)
        if sensor is None:
            raise not_found("sensor")
        params = request.query_params
        now = clock()
        end = _instant("to", params["to"]) if params.get("to") else now
        start = _instant("from", params["from"]) if params.get("from") else end - DEFAULT_WINDOW
        interval = (
            parse_interval(params["interval"])
            if params.get("interval")
            else DEFAULT_INTERVAL_SECONDS
        )
        if start > end:
            raise bad_request("'from' must not be after 'to'")
        if end - start > MAX_WINDOW:
            raise bad_request("the window from 'from' to 'to' must not exceed 7 days")
        points = count_aligned(start, end, interval)
        if points > MAX_POINTS:
            raise bad_request(
                f"the request spans {points} points; at most {MAX_POINTS} (use a longer interval)"
            )
        readings = world.history(sensor, start, min(end, now), interval) if start <= now else []
        return {
            "sensorId": sensor.id,
            "sensorType": sensor.type,
            "buildingId": sensor.building_id,
            "roomId": sensor.room_id,
            "unit": sensor.unit,
            "from": format_instant(start),
            "to": format_instant(end),
            "intervalSeconds": interval,
            "status": "ok" if sensor.online else "offline",
            "points": [
                {"timestamp": format_instant(r.timestamp), "value": r.value} for r in readings
            ],
        }

    return app
