"""Answers the service writes itself, from the planner's tool results, without a model call.

For a small local model the slowest and least reliable part of a live-data answer is turning
JSON into a sentence: on 2 cores it costs 15-40 s, and the 1.5B misreads nulls and statuses
("The Annex Room has 6 people" from a null occupancy and a capacity of 6, "0.00 ppm" from a
room without a CO2 sensor). Where the planner (``agent.small_model.planning``) has already
run the one
measurement the question clearly asks for, or a step it ran says the building or room does
not exist for this caller, the answer is fully determined by those results: it is written
here, in milliseconds, from nothing but the results (the loop still checks it with
``agent.grounding`` before it is used). Anything less clear returns ``None`` and the model
answers as before.

Unknown and forbidden entities read the same: the text comes from the tools' one not-found
answer and the id the user typed, never from anything the caller may not see.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from agent.small_model.intents import LiveIntent
from agent.small_model.reading import without
from agent.tools.registry import ToolOutcome, result_of
from agent.tools.sensor import (
    GetLatestSensorData,
    GetLatestSensorDataResult,
    GetSensorHistory,
    GetSensorHistoryResult,
    ListSensors,
    ListSensorsResult,
)
from agent.tools.twin import (
    GetBuilding,
    GetBuildingResult,
    GetRoom,
    GetRoomOccupancy,
    GetRoomOccupancyResult,
    GetRoomResult,
    ListBuildings,
    ListBuildingsResult,
    RoomOccupancy,
)
from agent.words import content_words

__all__ = ["compose_greeting", "compose_live", "room_names"]

_BUSIEST = re.compile(r"\b(busiest|fullest|most (crowded|people|occupied|busy)|highest)\b")
_QUIETEST = re.compile(r"\b(emptiest|quietest|least (crowded|people|occupied|busy)|lowest)\b")
_ROOMS = re.compile(r"\brooms?\b")
_THANKS = re.compile(r"^\s*(thanks|thank you)\b", re.IGNORECASE)
# Every content word a question may use for the answer to be composed: a word outside this
# list ("firmware", "cost", "why") asks for something the tool results do not say, so the
# model answers (or says it does not know). Stemmed like routing.content_words.
_ANSWERABLE = content_words(
    "room building sensor sensors device devices people person busy busier busiest full "
    "fullest crowded occupancy occupied utilisation utilization capacity hold fit empty "
    "emptiest quiet quietest free current currently now right moment today reading readings "
    "level value measure measured concentration installed fitted there have has inventory "
    "which what how many much high low change changed history trend last past hour day week "
    "report "
    "reporting working live latest list show see access can tell give please currently "
    "average min max lowest highest least most floor rooms buildings know planned plan "
    "seat seats size big large type kind where located location detail details about"
)


def capabilities(sensor_types: Sequence[str] = ()) -> str:
    """What the assistant can do, from what its tools list (no corpus's topics)."""
    readings = f" ({', '.join(sensor_word(t) for t in sensor_types)})" if sensor_types else ""
    return (
        "I can help with CrowdVision: which buildings and rooms you can see, live occupancy "
        f"and sensor readings{readings} and their recent history, and how the platform "
        "works, from its documentation. What would you like to know?"
    )


def sensor_word(sensor_type: str) -> str:
    """A sensor type as a sentence writes it: "door_counter" -> "door counter", "co2" ->
    "CO2" (a word with a digit is a formula or code)."""
    words = sensor_type.replace("_", " ").split()
    return " ".join(w.upper() if any(c.isdigit() for c in w) else w for w in words)


_STATUS_PHRASES = {
    "offline": "is offline: it is not reporting, so there is no current reading",
    "no_reading": "has not reported any reading yet, so there is no current value",
    "unavailable": "could not be read right now (the sensor service did not answer)",
}


def compose_greeting(question: str, sensor_types: Sequence[str] = ()) -> str:
    """The answer to a greeting: what the assistant can do (no model call, no tool)."""
    opening = "You're welcome!" if _THANKS.match(question) else "Hello!"
    return f"{opening} {capabilities(sensor_types)}"


def _when(value: object) -> str:
    """An ISO instant as people read it ("10:30 UTC on 2025-03-04"); anything else as is."""
    text = str(value)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    if moment.utcoffset() != timedelta(0):
        return text
    return f"{moment:%H:%M} UTC on {moment:%Y-%m-%d}"


def _number(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return f"{value:g}" if isinstance(value, float) else str(value)


def room_names(steps: Sequence[ToolOutcome]) -> dict[str, str]:
    """Room id -> name, from every ``get_building`` result among ``steps``."""
    names: dict[str, str] = {}
    for step in steps:
        details = result_of(step, GetBuilding)
        for room in details.rooms if details is not None else []:
            if room.room_id and room.name:
                names[room.room_id] = room.name
    return names


def compose_live(
    question: str,
    intent: LiveIntent,
    steps: Sequence[ToolOutcome],
    *,
    building_list: bool,
    sensor_types: Sequence[str] = (),
) -> str | None:
    """The answer these planner steps settle, or ``None`` when the model should write it.

    ``question``: without the names and ids it mentions. ``steps``: the visible steps in the
    order they ran. ``building_list``: the question asks which buildings the caller can see
    (the shown ``list_buildings`` step answers it). ``sensor_types``: the types the tools
    list (words the results speak to)."""
    if not steps:
        return None
    missing = [s for s in steps if s.name == GetBuilding.name and not s.ok]
    if missing:
        return " ".join(_not_found("building", s.arguments.get("building_id")) for s in missing)
    failed = [s for s in steps if not s.ok]
    if _unanswerable(_without_names(question, steps), sensor_types) and not failed:
        return None  # it asks for more than the results say
    names = room_names(steps)
    measured = [s for s in steps if s.name not in (GetBuilding.name, ListBuildings.name)]
    if measured:
        parts = [_measurement(question, step, names) for step in measured]
        return None if any(part is None for part in parts) else " ".join(p for p in parts if p)
    if building_list:
        listings = [lst for s in steps if (lst := result_of(s, ListBuildings)) is not None]
        return _buildings(listings[0]) if listings else None
    lower = question.lower()
    if _ROOMS.search(lower) and not (intent.occupancy or intent.reading or intent.inventory):
        buildings = [bld for s in steps if (bld := result_of(s, GetBuilding)) is not None]
        return " ".join(_rooms(b) for b in buildings) or None
    return None


def _without_names(question: str, steps: Sequence[ToolOutcome]) -> str:
    """``question`` without the room and building names the results hold (a room typed by id
    may also be named: "Bay Hall B (room rm-riverside-bay-b)")."""
    names = set(room_names(steps).values())
    for step in steps:
        names |= {name for name in _names_shown(step) if name}
    return without(question, sorted(names))


def _names_shown(step: ToolOutcome) -> tuple[str | None, ...]:
    """The room and building names a measurement's result states besides its entries."""
    inventory = result_of(step, ListSensors)
    if inventory is not None:
        return inventory.room_name, inventory.building_name
    latest = result_of(step, GetLatestSensorData)
    if latest is not None:
        return (latest.room_name,)
    history = result_of(step, GetSensorHistory)
    return (history.room_name,) if history is not None else ()


def _unanswerable(question: str, sensor_types: Sequence[str]) -> set[str]:
    """The content words of ``question`` the tool results cannot speak to (numbers are fine:
    "the last 8 hours"; so are the sensor types the tools list)."""
    types = content_words(" ".join(t.replace("_", " ") for t in sensor_types))
    return {w for w in content_words(question) - _ANSWERABLE - types if not w.isdigit()}


def _not_found(kind: str, entity_id: object) -> str:
    what = f"{kind} {entity_id}" if isinstance(entity_id, str) and entity_id else f"that {kind}"
    return (
        f"I could not find {what}: it does not exist, or you do not have access to it. "
        "Check the id, or ask which buildings you can see."
    )


def _measurement(question: str, step: ToolOutcome, names: Mapping[str, str]) -> str | None:
    if not step.ok:
        if not (step.error and "not found" in step.error.lower()):
            return None  # a failing service: let the model say what it can
        rooms = step.arguments.get("room_ids") or [step.arguments.get("room_id")]
        if step.name == ListSensors.name and "Building" in step.error:
            return _not_found("building", step.arguments.get("building_id"))
        return " ".join(_not_found("room", room) for room in rooms)
    if (occupancy := result_of(step, GetRoomOccupancy)) is not None:
        return _occupancy(question, occupancy, names)
    if (inventory := result_of(step, ListSensors)) is not None:
        return _inventory(inventory)
    if (details := result_of(step, GetRoom)) is not None:
        return _room(details)
    if (latest := result_of(step, GetLatestSensorData)) is not None:
        return _latest(step, latest)
    if (history := result_of(step, GetSensorHistory)) is not None:
        return _history(history)
    return None


def _buildings(listing: ListBuildingsResult) -> str:
    buildings = listing.buildings
    if not buildings:
        return "You cannot see any buildings: none are accessible to your account."
    listed = "; ".join(
        f"{b.name} ({b.building_id}" + (f", {b.address})" if b.address else ")") for b in buildings
    )
    count = len(buildings)
    more = " (the list is truncated)" if listing.truncated else ""
    return f"You can see {count} building{'s' if count != 1 else ''}{more}: {listed}."


def _room(details: GetRoomResult) -> str | None:
    room, building = details.room, details.building
    if not room.name:
        return None
    where = f" in {building.name}" if building.name else ""
    facts = []
    if room.floor is not None:
        facts.append(f"is on floor {room.floor}")
    if room.capacity is not None:
        facts.append(f"is planned for {room.capacity} people (its capacity)")
    if room.type:
        facts.append(f"is of type {room.type.replace('_', ' ')}")
    listed = (
        ", ".join(facts[:-1]) + (" and " if len(facts) > 1 else "") + facts[-1] if facts else ""
    )
    return f"{room.name} ({room.room_id}){where} {listed}.".replace(" .", ".")


def _rooms(details: GetBuildingResult) -> str:
    building, rooms = details.building, details.rooms
    name = building.name or building.building_id
    if not rooms:
        return f"{name} has no rooms on record."
    listed = "; ".join(
        f"{r.name} ({r.room_id}, floor {r.floor}, capacity {r.capacity})" for r in rooms
    )
    return f"{name} has {len(rooms)} room{'s' if len(rooms) != 1 else ''}: {listed}."


def _occupancy(
    question: str, report: GetRoomOccupancyResult, names: Mapping[str, str]
) -> str | None:
    if not report.rooms:
        return None
    lines: list[str] = []
    counted: list[tuple[float, str]] = []  # (utilisation, else people), room label
    for room in report.rooms:
        label = names.get(room.room_id, room.room_id)
        line, rank = _occupancy_line(label, room)
        lines.append(line)
        if rank is not None:
            counted.append((rank, label))
    return f"{_superlative(question, counted)}Live occupancy: {'; '.join(lines)}."


def _occupancy_line(label: str, room: RoomOccupancy) -> tuple[str, float | None]:
    """One room's reading in words, and what ranks it (None: no live count)."""
    if room.error:
        return f"{label}: not found or not accessible", None
    people, capacity = _number(room.occupancy), _number(room.capacity)
    if people is None or room.occupancy is None:
        cap = f" (capacity {capacity})" if capacity else ""
        return f"{label}: no live people count{cap}, the room has no working occupancy sensor", None
    share = room.utilisation
    percent = f", {share:.0%}" if share is not None and capacity else ""
    of = f" of {capacity}" if capacity else ""
    rank = share if share is not None else room.occupancy
    return f"{label}: {people}{of} people{percent}", float(rank)


def _superlative(question: str, counted: Sequence[tuple[float, str]]) -> str:
    """ "The busiest room right now is X. " where the question asks which room is busiest
    (or least busy) and more than one room has a count; else nothing."""
    lower = question.lower()
    busiest, quietest = _BUSIEST.search(lower), _QUIETEST.search(lower)
    if len(counted) < 2 or not (busiest or quietest):
        return ""
    value, label = max(counted) if busiest else min(counted)
    if busiest and value == 0:
        return "Every room with a people count is empty right now. "
    return f"The {'busiest' if busiest else 'least busy'} room right now is {label}. "


def _inventory(inventory: ListSensorsResult) -> str:
    where = inventory.room_name or inventory.room_id or inventory.building_name
    sensors = inventory.sensors
    if not sensors:
        return f"No sensors are installed in {where} (an inventory fact, not a missing reading)."
    if inventory.room_id:
        kinds = ", ".join(f"{sensor_word(str(s.sensor_type))} ({s.sensor_id})" for s in sensors)
        return f"{where} has {len(sensors)} sensor{'s' if len(sensors) != 1 else ''}: {kinds}."
    by_room: dict[str, list[str]] = {}
    for sensor in sensors:
        kind = sensor_word(str(sensor.sensor_type))
        by_room.setdefault(str(sensor.room_name or sensor.room_id), []).append(kind)
    listed = "; ".join(f"{room}: {', '.join(kinds)}" for room, kinds in by_room.items())
    more = " (the list is truncated)" if inventory.truncated else ""
    return f"Sensors in {where}{more}: {listed}."


def _latest(step: ToolOutcome, latest: GetLatestSensorDataResult) -> str | None:
    where = latest.room_name or latest.room_id
    wanted = step.arguments.get("sensor_type")
    kind = sensor_word(str(wanted)) if wanted else None
    if not latest.readings:
        what = f"{kind} sensor" if kind else "sensor"
        value_word = f"{kind} reading" if kind else "reading"
        return f"No {what} is installed in {where}, so there is no {value_word} for it."
    parts = []
    for reading in latest.readings:
        sensor = sensor_word(reading.sensor_type)
        status = reading.status
        value = _number(reading.value)
        if status in ("ok", "stale") and value is not None:
            unit = f" {reading.unit}" if reading.unit else ""
            when = f" (read at {_when(reading.timestamp)})" if reading.timestamp else ""
            old = " This reading is old: it is not a current value." if status == "stale" else ""
            parts.append(f"The {sensor} in {where} is {value}{unit}{when}.{old}")
        elif status in _STATUS_PHRASES:
            phrase = _STATUS_PHRASES[status]
            parts.append(f"The {sensor} sensor in {where} ({reading.sensor_id}) {phrase}.")
        else:
            return None  # an unusual value (an object, a new status): the model reads it
    return " ".join(parts)


def _history(history: GetSensorHistoryResult) -> str | None:
    where = history.room_name or history.room_id
    kind = sensor_word(history.sensor_type)
    window = f"from {_when(history.from_)} to {_when(history.to)}"
    if not history.series:
        return f"No {kind} sensor is installed in {where}, so there is no {kind} history."
    parts = []
    for entry in history.series:
        summary = entry.summary
        unit = f" {entry.unit}" if entry.unit else ""
        if summary is not None:
            parts.append(
                f"The {kind} in {where} {window} ({summary.count} readings) ranged from "
                f"{_number(summary.min)}{unit} (at {_when(summary.min_at)}) to "
                f"{_number(summary.max)}{unit} (at {_when(summary.max_at)}), "
                f"averaging {_number(summary.mean)}{unit}; the latest was "
                f"{_number(summary.last)}{unit} at {_when(summary.last_at)}."
            )
        elif entry.note:
            parts.append(f"The {kind} sensor in {where} ({entry.sensor_id}): {entry.note}.")
        else:
            return None
    return " ".join(parts)
