"""The seeded world model: a fixed estate, readings as a pure function of seed and time."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from local_world.clock import FixedClock, format_instant, parse_instant
from local_world.world import SENSOR_TYPES, World, build_world

T0 = datetime(2025, 3, 4, 10, 30, tzinfo=UTC)


def test_estate_shape(world: World) -> None:
    assert len(world.buildings) >= 6
    assert len({b.domain for b in world.buildings}) >= 3
    assert {b.id for b in world.buildings} >= {
        "bld-northwind-harbor",
        "bld-northwind-hq",
        "bld-acme-tower",
        "bld-acme-labs",
        "bld-civic-library",
        "bld-civic-townhall",
    }
    assert all(world.rooms_in(b.id) for b in world.buildings)
    assert Counter(s.type for s in world.sensors).keys() == set(SENSOR_TYPES)
    ids = [b.id for b in world.buildings] + [r.id for r in world.rooms]
    ids += [s.id for s in world.sensors]
    assert len(ids) == len(set(ids))
    for room in world.rooms:
        assert room.capacity > 0
        assert world.building(room.building_id) is not None


def test_deliberate_gaps(world: World) -> None:
    assert world.sensors_in_room("room-acme-labs-quiet") == []
    cold = {s.type for s in world.sensors_in_room("room-harbor-cold-store")}
    assert cold == {"temperature", "humidity"}
    rooms_missing_types = [
        r
        for r in world.rooms
        if 0 < len({s.type for s in world.sensors_in_room(r.id)}) < len(SENSOR_TYPES)
    ]
    assert len(rooms_missing_types) >= 5
    offline = world.sensor("sen-harbor-dock-b-temperature")
    assert offline is not None and not offline.online
    assert world.reading_at(offline, T0) is None
    assert world.history(offline, T0 - timedelta(hours=1), T0, 300) == []


def test_readings_are_deterministic_and_seeded(world: World) -> None:
    again = build_world(world.seed)
    other = build_world(world.seed + 1)
    assert [r.id for r in other.rooms] == [r.id for r in world.rooms]  # estate is fixed
    values = [world.reading_at(s, T0) for s in world.sensors]
    assert values == [again.reading_at(s, T0) for s in again.sensors]
    other_values = [other.reading_at(s, T0) for s in other.sensors]
    differing = sum(1 for a, b in zip(values, other_values, strict=True) if a != b)
    assert differing > len(values) // 2


def test_values_change_over_time_and_stay_plausible(world: World) -> None:
    for sensor in world.sensors:
        if not sensor.online:
            continue
        series = [r.value for r in world.history(sensor, T0 - timedelta(days=1), T0, 900)]
        assert len(series) == 97
        assert len(set(series)) > 3, sensor.id
        room = world.room(sensor.room_id)
        assert room is not None
        low, high = {
            "occupancy": (0, room.capacity),
            "co2": (350, 1300),
            "temperature": (0, 30),
            "humidity": (20, 100),
            "door_counter": (0, 100_000),
        }[sensor.type]
        assert all(low <= v <= high for v in series), (sensor.id, min(series), max(series))


def test_occupancy_follows_the_daily_curve(world: World) -> None:
    office = world.room("room-nwhq-open-office")
    assert office is not None
    night = datetime(2025, 3, 4, 2, 0, tzinfo=UTC)
    minute = int(night.timestamp()) // 60
    assert world.occupancy_at(office, minute) == 0
    midday = int(T0.timestamp()) // 60
    assert world.occupancy_at(office, midday) > office.capacity // 3


def test_door_counter_is_monotonic_within_a_day(world: World) -> None:
    sensor = world.sensor("sen-nwhq-lobby-door-counter")
    assert sensor is not None
    start = datetime(2025, 3, 4, 0, 0, tzinfo=UTC)
    series = [r.value for r in world.history(sensor, start, start + timedelta(minutes=1439), 60)]
    assert series[0] == 0
    assert series == sorted(series)
    assert series[-1] > 100


def test_latest_equals_the_history_point_at_the_same_instant(world: World) -> None:
    sensor = world.sensor("sen-library-reading-co2")
    assert sensor is not None
    latest = world.reading_at(sensor, T0 + timedelta(seconds=42))
    points = world.history(sensor, T0 - timedelta(hours=1), T0, 300)
    assert latest is not None and latest.timestamp == T0
    assert points[-1].timestamp == T0 and points[-1].value == latest.value
    assert all(p.timestamp.minute % 5 == 0 and p.timestamp.second == 0 for p in points)


def test_fixed_clock() -> None:
    clock = FixedClock("2025-03-04T10:30:00+01:00")
    assert format_instant(clock()) == "2025-03-04T09:30:00Z"
    clock.advance(minutes=90)
    assert format_instant(clock()) == "2025-03-04T11:00:00Z"
    clock.set("2025-01-01T00:00:00")
    assert clock() == parse_instant("2025-01-01T00:00:00Z")
