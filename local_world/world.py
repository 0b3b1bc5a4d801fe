"""The local CrowdVision world: an estate of buildings, rooms and sensors read from a world
file, and readings that are a pure function of ``(seed, sensor, time)``.

The estate is data (``local_world.world_file``): ``build_world()`` serves the sample estate of
``local_world/worlds/sample.yaml``, ``build_world(path=...)`` (or ``load_world(path)``) any
other, e.g. the second world ``local_world/worlds/second.yaml``. The estate (ids, names,
capacities, which rooms have which sensors) never depends on the seed, so tests and eval
datasets can name ``room-harbor-dock-a`` forever. The seed only moves the readings: each room
follows the daily activity curve of its room type's profile (weekday and weekend, in UTC),
shifted by a seeded per-room phase and modulated by seeded value noise; each sensor type's
value model (occupancy, co2, temperature, humidity, door_counter, or the generic ``level``)
turns that activity into values. Live values are sampled once a minute; history points are
the same function at aligned instants, so the latest reading at ``t`` equals the history
point at ``t``.

Deliberate gaps in the sample, for "no reading" versus "no sensor" questions:

* ``room-acme-labs-quiet`` has no sensors at all;
* several rooms lack some sensor types (e.g. ``room-harbor-cold-store`` has no occupancy sensor);
* ``sen-harbor-dock-b-temperature`` is installed but offline (registered, never reports).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from local_world.claims import Claims
from local_world.world_file import SensorTypeSpec, UserSpec, WorldSpec, load_world_file

SensorType = str
# The sensor types of the built-in value models (the sample world's five); a world file may
# declare others, with the generic ``level`` model (``local_world.world_file``).
SENSOR_TYPES: tuple[str, ...] = ("occupancy", "co2", "temperature", "humidity", "door_counter")
SAMPLE_SECONDS = 60
DEFAULT_SEED = 42  # the sample world's readings seed (its file's ``seed``)


@dataclass(frozen=True, slots=True)
class Domain:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Building:
    id: str
    domain: str
    name: str
    address: str
    floors: int


@dataclass(frozen=True, slots=True)
class Room:
    id: str
    building_id: str
    name: str
    floor: int
    capacity: int
    type: str


@dataclass(frozen=True, slots=True)
class Sensor:
    id: str
    room_id: str
    building_id: str
    type: SensorType
    unit: str
    installed_at: datetime
    online: bool = True

    @property
    def record_id(self) -> str:
        """A Mongo-style 24-hex ``_id`` for the registry record."""
        return hashlib.blake2b(self.id.encode(), digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class Reading:
    sensor_id: str
    sensor_type: SensorType
    value: float | int
    unit: str
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class Profile:
    """Weekday activity anchors ``(hour, level 0..1)``, a weekend multiplier, and how much of
    the capacity walks in through the door per 15 minutes at full activity."""

    anchors: tuple[tuple[float, float], ...]
    weekend: float
    turnover: float = 0.4
    base_temperature: float = 21.0
    base_humidity: float = 42.0


# --- deterministic noise -----------------------------------------------------------------------


def _unit(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) fixed by ``(seed, parts)``."""
    key = "|".join([str(seed), *(str(part) for part in parts)]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2.0**64


def _signed(seed: int, *parts: object) -> float:
    return _unit(seed, *parts) * 2.0 - 1.0


def _value_noise(seed: int, key: str, minute: int, knot_minutes: int = 10) -> float:
    """Smooth noise in [-1, 1]: seeded knots every ``knot_minutes``, linearly interpolated."""
    knot, offset = divmod(minute, knot_minutes)
    left = _signed(seed, key, knot)
    right = _signed(seed, key, knot + 1)
    frac = offset / knot_minutes
    return left + (right - left) * frac


def _interpolate(anchors: tuple[tuple[float, float], ...], hour: float) -> float:
    for (h0, v0), (h1, v1) in itertools.pairwise(anchors):
        if h0 <= hour <= h1:
            return v0 if h1 == h0 else v0 + (v1 - v0) * (hour - h0) / (h1 - h0)
    return anchors[-1][1]


def epoch_minute(when: datetime) -> int:
    return math.floor(when.timestamp()) // SAMPLE_SECONDS


def minute_to_datetime(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * SAMPLE_SECONDS, UTC)


# --- the world ----------------------------------------------------------------------------------


@dataclass(eq=False)
class World:
    seed: int
    domains: tuple[Domain, ...]
    buildings: tuple[Building, ...]
    rooms: tuple[Room, ...]
    sensors: tuple[Sensor, ...]
    profiles: Mapping[str, Profile]
    sensor_types: Mapping[str, SensorTypeSpec]
    name: str = "sample"
    users: tuple[UserSpec, ...] = ()
    spec: WorldSpec | None = field(default=None, repr=False)
    _buildings: dict[str, Building] = field(init=False, repr=False)
    _rooms: dict[str, Room] = field(init=False, repr=False)
    _sensors: dict[str, Sensor] = field(init=False, repr=False)
    _domains: dict[str, Domain] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._domains = {d.id: d for d in self.domains}
        self._buildings = {b.id: b for b in self.buildings}
        self._rooms = {r.id: r for r in self.rooms}
        self._sensors = {s.id: s for s in self.sensors}

    # --- lookups -------------------------------------------------------------------------------

    def domain(self, domain_id: str) -> Domain | None:
        return self._domains.get(domain_id)

    def building(self, building_id: str) -> Building | None:
        return self._buildings.get(building_id)

    def room(self, room_id: str) -> Room | None:
        return self._rooms.get(room_id)

    def sensor(self, sensor_id: str) -> Sensor | None:
        return self._sensors.get(sensor_id)

    def rooms_in(self, building_id: str) -> list[Room]:
        return [r for r in self.rooms if r.building_id == building_id]

    def sensors_in_building(self, building_id: str) -> list[Sensor]:
        return [s for s in self.sensors if s.building_id == building_id]

    def sensors_in_room(self, room_id: str) -> list[Sensor]:
        return [s for s in self.sensors if s.room_id == room_id]

    def occupancy_sensor(self, room_id: str) -> Sensor | None:
        """The room's sensor of a type with the ``occupancy`` model (at most one)."""
        return next(
            (
                s
                for s in self.sensors_in_room(room_id)
                if self.sensor_types[s.type].model == "occupancy"
            ),
            None,
        )

    # --- authorization -----------------------------------------------------------------------

    def can_see_building(self, claims: Claims, building_id: str) -> bool:
        building = self._buildings.get(building_id)
        return building is not None and claims.can_see_domain(building.domain)

    def visible_building(self, claims: Claims, building_id: str) -> Building | None:
        """The building if it exists and the caller may see it; ``None`` for both failures."""
        building = self._buildings.get(building_id)
        if building is None or not claims.can_see_domain(building.domain):
            return None
        return building

    def visible_room(self, claims: Claims, room_id: str) -> Room | None:
        room = self._rooms.get(room_id)
        if room is None or self.visible_building(claims, room.building_id) is None:
            return None
        return room

    def visible_sensor(self, claims: Claims, sensor_id: str) -> Sensor | None:
        sensor = self._sensors.get(sensor_id)
        if sensor is None or self.visible_building(claims, sensor.building_id) is None:
            return None
        return sensor

    def visible_buildings(self, claims: Claims) -> list[Building]:
        return [b for b in self.buildings if claims.can_see_domain(b.domain)]

    # --- readings ------------------------------------------------------------------------------

    def _phase_minutes(self, room: Room) -> int:
        return round(_signed(self.seed, room.id, "phase") * 20)

    def activity(self, room: Room, minute: int) -> float:
        """The room's activity level in [0, 1] at an epoch minute (before per-minute jitter)."""
        profile = self.profiles[room.type]
        local = minute_to_datetime(minute + self._phase_minutes(room))
        hour = local.hour + local.minute / 60.0
        level = _interpolate(profile.anchors, hour)
        if local.weekday() >= 5:
            level *= profile.weekend
        if level <= 0.0:
            return 0.0
        noise = _value_noise(self.seed, room.id + "|occ", minute)
        return min(1.0, max(0.0, level * (1.0 + 0.25 * noise)))

    def occupancy_at(self, room: Room, minute: int) -> int:
        level = self.activity(room, minute)
        if level <= 0.0:
            return 0
        jitter = 0.03 * _signed(self.seed, room.id, "jitter", minute)
        return max(0, min(room.capacity, round(room.capacity * (level + jitter))))

    def _utilisation(self, room: Room, minute: int) -> float:
        return self.occupancy_at(room, minute) / room.capacity

    def _door_entries_in_slot(self, room: Room, sensor_id: str, day: int, slot: int) -> int:
        minute = day * 1440 + slot * 15 + 7
        level = self.activity(room, minute)
        if level <= 0.0:
            return 0
        factor = 1.0 + 0.3 * _signed(self.seed, sensor_id, "slot", day, slot)
        return max(0, round(room.capacity * self.profiles[room.type].turnover * level * factor))

    def _door_day(self, room: Room, sensor_id: str, day: int) -> tuple[int, ...]:
        return _door_day_cached(self, room, sensor_id, day)

    def value_at(self, sensor: Sensor, minute: int) -> float | int:
        """The sensor's value at an epoch minute (pure function of seed, sensor, minute), by
        its type's value model."""
        room = self._rooms[sensor.room_id]
        profile = self.profiles[room.type]
        kind = self.sensor_types[sensor.type]
        model = kind.model
        if model == "occupancy":
            return self.occupancy_at(room, minute)
        if model == "co2":
            # CO2 lags the people in the room: average utilisation over the last 20 minutes.
            util = sum(self._utilisation(room, minute - lag) for lag in (0, 10, 20)) / 3.0
            noise = _value_noise(self.seed, sensor.id, minute, 7)
            return round(415 + 700 * util + 20 * noise)
        day_angle = 2.0 * math.pi * ((minute % 1440) / 1440.0 - 15.0 / 24.0)
        if model == "temperature":
            util = self._utilisation(room, minute)
            noise = _value_noise(self.seed, sensor.id, minute, 15)
            base = profile.base_temperature + 0.5 * _signed(self.seed, sensor.id, "offset")
            return round(base + 1.5 * util + 0.8 * math.cos(day_angle) + 0.3 * noise, 1)
        if model == "humidity":
            util = self._utilisation(room, minute)
            noise = _value_noise(self.seed, sensor.id, minute, 20)
            value = profile.base_humidity - 4.0 * math.cos(day_angle) + 3.0 * util + 2.0 * noise
            return round(min(100.0, max(0.0, value)), 1)
        if model == "door_counter":
            # Entries since 00:00 UTC, monotonic within a day.
            day, minute_of_day = divmod(minute, 1440)
            cumulative = self._door_day(room, sensor.id, day)
            slot, into_slot = divmod(minute_of_day, 15)
            in_slot = cumulative[slot + 1] - cumulative[slot]
            return cumulative[slot] + (in_slot * into_slot) // 15
        util = self._utilisation(room, minute)
        return _level(kind, self.seed, sensor.id, util, day_angle, minute)

    def reading_at(self, sensor: Sensor, when: datetime) -> Reading | None:
        """The latest sample at or before ``when``; ``None`` for an offline sensor."""
        if not sensor.online:
            return None
        minute = epoch_minute(when)
        return Reading(
            sensor_id=sensor.id,
            sensor_type=sensor.type,
            value=self.value_at(sensor, minute),
            unit=sensor.unit,
            timestamp=minute_to_datetime(minute),
        )

    def history(
        self, sensor: Sensor, start: datetime, end: datetime, interval_seconds: int
    ) -> list[Reading]:
        """Samples at instants aligned to ``interval_seconds`` (a multiple of 60) in
        ``[start, end]``; empty for an offline sensor."""
        if interval_seconds % SAMPLE_SECONDS or interval_seconds <= 0:
            raise ValueError("interval must be a positive multiple of 60 seconds")
        if not sensor.online:
            return []
        return [
            Reading(sensor.id, sensor.type, self.value_at(sensor, m), sensor.unit, ts)
            for m, ts in aligned_minutes(start, end, interval_seconds)
        ]


def aligned_minutes(
    start: datetime, end: datetime, interval_seconds: int
) -> list[tuple[int, datetime]]:
    """Epoch-aligned sample instants in ``[start, end]``."""
    step = interval_seconds // SAMPLE_SECONDS
    first = -(-math.ceil(start.timestamp()) // interval_seconds) * step
    last = math.floor(end.timestamp()) // interval_seconds * step
    return [(m, minute_to_datetime(m)) for m in range(first, last + 1, step)]


def count_aligned(start: datetime, end: datetime, interval_seconds: int) -> int:
    first = -(-math.ceil(start.timestamp()) // interval_seconds)
    last = math.floor(end.timestamp()) // interval_seconds
    return max(0, last - first + 1)


@functools.lru_cache(maxsize=4096)
def _door_day_cached(world: World, room: Room, sensor_id: str, day: int) -> tuple[int, ...]:
    """Cumulative door entries at the start of each 15-minute slot of a day (97 values)."""
    totals = [0]
    for slot in range(96):
        totals.append(totals[-1] + world._door_entries_in_slot(room, sensor_id, day, slot))
    return tuple(totals)


def _level(
    kind: SensorTypeSpec, seed: int, sensor_id: str, util: float, day_angle: float, minute: int
) -> float | int:
    """The generic ``level`` model of a sensor type a world file declares."""
    noise = _value_noise(seed, sensor_id, minute, kind.noise_knot_minutes)
    value = (
        kind.base
        + kind.offset * _signed(seed, sensor_id, "offset")
        + kind.per_utilisation * util
        + kind.daily_amplitude * math.cos(day_angle)
        + kind.noise * noise
    )
    if kind.minimum is not None:
        value = max(kind.minimum, value)
    if kind.maximum is not None:
        value = min(kind.maximum, value)
    return round(value) if kind.decimals == 0 else round(value, kind.decimals)


def _installed_at(spec: WorldSpec, seed: int, sensor_id: str) -> datetime:
    days = int(_unit(seed, sensor_id, "installed") * spec.installations.days)
    return spec.installations.start.astimezone(UTC) + timedelta(days=days)


def world_from_spec(spec: WorldSpec, seed: int | None = None) -> World:
    """The world a validated file describes; ``seed`` (default: the file's) moves only the
    readings and the seeded installation dates."""
    seed = spec.seed if seed is None else seed
    domains: list[Domain] = []
    buildings: list[Building] = []
    rooms: list[Room] = []
    sensors: list[Sensor] = []
    for domain in spec.domains:
        domains.append(Domain(domain.id, domain.name))
        for b in domain.buildings:
            buildings.append(Building(b.id, domain.id, b.name, b.address, b.floors))
            for r in b.rooms:
                rooms.append(Room(r.id, b.id, r.name, r.floor, r.capacity, r.type))
                for s in r.sensors:
                    installed = s.installed_at or _installed_at(spec, seed, s.id)
                    sensors.append(
                        Sensor(
                            id=s.id,
                            room_id=r.id,
                            building_id=b.id,
                            type=s.type,
                            unit=spec.sensor_types[s.type].unit,
                            installed_at=installed.astimezone(UTC),
                            online=s.online,
                        )
                    )
    profiles = {
        name: Profile(
            anchors=tuple((hour, level) for hour, level in p.anchors),
            weekend=p.weekend,
            turnover=p.turnover,
            base_temperature=p.base_temperature,
            base_humidity=p.base_humidity,
        )
        for name, p in spec.profiles.items()
    }
    return World(
        seed=seed,
        domains=tuple(domains),
        buildings=tuple(buildings),
        rooms=tuple(rooms),
        sensors=tuple(sensors),
        profiles=profiles,
        sensor_types=dict(spec.sensor_types),
        name=spec.name,
        users=tuple(spec.users),
        spec=spec,
    )


def load_world(path: Path | str | None = None, seed: int | None = None) -> World:
    """The world in a world file (``None``: the sample); ``WorldFileError`` names the file
    and the bad field."""
    return world_from_spec(load_world_file(path), seed)


def build_world(seed: int | None = None, *, path: Path | str | None = None) -> World:
    """The seeded local world: the sample estate, or the one in ``path``. The estate is fixed;
    ``seed`` (default: the file's, 42 for the sample) moves only the readings."""
    return load_world(path, seed)
