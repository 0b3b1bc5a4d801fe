"""A local world as data: the estate file (YAML or JSON) the simulators serve.

The file holds what the simulators serve and nothing of how they compute it: the domains with
their buildings, rooms and sensors (every id written out, so nothing derives one id from
another), the sensor types with their unit and value model, the activity profiles the
readings follow per room type, the default readings seed, and the local users a person can
sign in as (the chat page's development sign-in, ``agent-service ask --as``). The value
models themselves are code (``local_world.world``); a file only picks one per sensor type and
sets its parameters.

``load_world_file(path)`` reads and validates one; every problem is reported with the file and
the field, e.g. ``worlds/x.yaml: domains[0] (acme).buildings[1] (bld-2).rooms[0] (r-1).capacity:
Input should be greater than 0``. ``SAMPLE_WORLD_FILE`` is the sample estate, the default
everywhere; ``local_world/worlds/`` holds the worlds the repository ships.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from foundation.roles import ROLE_WEIGHTS

WORLDS_DIR = Path(__file__).resolve().parent / "worlds"
SAMPLE_WORLD_FILE = WORLDS_DIR / "sample.yaml"
SUFFIXES = (".yaml", ".yml", ".json")

# The value models ``local_world.world`` implements. ``occupancy`` is the one the twin
# service's room occupancy reads; ``level`` is the generic one a new sensor type can use.
ValueModel = Literal["occupancy", "co2", "temperature", "humidity", "door_counter", "level"]


class WorldFileError(ValueError):
    """A world file that cannot be read or is not a valid world; the message names the file
    and, for each problem, the field (``problems`` holds one line per problem)."""

    def __init__(self, path: Path | str, problems: Sequence[str]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{self.path}: not a valid local world:\n{lines}")


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    if value != value.strip():
        raise ValueError("must not start or end with white space")
    return value


# Ids and names are strings in the file: an unquoted YAML ``4711`` (an integer) or ``0107``
# (an octal integer to YAML 1.1) is refused, not silently turned into another id.
Text = Annotated[StrictStr, AfterValidator(_not_blank)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileSpec(_Spec):
    """A room type's daily activity (UTC): weekday anchors ``[hour, level]`` with hours from 0
    to 24 in order and levels 0..1, a weekend multiplier, and how much of the capacity walks
    in per 15 minutes at full activity (door counters); the base temperature and humidity the
    environmental sensors of such a room start from."""

    anchors: list[tuple[float, float]] = Field(min_length=2)
    weekend: float = Field(ge=0, le=2)
    turnover: float = Field(default=0.4, ge=0, le=10)
    base_temperature: float = Field(default=21.0, ge=-40, le=60)
    base_humidity: float = Field(default=42.0, ge=0, le=100)

    @field_validator("anchors")
    @classmethod
    def _anchors(cls, anchors: list[tuple[float, float]]) -> list[tuple[float, float]]:
        hours = [hour for hour, _ in anchors]
        if hours[0] != 0 or hours[-1] != 24:
            raise ValueError("the first anchor's hour must be 0 and the last one's 24")
        if any(b < a for a, b in itertools.pairwise(hours)):
            raise ValueError("anchor hours must not decrease")
        if any(not 0 <= level <= 1 for _, level in anchors):
            raise ValueError("anchor levels must be between 0 and 1")
        return anchors


class SensorTypeSpec(_Spec):
    """A sensor type: its unit and the value model its readings follow. ``level`` (for types
    the built-in models do not cover) is ``base + per_utilisation * utilisation +
    daily_amplitude * cos(day) + noise * smooth noise + offset * a fixed per-sensor offset``,
    rounded to ``decimals`` and clamped to ``[minimum, maximum]``."""

    unit: Text
    model: ValueModel
    base: float = 0.0
    per_utilisation: float = 0.0
    daily_amplitude: float = 0.0
    noise: float = 0.0
    noise_knot_minutes: int = Field(default=10, ge=1, le=1440)
    offset: float = 0.0
    decimals: int = Field(default=1, ge=0, le=6)
    minimum: float | None = None
    maximum: float | None = None

    @model_validator(mode="after")
    def _level_only(self) -> Self:
        level_fields = {
            "base", "per_utilisation", "daily_amplitude", "noise", "noise_knot_minutes",
            "offset", "decimals", "minimum", "maximum",
        }  # fmt: skip
        if self.model != "level" and (set_here := level_fields & self.model_fields_set):
            raise ValueError(
                f"{', '.join(sorted(set_here))}: only a 'level' model takes parameters "
                f"(model is {self.model!r})"
            )
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError("minimum must not exceed maximum")
        return self


class SensorSpec(_Spec):
    id: Text
    type: Text
    online: bool = True
    installed_at: datetime | None = None

    @field_validator("installed_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class RoomSpec(_Spec):
    id: Text
    name: Text
    floor: int
    capacity: int = Field(gt=0, le=100_000)
    type: Text
    sensors: list[SensorSpec] = Field(default_factory=list)


class BuildingSpec(_Spec):
    id: Text
    name: Text
    address: Text
    floors: int = Field(ge=1, le=500)
    rooms: list[RoomSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _floors(self) -> Self:
        for room in self.rooms:
            if room.floor >= self.floors:
                raise ValueError(
                    f"room {room.id!r} is on floor {room.floor}, but the building has "
                    f"{self.floors} floors (0 to {self.floors - 1}, basements below 0)"
                )
        return self


class DomainSpec(_Spec):
    id: Text
    name: Text
    buildings: list[BuildingSpec] = Field(min_length=1)


class UserSpec(_Spec):
    """A local user: who the development sign-in and ``agent-service ask --as`` act as."""

    id: Text
    label: Text
    roles: list[Text] = Field(min_length=1)
    domains: list[Text] = Field(min_length=1)

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, roles: list[str]) -> list[str]:
        unknown = [r for r in roles if r not in ROLE_WEIGHTS]
        if unknown:
            raise ValueError(f"unknown role(s) {unknown}; known: {sorted(ROLE_WEIGHTS)}")
        return roles


class CallerSpec(_Spec):
    """The caller ``agent-service ask`` uses when none is given."""

    sub: Text
    roles: list[Text] = Field(min_length=1)
    domains: list[Text] = Field(min_length=1)


class InstallationsSpec(_Spec):
    """Sensors without an ``installed_at`` get a seeded day in ``[start, start + days)``."""

    start: datetime
    days: int = Field(ge=1, le=36_500)

    @field_validator("start")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class WorldSpec(_Spec):
    """One local world, as its file states it."""

    name: Text
    description: str = ""
    seed: int = 42
    installations: InstallationsSpec
    sensor_types: dict[str, SensorTypeSpec] = Field(min_length=1)
    profiles: dict[str, ProfileSpec] = Field(min_length=1)
    domains: list[DomainSpec] = Field(min_length=1)
    users: list[UserSpec] = Field(default_factory=list)
    default_caller: CallerSpec | None = None

    @model_validator(mode="after")
    def _references(self) -> Self:
        problems: list[str] = []
        occupancy_types = {n for n, t in self.sensor_types.items() if t.model == "occupancy"}
        for kind in ("domain", "building", "room", "sensor", "user"):
            ids = Counter(self._ids(kind))
            twice = sorted(i for i, n in ids.items() if n > 1)
            if twice:
                problems.append(f"{kind} ids must be unique; repeated: {twice}")
        for domain in self.domains:
            for building in domain.buildings:
                for room in building.rooms:
                    where = f"room {room.id!r}"
                    if room.type not in self.profiles:
                        problems.append(
                            f"{where}: type {room.type!r} has no profile; profiles: "
                            f"{sorted(self.profiles)}"
                        )
                    occupancy = [s.id for s in room.sensors if s.type in occupancy_types]
                    if len(occupancy) > 1:
                        problems.append(f"{where}: more than one occupancy sensor: {occupancy}")
                    for sensor in room.sensors:
                        if sensor.type not in self.sensor_types:
                            problems.append(
                                f"{where}: sensor {sensor.id!r} has type {sensor.type!r}, which "
                                f"sensor_types does not declare ({sorted(self.sensor_types)})"
                            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _ids(self, kind: str) -> Iterable[str]:
        for domain in self.domains:
            if kind == "domain":
                yield domain.id
            for building in domain.buildings:
                if kind == "building":
                    yield building.id
                for room in building.rooms:
                    if kind == "room":
                        yield room.id
                    if kind == "sensor":
                        yield from (s.id for s in room.sensors)
        if kind == "user":
            yield from (u.id for u in self.users)

    @property
    def caller(self) -> CallerSpec | None:
        """``default_caller``, else the first user's claims, else ``None``."""
        if self.default_caller is not None:
            return self.default_caller
        if self.users:
            first = self.users[0]
            return CallerSpec(sub=first.id, roles=first.roles, domains=first.domains)
        return None

    def user(self, user_id: str) -> UserSpec | None:
        return next((u for u in self.users if u.id == user_id), None)


# --- reading a file ------------------------------------------------------------------------------


def _label(data: Any, loc: Sequence[int | str]) -> str:
    """``domains[0] (acme).buildings[1] (bld-2).capacity``: the location, with the id of each
    listed entity it passes through (read from the raw data, so it shows what the file says)."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            node = node[item] if isinstance(node, list) and 0 <= item < len(node) else None
            ident = node.get("id") if isinstance(node, Mapping) else None
            suffix = f" ({ident})" if isinstance(ident, str | int) else ""
            parts[-1:] = [f"{parts[-1] if parts else ''}[{item}]{suffix}"]
        else:
            node = node.get(item) if isinstance(node, Mapping) else None
            parts.append(str(item))
    return ".".join(parts) or "(top level)"


def _problems(data: Any, error: ValidationError) -> list[str]:
    lines: list[str] = []
    for item in error.errors(include_url=False):
        loc = [part for part in item["loc"] if not str(part).startswith("function-")]
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "string_type" and isinstance(item.get("input"), int | float):
            message += ' (quote it: ids and names are strings, e.g. "4711")'
        lines.append(f"{_label(data, loc)}: {message}")
    return lines


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorldFileError(path, [f"line {exc.lineno}: not JSON: {exc.msg}"]) from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise WorldFileError(path, [f"not YAML: {exc}"]) from None


def parse_world(data: Any, *, source: Path | str = "<data>") -> WorldSpec:
    """Validate already-parsed data as a world; :class:`WorldFileError` names ``source``."""
    if not isinstance(data, Mapping):
        raise WorldFileError(source, ["(top level): must be a mapping of world fields"])
    try:
        return WorldSpec.model_validate(data)
    except ValidationError as exc:
        raise WorldFileError(source, _problems(data, exc)) from None


@functools.lru_cache(maxsize=16)
def _load_cached(path: Path, mtime_ns: int, size: int) -> WorldSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorldFileError(path, [f"cannot read: {exc}"]) from None
    return parse_world(_parse(path, text), source=path)


def load_world_file(path: Path | str | None = None) -> WorldSpec:
    """The world in ``path`` (YAML for ``.yaml``/``.yml``, JSON for ``.json``), or the sample
    world for ``None``. Cached per file and modification time."""
    file = Path(path) if path is not None else SAMPLE_WORLD_FILE
    if file.suffix.lower() not in SUFFIXES:
        raise WorldFileError(file, [f"a world file ends in {', '.join(SUFFIXES)}"])
    try:
        stat = file.stat()
    except OSError as exc:
        raise WorldFileError(file, [f"cannot read: {exc.strerror or exc}"]) from None
    if not file.is_file():
        raise WorldFileError(file, ["is not a file"])
    return _load_cached(file.resolve(), stat.st_mtime_ns, stat.st_size)


__all__ = [
    "SAMPLE_WORLD_FILE",
    "SUFFIXES",
    "WORLDS_DIR",
    "BuildingSpec",
    "CallerSpec",
    "DomainSpec",
    "InstallationsSpec",
    "ProfileSpec",
    "RoomSpec",
    "SensorSpec",
    "SensorTypeSpec",
    "UserSpec",
    "ValueModel",
    "WorldFileError",
    "WorldSpec",
    "load_world_file",
    "parse_world",
]
