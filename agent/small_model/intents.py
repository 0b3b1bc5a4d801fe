"""What a live-data question asks for, from its words: occupancy now, the sensor inventory,
a current reading, or a history. Cheap and conservative: an intent is only acted on when
the question also names a building or room the caller can see
(``agent.small_model.planning``), and a question with no clear intent is left to the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.llm.base import ToolSpec

__all__ = ["LiveIntent", "live_intent", "named_sensor_types", "sensor_type_words", "sensor_types"]

_OCCUPANCY = re.compile(
    r"\b(busy|busiest|full|fullest|crowded|occupancy|occupied|utili[sz]ation|how many people"
    r"|people (are )?in|empty|emptiest|free|quiet(est)?)\b"
)
_INVENTORY = re.compile(
    r"\b(which|what|any|installed|have|has|inventory|devices?)\b.*\bsensors?\b"
    r"|\bsensors?\b.*\b(installed|fitted|are there)\b"
)
# "what is the temperature in X" asks for the current value as much as "current" does.
_READING = re.compile(
    r"\b(reading|readings|reporting|right now|currently|current|level|now|"
    r"what is|what's|how high|how low)\b"
)
# "Which buildings can I see?", "List all the buildings": the caller's building list.
_BUILDING_LIST = re.compile(r"\b(which|what|list|show|all)\b[^?.]*\bbuildings\b", re.IGNORECASE)
# A room's planned size or place, not its live count: "how many people is it planned for",
# "can it hold", "can room X hold", "which floor". A live word ("now", "currently") keeps the
# occupancy reading.
_DETAILS = re.compile(
    r"\b(planned for|can\b[^?.]{0,60}\bhold|capacity|fit|seats?|how big|size|(which|what) floor)\b"
)
_LIVE = re.compile(r"\b(now|currently|current|at the moment|live|today)\b")
_HISTORY = re.compile(
    r"\b(history|trend|over the (last|past)|during the (last|past)|changed?|since)\b"
)
_HOURS = re.compile(r"\b(last|past)\s+(\d{1,3})\s*(hours?|h)\b")
_WEEK = re.compile(r"\b(last|past)\s+(week|7 days)\b")


@dataclass(frozen=True)
class LiveIntent:
    occupancy: bool = False
    details: bool = False  # the room's floor, capacity, type (get_room)
    inventory: bool = False
    reading: bool = False
    history_hours: int | None = None
    sensor_type: str | None = None  # one of the types the tools' schemas list, when named


def sensor_types(specs: Iterable[ToolSpec]) -> tuple[str, ...]:
    """The sensor types the tools' schemas list (the enum of a ``sensor_type`` argument),
    without a quantity a tool answers on its own (``ToolSpec.answers``: occupancy has its
    own tool and intent)."""
    specs = list(specs)
    answered = {quantity for spec in specs for quantity in spec.answers}
    found: dict[str, None] = {}
    for spec in specs:
        properties: dict[str, Any] = spec.parameters.get("properties", {})
        for value in properties.get("sensor_type", {}).get("enum", []):
            if isinstance(value, str) and value not in answered:
                found.setdefault(value, None)
    return tuple(found)


def sensor_type_words(sensor_type: str) -> tuple[str, ...]:
    """How a question writes a type ("door_counter": "door counter", "door-counter")."""
    return tuple(dict.fromkeys((sensor_type, *(sensor_type.replace("_", c) for c in " -"))))


def named_sensor_types(text: str, types: Sequence[str]) -> set[str]:
    """The types of ``types`` that ``text`` names."""
    text = text.lower()
    return {
        kind
        for kind in types
        for word in sensor_type_words(kind)
        if re.search(rf"\b{re.escape(word.lower())}s?\b", text)
    }


def _sensor_type(text: str, types: Sequence[str]) -> str | None:
    found = named_sensor_types(text, types)
    return found.pop() if len(found) == 1 else None


def _hours(text: str) -> int:
    match = _HOURS.search(text)
    if match:
        return max(1, min(168, int(match.group(2))))
    return 168 if _WEEK.search(text) else 24


def live_intent(question: str, types: Sequence[str] = ()) -> LiveIntent:
    """What ``question`` asks of its places; ``types``: the sensor types the tools list."""
    text = question.lower()
    sensor_type = _sensor_type(text, types)
    history = bool(_HISTORY.search(text)) and sensor_type is not None
    inventory = bool(_INVENTORY.search(text)) and not history
    reading = sensor_type is not None and not history and bool(_READING.search(text))
    if "sensor" in text and "reporting" in text:
        reading = True  # "is the temperature sensor reporting": the latest reading says
    details = bool(_DETAILS.search(text)) and not _LIVE.search(text)
    occupancy = (
        bool(_OCCUPANCY.search(text)) and sensor_type is None and not inventory and not details
    )
    return LiveIntent(
        occupancy=occupancy,
        details=details,
        inventory=inventory and not reading,
        reading=reading,
        history_hours=_hours(text) if history else None,
        sensor_type=sensor_type,
    )


def asks_for_buildings(question: str) -> bool:
    """The question asks which buildings the caller has (``list_buildings`` answers it)."""
    return bool(_BUILDING_LIST.search(question))
