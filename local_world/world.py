"""The local CrowdVision world: a fixed estate of buildings, rooms and sensors, and readings
that are a pure function of ``(seed, sensor, time)``.

The estate (IDs, names, capacities, which rooms have which sensors) never depends on the seed,
so tests and eval datasets can name ``room-harbor-dock-a`` forever. The seed only moves the
readings: each room follows a daily activity curve for its room type (weekday and weekend,
in UTC), shifted by a seeded per-room phase and modulated by seeded value noise. Live values
are sampled once a minute; history points are the same function at aligned instants, so the
latest reading at ``t`` equals the history point at ``t``.

Deliberate gaps, for "no reading" versus "no sensor" questions:

* ``room-acme-labs-quiet`` has no sensors at all;
* several rooms lack some sensor types (e.g. ``room-harbor-cold-store`` has no occupancy sensor);
* ``sen-harbor-dock-b-temperature`` is installed but offline (registered, never reports).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from local_world.claims import Claims

SensorType = Literal["occupancy", "co2", "temperature", "humidity", "door_counter"]
SENSOR_TYPES: tuple[SensorType, ...] = (
    "occupancy",
    "co2",
    "temperature",
    "humidity",
    "door_counter",
)
UNITS: dict[SensorType, str] = {
    "occupancy": "people",
    "co2": "ppm",
    "temperature": "°C",
    "humidity": "%RH",
    "door_counter": "entries",
}
SAMPLE_SECONDS = 60
DEFAULT_SEED = 42


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
    installed_at: datetime
    online: bool = True

    @property
    def unit(self) -> str:
        return UNITS[self.type]

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


PROFILES: dict[str, Profile] = {
    "office": Profile(
        ((0, 0), (6.5, 0), (8, 0.35), (10, 0.8), (12, 0.55), (13.5, 0.75), (16, 0.7),
         (18, 0.25), (20, 0.03), (24, 0)),
        weekend=0.08, turnover=0.3,
    ),
    "meeting_room": Profile(
        ((0, 0), (8, 0), (9, 0.7), (11, 0.85), (12, 0.25), (13, 0.3), (14, 0.8), (16.5, 0.6),
         (18, 0), (24, 0)),
        weekend=0.0, turnover=0.5,
    ),
    "lobby": Profile(
        ((0, 0.01), (6, 0.02), (8.5, 0.7), (10, 0.3), (12.5, 0.6), (14, 0.3), (17.5, 0.75),
         (19.5, 0.1), (24, 0.01)),
        weekend=0.2, turnover=1.2,
    ),
    "loading_dock": Profile(
        ((0, 0.05), (5.5, 0.1), (6, 0.6), (10, 0.8), (14, 0.5), (14.5, 0.7), (21.5, 0.5),
         (22, 0.1), (24, 0.05)),
        weekend=0.5, turnover=0.3, base_temperature=14.0, base_humidity=55.0,
    ),
    "cold_storage": Profile(
        ((0, 0), (7, 0), (8, 0.15), (16, 0.15), (17, 0), (24, 0)),
        weekend=0.1, turnover=0.3, base_temperature=3.5, base_humidity=85.0,
    ),
    "storage": Profile(
        ((0, 0), (9, 0), (10, 0.1), (16, 0.1), (17, 0), (24, 0)),
        weekend=0.0, turnover=0.3, base_temperature=18.0, base_humidity=48.0,
    ),
    "cafeteria": Profile(
        ((0, 0), (7, 0), (8, 0.25), (9.5, 0.1), (11.5, 0.5), (12.5, 0.95), (13.5, 0.6),
         (14.5, 0.15), (16, 0.1), (17, 0), (24, 0)),
        weekend=0.05, turnover=0.8,
    ),
    "lab": Profile(
        ((0, 0), (8, 0.1), (9.5, 0.7), (12, 0.6), (13, 0.4), (17, 0.6), (19, 0.1), (24, 0)),
        weekend=0.1,
    ),
    "server_room": Profile(
        ((0, 0), (9, 0), (10, 0.25), (16, 0.25), (17, 0), (24, 0)),
        weekend=0.0, base_temperature=19.0, base_humidity=40.0,
    ),
    "quiet_room": Profile(
        ((0, 0), (9, 0.1), (11, 0.4), (15, 0.5), (17, 0.1), (18, 0), (24, 0)),
        weekend=0.0,
    ),
    "reading_room": Profile(
        ((0, 0), (9, 0), (9.5, 0.3), (12, 0.6), (15, 0.85), (18, 0.6), (20, 0.2), (20.5, 0),
         (24, 0)),
        weekend=1.15, turnover=0.35,
    ),
    "children_area": Profile(
        ((0, 0), (10, 0), (10.5, 0.4), (12, 0.3), (15.5, 0.9), (17.5, 0.4), (18, 0), (24, 0)),
        weekend=1.3, turnover=0.5,
    ),
    "council_chamber": Profile(
        ((0, 0), (9, 0), (10, 0.15), (16, 0.15), (18, 0.2), (18.5, 0.8), (21, 0.7), (21.5, 0),
         (24, 0)),
        weekend=0.0, turnover=0.6,
    ),
    "service_desk": Profile(
        ((0, 0), (8, 0), (8.5, 0.5), (10.5, 0.85), (12, 0.6), (14, 0.7), (16, 0.3), (16.5, 0),
         (24, 0)),
        weekend=0.0, turnover=0.9,
    ),
}  # fmt: skip

ALL: tuple[SensorType, ...] = SENSOR_TYPES

# (domain id, domain name, [(building id, name, address, floors, [room specs])])
# room spec: (room id, name, floor, capacity, type, sensor types)
RoomSpec = tuple[str, str, int, int, str, tuple[SensorType, ...]]
BuildingSpec = tuple[str, str, str, int, tuple[RoomSpec, ...]]
DomainSpec = tuple[str, str, tuple[BuildingSpec, ...]]
_ESTATE: tuple[DomainSpec, ...] = (
    ("northwind", "Northwind Logistics", (
        ("bld-northwind-harbor", "Harbor Warehouse", "12 Quay Road, Port Ellis", 2, (
            ("room-harbor-dock-a", "Loading Dock A", 0, 40, "loading_dock", ALL),
            ("room-harbor-dock-b", "Loading Dock B", 0, 40, "loading_dock",
             ("occupancy", "temperature", "door_counter")),
            ("room-harbor-cold-store", "Cold Store", 0, 12, "cold_storage",
             ("temperature", "humidity")),
            ("room-harbor-dispatch", "Dispatch Office", 1, 16, "office",
             ("occupancy", "co2", "temperature", "humidity")),
        )),
        ("bld-northwind-hq", "Northwind HQ", "400 Meridian Avenue, Port Ellis", 4, (
            ("room-nwhq-lobby", "Main Lobby", 0, 60, "lobby",
             ("occupancy", "co2", "door_counter")),
            ("room-nwhq-open-office", "Open Office", 1, 80, "office", ALL),
            ("room-nwhq-boardroom", "Boardroom", 3, 20, "meeting_room",
             ("occupancy", "co2", "temperature", "humidity")),
        )),
    )),
    ("acme", "Acme Corp", (
        ("bld-acme-tower", "Acme Tower", "1 Acme Plaza, Springfield", 30, (
            ("room-acme-tower-lobby", "Lobby", 0, 50, "lobby",
             ("occupancy", "temperature", "door_counter")),
            ("room-acme-tower-cafeteria", "Cafeteria", 1, 120, "cafeteria", ALL),
            ("room-acme-tower-conf-12a", "Conference Room 12A", 12, 14, "meeting_room",
             ("occupancy", "co2", "temperature", "humidity")),
        )),
        ("bld-acme-labs", "Acme Labs", "77 Research Park Drive, Springfield", 2, (
            ("room-acme-labs-wet-lab", "Wet Lab", 0, 10, "lab",
             ("co2", "temperature", "humidity")),
            ("room-acme-labs-server", "Server Room", -1, 4, "server_room",
             ("temperature", "humidity")),
            ("room-acme-labs-quiet", "Quiet Room", 1, 6, "quiet_room", ()),
        )),
    )),
    ("civic", "Riverton Civic Services", (
        ("bld-civic-library", "City Library", "5 Library Lane, Riverton", 3, (
            ("room-library-reading", "Reading Room", 1, 90, "reading_room", ALL),
            ("room-library-children", "Children's Corner", 0, 30, "children_area",
             ("occupancy", "co2", "temperature")),
            ("room-library-archive", "Archive", -1, 8, "storage", ("temperature", "humidity")),
        )),
        ("bld-civic-townhall", "Town Hall", "1 Market Square, Riverton", 3, (
            ("room-townhall-council", "Council Chamber", 1, 70, "council_chamber",
             ("occupancy", "co2", "temperature", "humidity")),
            ("room-townhall-service", "Citizen Service Desk", 0, 40, "service_desk",
             ("occupancy", "door_counter")),
        )),
    )),
)  # fmt: skip

OFFLINE_SENSORS = frozenset({"sen-harbor-dock-b-temperature"})


def sensor_id_for(room_id: str, sensor_type: SensorType) -> str:
    return f"sen-{room_id.removeprefix('room-')}-{sensor_type.replace('_', '-')}"


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
        return next((s for s in self.sensors_in_room(room_id) if s.type == "occupancy"), None)

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
        profile = PROFILES[room.type]
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
        return max(0, round(room.capacity * PROFILES[room.type].turnover * level * factor))

    def _door_day(self, room: Room, sensor_id: str, day: int) -> tuple[int, ...]:
        return _door_day_cached(self, room, sensor_id, day)

    def value_at(self, sensor: Sensor, minute: int) -> float | int:
        """The sensor's value at an epoch minute (pure function of seed, sensor, minute)."""
        room = self._rooms[sensor.room_id]
        profile = PROFILES[room.type]
        if sensor.type == "occupancy":
            return self.occupancy_at(room, minute)
        if sensor.type == "co2":
            # CO2 lags the people in the room: average utilisation over the last 20 minutes.
            util = sum(self._utilisation(room, minute - lag) for lag in (0, 10, 20)) / 3.0
            noise = _value_noise(self.seed, sensor.id, minute, 7)
            return round(415 + 700 * util + 20 * noise)
        day_angle = 2.0 * math.pi * ((minute % 1440) / 1440.0 - 15.0 / 24.0)
        if sensor.type == "temperature":
            util = self._utilisation(room, minute)
            noise = _value_noise(self.seed, sensor.id, minute, 15)
            base = profile.base_temperature + 0.5 * _signed(self.seed, sensor.id, "offset")
            return round(base + 1.5 * util + 0.8 * math.cos(day_angle) + 0.3 * noise, 1)
        if sensor.type == "humidity":
            util = self._utilisation(room, minute)
            noise = _value_noise(self.seed, sensor.id, minute, 20)
            value = profile.base_humidity - 4.0 * math.cos(day_angle) + 3.0 * util + 2.0 * noise
            return round(min(100.0, max(0.0, value)), 1)
        # door_counter: entries since 00:00 UTC, monotonic within a day.
        day, minute_of_day = divmod(minute, 1440)
        cumulative = self._door_day(room, sensor.id, day)
        slot, into_slot = divmod(minute_of_day, 15)
        in_slot = cumulative[slot + 1] - cumulative[slot]
        return cumulative[slot] + (in_slot * into_slot) // 15

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


def _installed_at(seed: int, sensor_id: str) -> datetime:
    days = int(_unit(seed, sensor_id, "installed") * 365)
    return datetime(2023, 1, 9, 9, 0, tzinfo=UTC) + timedelta(days=days)


def build_world(seed: int = DEFAULT_SEED) -> World:
    """The seeded local world. The estate is fixed; ``seed`` moves only the readings."""
    domains: list[Domain] = []
    buildings: list[Building] = []
    rooms: list[Room] = []
    sensors: list[Sensor] = []
    for domain_id, domain_name, building_specs in _ESTATE:
        domains.append(Domain(domain_id, domain_name))
        for building_id, name, address, floors, room_specs in building_specs:
            buildings.append(Building(building_id, domain_id, name, address, floors))
            for room_id, room_name, floor, capacity, room_type, sensor_types in room_specs:
                rooms.append(Room(room_id, building_id, room_name, floor, capacity, room_type))
                for sensor_type in sensor_types:
                    sid = sensor_id_for(room_id, sensor_type)
                    sensors.append(
                        Sensor(
                            id=sid,
                            room_id=room_id,
                            building_id=building_id,
                            type=sensor_type,
                            installed_at=_installed_at(seed, sid),
                            online=sid not in OFFLINE_SENSORS,
                        )
                    )
    return World(
        seed=seed,
        domains=tuple(domains),
        buildings=tuple(buildings),
        rooms=tuple(rooms),
        sensors=tuple(sensors),
    )
