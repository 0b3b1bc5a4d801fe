"""Sensor-service tools: the device inventory (``list_sensors``), latest readings and history.

Each starts from twin-service, as the asking user, to authorize the building (Cedar on its
domain) and to learn which rooms belong to it; the sensor-service answer is then filtered to
those rooms, because downstream data is untrusted.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic.json_schema import SkipJsonSchema

from agent.tools.base import Tool, ToolContext, ToolError, ToolExample
from agent.tools.downstream import NotFoundError, path
from agent.tools.twin import (
    BUILDING_NOT_FOUND,
    ROOM_NOT_FOUND,
    Args,
    BuildingId,
    RoomId,
    _num,
    _str,
    accessible_building,
    accessible_room,
    building_rooms,
    items,
)

SensorType = Literal["occupancy", "co2", "temperature", "humidity", "door_counter"]
MAX_SENSORS = 200
MAX_LATEST = 20
MAX_SERIES = 3
MAX_POINTS = 24
MAX_RAW_POINTS = 200
# Intervals the sensor-service documents (1m, 5m, 15m, 1h, 1d), in seconds.
INTERVALS = (60, 300, 900, 3600, 86400)


def _interval_text(seconds: int) -> str:
    if seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds // 60}m"


def _instant(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- what the model reads: the tools' result models (fields in the order the model sees them;
# a field with a default is shown only when the tool sets it, see ``Tool``) ------------------


class SensorEntry(BaseModel):
    sensor_id: str | None
    sensor_type: str | None
    room_id: str | None
    room_name: str | None


class ListSensorsResult(BaseModel):
    building_id: str
    building_name: str | None
    sensors: list[SensorEntry]
    count: int  # all the devices (``sensors`` holds at most MAX_SENSORS)
    room_id: str | None = None  # set when the inventory is of one room
    room_name: str | None = None  # set (null or not) with room_id
    truncated: bool | None = None
    note: str | None = None  # when there are no sensors


class SensorReading(BaseModel):
    """A sensor's latest reading: ``value``, ``unit`` and ``timestamp`` are set when the
    sensor-service answered for this sensor; otherwise ``status`` says why there is none."""

    sensor_id: str
    sensor_type: str
    value: bool | int | float | dict[str, JsonValue] | None = None
    unit: str | None = None
    timestamp: str | None = None
    status: str
    error: str | None = None
    note: str | None = None  # what a status other than ok means


class GetLatestSensorDataResult(BaseModel):
    room_id: str
    room_name: str | None
    readings: list[SensorReading]
    note: str | None = None  # when no sensor (of the type) is installed


class HistoryBucket(BaseModel):
    t: str
    avg: float
    min: float | None = None  # set when the bucket holds more than one point
    max: float | None = None


class HistorySummary(BaseModel):
    count: int
    mean: float
    min: float
    min_at: str
    max: float
    max_at: str
    first: float
    last: float
    last_at: str


class SensorSeries(BaseModel):
    """One sensor's history: ``unit`` and ``points`` (and ``summary`` when there are any), or
    ``note`` or ``error`` saying why there are none."""

    sensor_id: str
    unit: str | None = None
    points: list[HistoryBucket] | None = None
    summary: HistorySummary | None = None
    note: str | None = None
    error: str | None = None


class GetSensorHistoryResult(BaseModel):
    model_config = ConfigDict(validate_by_name=True)  # from_= in code, "from" in JSON

    room_id: str
    room_name: str | None
    sensor_type: str
    from_: str = Field(validation_alias="from", serialization_alias="from")
    to: str
    series: list[SensorSeries]
    note: str | None = None  # when no sensor of the type is installed


async def registry_devices(
    ctx: ToolContext,
    building_id: str,
    room_ids: set[str],
    room_id: str | None = None,
) -> list[Mapping[str, Any]]:
    """Registry records of an authorized building (or one of its rooms), keeping only devices
    of ``room_ids`` (the building's rooms, per twin-service)."""
    segments = ["sensors", "buildings", building_id]
    if room_id is not None:
        segments += ["rooms", room_id]
    try:
        data = await ctx.downstream.sensor(path(*segments), ctx.user)
    except NotFoundError:
        raise ToolError(ROOM_NOT_FOUND if room_id else BUILDING_NOT_FOUND) from None
    wanted = {room_id} if room_id is not None else room_ids
    return [
        device
        for device in items(data)
        if _str(device, "sensorId")
        and _str(device, "sensorType")
        and _str(device, "buildingId") == building_id
        and _str(device, "roomId") in wanted
    ]


class ListSensorsArgs(Args):
    building_id: BuildingId
    room_id: RoomId | SkipJsonSchema[None] = Field(
        default=None, description="Optional: only this room (a room of that building)."
    )


class ListSensors(Tool[ListSensorsArgs, ListSensorsResult]):
    name = "list_sensors"
    answers = ("inventory",)
    description = (
        "The device inventory: which sensors (sensor_id, sensor_type) are installed in a "
        "building or one of its rooms. Tells 'no sensor installed' apart from 'no reading'. "
        "Returns no measurements: use get_latest_sensor_data or get_sensor_history for those."
    )
    guidance = (
        "Which sensors exist (is something installed at all?): list_sensors. "
        "Measurements: get_latest_sensor_data (now) or get_sensor_history (over time)."
    )
    examples = (
        ToolExample(
            "Does building bld-123 have humidity sensors?",
            "what is installed",
            {"building_id": "bld-123"},
        ),
    )
    prompt_order = 50

    async def run(self, args: ListSensorsArgs, ctx: ToolContext) -> ListSensorsResult:
        building = await accessible_building(ctx, args.building_id)
        rooms = {str(r["roomId"]): r for r in await building_rooms(ctx, args.building_id)}
        if args.room_id is not None and args.room_id not in rooms:
            raise ToolError(ROOM_NOT_FOUND)
        devices = await registry_devices(ctx, args.building_id, set(rooms), args.room_id)
        sensors = [
            SensorEntry(
                sensor_id=_str(d, "sensorId"),
                sensor_type=_str(d, "sensorType"),
                room_id=_str(d, "roomId"),
                room_name=_str(rooms[str(d["roomId"])], "name"),
            )
            for d in devices[:MAX_SENSORS]
        ]
        result = ListSensorsResult(
            building_id=args.building_id,
            building_name=_str(building, "name"),
            sensors=sensors,
            count=len(devices),
        )
        if args.room_id is not None:
            result.room_id = args.room_id
            result.room_name = _str(rooms[args.room_id], "name")
        if len(devices) > MAX_SENSORS:
            result.truncated = True
        if not devices:
            where = "this room" if args.room_id is not None else "this building"
            result.note = f"No sensors are installed in {where}."
        return result


async def room_sensors(
    ctx: ToolContext, room_id: str, sensor_type: str | None
) -> tuple[Mapping[str, Any], list[Mapping[str, Any]]]:
    """``(room, devices)``: an authorized room and its registered sensors (of one type)."""
    room, building = await accessible_room(ctx, room_id)
    building_id = str(building["buildingId"])
    devices = await registry_devices(ctx, building_id, {room_id}, room_id)
    if sensor_type is not None:
        devices = [d for d in devices if d["sensorType"] == sensor_type]
    return room, devices


def _no_sensor_note(sensor_type: str | None) -> str:
    kind = f"{sensor_type} sensor" if sensor_type else "sensor"
    return f"No {kind} is installed in this room (not a missing reading)."


class GetLatestSensorDataArgs(Args):
    room_id: RoomId
    sensor_type: SensorType | SkipJsonSchema[None] = Field(
        default=None, description="Optional: only sensors of this type."
    )


# What a status other than ok means, in words: a small model reads a bare "offline" next to
# a sensor as "the sensor is reporting" (the 1.5B on 2026-12-02).
_STATUS_NOTES = {
    "offline": "the sensor is offline: it is not reporting, there is no current reading",
    "stale": "the last reading is old: it is not a current value",
    "no_reading": "the sensor has not reported any reading yet",
    "unavailable": "the reading could not be fetched right now",
}


class GetLatestSensorData(Tool[GetLatestSensorDataArgs, GetLatestSensorDataResult]):
    name = "get_latest_sensor_data"
    answers = ("reading",)
    description = (
        "The most recent reading of each sensor in a room (value, unit, time, status), "
        "optionally of one sensor type (occupancy, co2, temperature, humidity, door_counter)."
    )
    examples = (
        ToolExample(
            "What is the temperature in room rm-123-a?",
            "a current reading",
            {"room_id": "rm-123-a", "sensor_type": "temperature"},
        ),
    )
    prompt_order = 60

    async def run(
        self, args: GetLatestSensorDataArgs, ctx: ToolContext
    ) -> GetLatestSensorDataResult:
        room, devices = await room_sensors(ctx, args.room_id, args.sensor_type)
        room_name = _str(room, "name")
        if not devices:
            return GetLatestSensorDataResult(
                room_id=args.room_id,
                room_name=room_name,
                readings=[],
                note=_no_sensor_note(args.sensor_type),
            )
        devices = devices[:MAX_LATEST]
        fetched = await asyncio.gather(
            *(
                ctx.downstream.sensor(path("sensors", str(d["sensorId"]), "latest"), ctx.user)
                for d in devices
            ),
            return_exceptions=True,
        )
        readings: list[SensorReading] = []
        for device, data in zip(devices, fetched, strict=True):
            sensor_id = str(device["sensorId"])
            sensor_type = str(device["sensorType"])
            if isinstance(data, NotFoundError):
                entry = SensorReading(
                    sensor_id=sensor_id, sensor_type=sensor_type, status="no_reading"
                )
            elif isinstance(data, ToolError):
                entry = SensorReading(
                    sensor_id=sensor_id,
                    sensor_type=sensor_type,
                    status="unavailable",
                    error=str(data),
                )
            elif isinstance(data, BaseException):
                raise data
            elif (
                isinstance(data, Mapping)
                and _str(data, "sensorId") == sensor_id
                and _str(data, "roomId") == args.room_id
            ):
                value = data.get("value")
                entry = SensorReading(
                    sensor_id=sensor_id,
                    sensor_type=sensor_type,
                    value=value if isinstance(value, int | float | dict) else None,
                    unit=_str(data, "unit"),
                    timestamp=_str(data, "timestamp"),
                    status=_str(data, "status") or ("stale" if data.get("stale") is True else "ok"),
                )
            else:
                entry = SensorReading(
                    sensor_id=sensor_id, sensor_type=sensor_type, status="unavailable"
                )
            note = _STATUS_NOTES.get(entry.status)
            if note is not None:
                entry.note = note
            readings.append(entry)
        return GetLatestSensorDataResult(
            room_id=args.room_id, room_name=room_name, readings=readings
        )


class GetSensorHistoryArgs(Args):
    room_id: RoomId
    sensor_type: SensorType
    hours: int = Field(default=24, ge=1, le=168, description="Window ending now, in hours.")


def _points(data: Mapping[str, Any]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    raw = data.get("points")
    for point in raw if isinstance(raw, list) else []:
        if not isinstance(point, Mapping):
            continue
        when = _str(point, "timestamp") or _str(point, "t")
        value = _num(point, "value")
        if value is None:
            value = _num(point, "avg")
        if when is not None and value is not None and math.isfinite(value):
            out.append((when, float(value)))
    return sorted(out)


def downsample(
    points: list[tuple[str, float]], max_points: int = MAX_POINTS
) -> list[HistoryBucket]:
    """At most ``max_points`` buckets of consecutive points: start time, mean, min, max."""
    if not points:
        return []
    size = math.ceil(len(points) / max_points)
    buckets: list[HistoryBucket] = []
    for start in range(0, len(points), size):
        chunk = points[start : start + size]
        values = [v for _, v in chunk]
        bucket = HistoryBucket(t=chunk[0][0], avg=round(sum(values) / len(values), 2))
        if len(chunk) > 1:
            bucket.min = round(min(values), 2)
            bucket.max = round(max(values), 2)
        buckets.append(bucket)
    return buckets


def _summary(points: list[tuple[str, float]]) -> HistorySummary:
    values = [v for _, v in points]
    peak = max(points, key=lambda p: p[1])
    low = min(points, key=lambda p: p[1])
    return HistorySummary(
        count=len(values),
        mean=round(sum(values) / len(values), 2),
        min=low[1],
        min_at=low[0],
        max=peak[1],
        max_at=peak[0],
        first=values[0],
        last=values[-1],
        last_at=points[-1][0],
    )


class GetSensorHistory(Tool[GetSensorHistoryArgs, GetSensorHistoryResult]):
    name = "get_sensor_history"
    answers = ("history",)
    description = (
        "Readings of one sensor type in a room over the last `hours` (1-168, default 24), "
        f"downsampled to at most {MAX_POINTS} points (average, min, max per point) plus a "
        "summary (mean, min, max and when)."
    )
    examples = (
        ToolExample(
            "How did CO2 change in room rm-123-a over the last 8 hours?",
            "readings over time",
            {"room_id": "rm-123-a", "sensor_type": "co2", "hours": 8},
        ),
    )
    prompt_order = 70

    async def run(self, args: GetSensorHistoryArgs, ctx: ToolContext) -> GetSensorHistoryResult:
        room, devices = await room_sensors(ctx, args.room_id, args.sensor_type)
        end = ctx.clock().replace(second=0, microsecond=0)
        start = end - timedelta(hours=args.hours)
        window = (end - start).total_seconds()
        interval = next((s for s in INTERVALS if window / s <= MAX_RAW_POINTS), INTERVALS[-1])
        result = GetSensorHistoryResult(
            room_id=args.room_id,
            room_name=_str(room, "name"),
            sensor_type=args.sensor_type,
            from_=_instant(start),
            to=_instant(end),
            series=[],
        )
        if not devices:
            result.note = _no_sensor_note(args.sensor_type)
            return result
        params = {
            "from": _instant(start),
            "to": _instant(end),
            "interval": _interval_text(interval),
        }
        devices = devices[:MAX_SERIES]
        fetched = await asyncio.gather(
            *(
                ctx.downstream.sensor(
                    path("sensors", str(d["sensorId"]), "history"), ctx.user, params
                )
                for d in devices
            ),
            return_exceptions=True,
        )
        for device, data in zip(devices, fetched, strict=True):
            entry = SensorSeries(sensor_id=str(device["sensorId"]))
            if isinstance(data, NotFoundError):
                entry.points, entry.note = [], "no readings recorded"
            elif isinstance(data, BaseException):
                if len(devices) == 1 or not isinstance(data, ToolError):
                    raise data
                entry.error = str(data)
            elif not isinstance(data, Mapping) or _str(data, "sensorId") != entry.sensor_id:
                entry.error = "sensor-service returned another sensor's data"
            else:
                points = _points(data)
                entry.unit = _str(data, "unit")
                entry.points = downsample(points)
                if points:
                    entry.summary = _summary(points)
                else:
                    offline = _str(data, "status") == "offline"
                    entry.note = (
                        "the sensor is offline: no readings in this window"
                        if offline
                        else "no readings in this window"
                    )
            result.series.append(entry)
        return result
