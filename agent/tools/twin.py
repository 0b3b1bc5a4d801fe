"""Twin-service tools: buildings, rooms and live room occupancy.

Every building that comes back from twin-service is checked again with Cedar
(``access.accessible_domains``): the downstream answer is untrusted. Unknown and inaccessible
buildings or rooms give the same error text, byte for byte.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StringConstraints
from pydantic.json_schema import SkipJsonSchema

from agent.access import accessible_domains
from agent.tools.base import EntityRef, Tool, ToolContext, ToolError, ToolExample
from agent.tools.downstream import NotFoundError, path

BUILDING_NOT_FOUND = "Building not found or not accessible."
ROOM_NOT_FOUND = "Room not found or not accessible."
MAX_BUILDINGS = 50
MAX_OCCUPANCY_ROOMS = 20

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


def _check_id(value: str) -> str:
    """IDs become URL path segments: letters, digits and ``_.:-`` only, no leading dot."""
    if not _ID.match(value):
        raise ValueError("an ID is letters, digits, '_', '.', ':' or '-' (e.g. bld-123)")
    return value


# The pattern is checked in code, not in the JSON schema: constrained decoders (llama.cpp's
# grammar) expand bounded regex repetitions into large grammars.
EntityId = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=128),
    AfterValidator(_check_id),
]
BuildingId = Annotated[
    EntityId, Field(description="Building ID, e.g. from list_buildings."), EntityRef("building")
]
RoomId = Annotated[
    EntityId, Field(description="Room ID, e.g. from get_building."), EntityRef("room")
]


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- what the model reads: the tools' result models (fields in the order the model sees them;
# a field with a default is shown only when the tool sets it, see ``Tool``) ------------------

Count = int | float  # a number as twin-service sent it (an int stays an int)


class BuildingView(BaseModel):
    building_id: str | None
    name: str | None
    domain: str | None
    address: str | None
    floors: Count | None
    room_count: Count | None
    capacity: Count | None


class RoomView(BaseModel):
    room_id: str | None
    name: str | None
    floor: Count | None
    capacity: Count | None
    type: str | None


class BuildingRef(BaseModel):
    building_id: str | None
    name: str | None


class ListBuildingsResult(BaseModel):
    buildings: list[BuildingView]
    count: int  # all that matched (``buildings`` holds at most MAX_BUILDINGS)
    truncated: bool | None = None
    note: str | None = None  # when none matched


class GetBuildingResult(BaseModel):
    building: BuildingView
    rooms: list[RoomView]


class GetRoomResult(BaseModel):
    room: RoomView
    building: BuildingRef


class RoomOccupancy(BaseModel):
    """One room's reading, or (only ``room_id`` and ``error``) why there is none."""

    room_id: str
    building_id: str | None = None
    occupancy: Count | None = None
    capacity: Count | None = None
    utilisation: Count | None = None
    timestamp: str | None = None
    note: str | None = None  # when occupancy is null
    error: str | None = None


class GetRoomOccupancyResult(BaseModel):
    rooms: list[RoomOccupancy]


# --- untrusted downstream data -> compact, checked records ------------------------------------


def items(payload: JsonValue) -> list[Mapping[str, Any]]:
    """The objects of a list answer (a bare list, or ``{"items": [...]}``)."""
    if isinstance(payload, Mapping):
        payload = payload.get("items")
    if not isinstance(payload, list):
        return []
    return [item for item in payload if isinstance(item, Mapping)]


def _str(record: Mapping[str, Any], key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) and value else None


def _num(record: Mapping[str, Any], key: str) -> int | float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def building_view(record: Mapping[str, Any]) -> BuildingView:
    return BuildingView(
        building_id=_str(record, "buildingId"),
        name=_str(record, "name"),
        domain=_str(record, "domain"),
        address=_str(record, "address"),
        floors=_num(record, "floors"),
        room_count=_num(record, "roomCount"),
        capacity=_num(record, "capacity"),
    )


def room_view(record: Mapping[str, Any]) -> RoomView:
    return RoomView(
        room_id=_str(record, "roomId"),
        name=_str(record, "name"),
        floor=_num(record, "floor"),
        capacity=_num(record, "capacity"),
        type=_str(record, "type"),
    )


# --- shared lookups (also used by the sensor tools) --------------------------------------------


async def accessible_building(ctx: ToolContext, building_id: str) -> Mapping[str, Any]:
    """The building record, if it exists and Cedar lets the caller see its domain."""
    try:
        data = await ctx.downstream.twin(path("buildings", building_id), ctx.user)
    except NotFoundError:
        raise ToolError(BUILDING_NOT_FOUND) from None
    if not isinstance(data, Mapping) or _str(data, "buildingId") != building_id:
        raise ToolError(BUILDING_NOT_FOUND)
    domain = _str(data, "domain")
    if domain is None or domain not in accessible_domains(ctx.authorizer, ctx.user, [domain]):
        raise ToolError(BUILDING_NOT_FOUND)
    return data


async def building_rooms(ctx: ToolContext, building_id: str) -> list[Mapping[str, Any]]:
    """The rooms of an (already authorized) building, dropping rooms of other buildings."""
    try:
        data = await ctx.downstream.twin(path("buildings", building_id, "rooms"), ctx.user)
    except NotFoundError:
        raise ToolError(BUILDING_NOT_FOUND) from None
    return [
        room
        for room in items(data)
        if _str(room, "buildingId") == building_id and _str(room, "roomId")
    ]


async def accessible_room(
    ctx: ToolContext, room_id: str
) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(room, building)`` if the room exists and its building is visible to the caller."""
    try:
        room = await ctx.downstream.twin(path("rooms", room_id), ctx.user)
    except NotFoundError:
        raise ToolError(ROOM_NOT_FOUND) from None
    if not isinstance(room, Mapping) or _str(room, "roomId") != room_id:
        raise ToolError(ROOM_NOT_FOUND)
    building_id = _str(room, "buildingId")
    if building_id is None:
        raise ToolError(ROOM_NOT_FOUND)
    try:
        building = await accessible_building(ctx, building_id)
    except ToolError as exc:
        if str(exc) == BUILDING_NOT_FOUND:
            raise ToolError(ROOM_NOT_FOUND) from None
        raise
    return room, building


# --- the tools -------------------------------------------------------------------------------


class ListBuildingsArgs(Args):
    name: str | SkipJsonSchema[None] = Field(
        default=None,
        max_length=200,
        description="Optional: keep buildings whose name or address contains this text.",
    )


class ListBuildings(Tool[ListBuildingsArgs, ListBuildingsResult]):
    name = "list_buildings"
    description = (
        "List the buildings the user can see (ID, name, domain, address, floors, rooms, "
        "capacity). Use it to resolve a building name to its building_id."
    )
    guidance = (
        "Resolve a building name with list_buildings (use its name filter), "
        "then get_building for its rooms."
    )
    examples = (
        ToolExample(
            "How busy is Riverside Depot right now?",
            "resolve the building name first",
            {"name": "Riverside Depot"},
        ),
    )
    prompt_order = 10

    async def run(self, args: ListBuildingsArgs, ctx: ToolContext) -> ListBuildingsResult:
        data = await ctx.downstream.twin("/buildings", ctx.user)
        records = [b for b in items(data) if _str(b, "buildingId") and _str(b, "domain")]
        visible = accessible_domains(ctx.authorizer, ctx.user, {str(b["domain"]) for b in records})
        buildings = [building_view(b) for b in records if b["domain"] in visible]
        if args.name:
            needle = args.name.strip().lower()
            buildings = [
                b
                for b in buildings
                if needle in str(b.name or "").lower()
                or needle in str(b.address or "").lower()
                or needle == str(b.building_id).lower()
            ]
        result = ListBuildingsResult(buildings=buildings[:MAX_BUILDINGS], count=len(buildings))
        if len(buildings) > MAX_BUILDINGS:
            result.truncated = True
        if not buildings:
            result.note = (
                f"No accessible building matches {args.name!r}."
                if args.name
                else "The user cannot see any building."
            )
        return result


class GetBuildingArgs(Args):
    building_id: BuildingId


class GetBuilding(Tool[GetBuildingArgs, GetBuildingResult]):
    name = "get_building"
    description = "One building's details and its rooms (room IDs, names, floors, capacity)."
    examples = (
        ToolExample(
            "Which rooms are in building bld-123?",
            "rooms of a building",
            {"building_id": "bld-123"},
        ),
    )
    prompt_order = 20

    async def run(self, args: GetBuildingArgs, ctx: ToolContext) -> GetBuildingResult:
        building = await accessible_building(ctx, args.building_id)
        rooms = await building_rooms(ctx, args.building_id)
        return GetBuildingResult(
            building=building_view(building), rooms=[room_view(r) for r in rooms]
        )


class GetRoomArgs(Args):
    room_id: RoomId


class GetRoom(Tool[GetRoomArgs, GetRoomResult]):
    name = "get_room"
    description = "One room's details (name, floor, capacity, type) and its building."
    prompt_order = 30

    async def run(self, args: GetRoomArgs, ctx: ToolContext) -> GetRoomResult:
        room, building = await accessible_room(ctx, args.room_id)
        return GetRoomResult(
            room=room_view(room),
            building=BuildingRef(
                building_id=_str(building, "buildingId"), name=_str(building, "name")
            ),
        )


class GetRoomOccupancyArgs(Args):
    room_ids: list[RoomId] = Field(
        min_length=1,
        max_length=MAX_OCCUPANCY_ROOMS,
        description="Room IDs; pass every room you need in one call.",
    )


class GetRoomOccupancy(Tool[GetRoomOccupancyArgs, GetRoomOccupancyResult]):
    name = "get_room_occupancy"
    description = (
        "Live occupancy of one or more rooms: people now, capacity, utilisation (0-1) and "
        "the reading time. occupancy is null when the room has no working occupancy sensor."
    )
    guidance = "Occupancy: get_room_occupancy with every room you need in one call."
    answers = ("occupancy",)
    examples = (
        ToolExample(
            "How many people are in room rm-123-a and rm-123-b?",
            "live occupancy of rooms",
            {"room_ids": ["rm-123-a", "rm-123-b"]},
        ),
    )
    prompt_order = 40

    async def run(self, args: GetRoomOccupancyArgs, ctx: ToolContext) -> GetRoomOccupancyResult:
        room_ids = list(dict.fromkeys(args.room_ids))
        fetched = await asyncio.gather(
            *(ctx.downstream.twin(path("rooms", r, "occupancy"), ctx.user) for r in room_ids),
            return_exceptions=True,
        )
        records: dict[str, Mapping[str, Any]] = {}
        errors: dict[str, str] = {}
        for room_id, data in zip(room_ids, fetched, strict=True):
            if isinstance(data, NotFoundError):
                errors[room_id] = ROOM_NOT_FOUND
            elif isinstance(data, ToolError):
                errors[room_id] = str(data)
            elif isinstance(data, BaseException):
                raise data
            elif (
                isinstance(data, Mapping)
                and _str(data, "roomId") == room_id
                and _str(data, "buildingId")
            ):
                records[room_id] = data
            else:
                errors[room_id] = ROOM_NOT_FOUND
        visible, failed = await _visible_buildings(
            ctx, {str(r["buildingId"]) for r in records.values()}
        )
        rooms: list[RoomOccupancy] = []
        for room_id in room_ids:
            record = records.get(room_id)
            if record is None or record["buildingId"] not in visible:
                error = errors.get(room_id, ROOM_NOT_FOUND)
                if record is not None:
                    error = failed.get(str(record["buildingId"]), ROOM_NOT_FOUND)
                rooms.append(RoomOccupancy(room_id=room_id, error=error))
                continue
            entry = RoomOccupancy(
                room_id=room_id,
                building_id=_str(record, "buildingId"),
                occupancy=_num(record, "occupancy"),
                capacity=_num(record, "capacity"),
                utilisation=_num(record, "utilisation"),
                timestamp=_str(record, "timestamp"),
            )
            if entry.occupancy is None:
                entry.note = "no occupancy reading (no occupancy sensor, or it is offline)"
            rooms.append(entry)
        failures = [r.error for r in rooms if r.error is not None]
        if len(failures) == len(rooms):
            raise ToolError(" ".join(sorted(set(failures))))
        return GetRoomOccupancyResult(rooms=rooms)


async def _visible_buildings(
    ctx: ToolContext, building_ids: Iterable[str]
) -> tuple[set[str], dict[str, str]]:
    """Which of these buildings the caller may see (twin lookups + one Cedar batch), and the
    errors of lookups that failed for another reason than "not found"."""
    ids = sorted(building_ids)
    fetched = await asyncio.gather(
        *(ctx.downstream.twin(path("buildings", b), ctx.user) for b in ids),
        return_exceptions=True,
    )
    domains: dict[str, str] = {}
    failed: dict[str, str] = {}
    for building_id, data in zip(ids, fetched, strict=True):
        if isinstance(data, NotFoundError):
            continue
        if isinstance(data, ToolError):
            failed[building_id] = str(data)
            continue
        if isinstance(data, BaseException):
            raise data
        if isinstance(data, Mapping) and _str(data, "buildingId") == building_id:
            domain = _str(data, "domain")
            if domain is not None:
                domains[building_id] = domain
    visible = accessible_domains(ctx.authorizer, ctx.user, set(domains.values()))
    return {b for b, d in domains.items() if d in visible}, failed
