"""Entity grounding: which building, room and documentation ids one request may use.

A small model asked for a ``room_id`` writes a room *name* or an id it made up, gets a
validation error back and then, too often, answers with figures no tool returned. The loop
avoids that mistake instead of retrying it: each request keeps the ids it has resolved (the
ids the question spells out, and those its tool results returned, all fetched as the asking
user), and a mode with constrained decoding limits every id argument to them
(``ChatRequest.choices``). The set is bounded by what this request's tools returned, never
the caller's whole estate.

Names are matched here too (``match_names``): the service resolves "Riverside Depot" to its
building id through ``list_buildings`` as the caller, so an unknown and a forbidden building
look the same (neither is in the caller's list).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.tools.twin import GetBuildingResult, ListBuildingsResult

__all__ = [
    "ENTITY_KEYS",
    "KnownEntities",
    "NamedEntity",
    "ids_after_word",
    "ids_in_text",
    "match_names",
    "named_buildings",
    "named_entities",
    "named_rooms",
]

# Result keys that hold an id, by entity kind (the tool views' spelling: agent/tools/twin.py).
ENTITY_KEYS: Mapping[str, str] = {
    "building_id": "building",
    "room_id": "room",
    "sensor_id": "sensor",
    "chunk_id": "chunk",
}

# An id as a person types one: a UUID; lowercase words joined by at least two hyphens, or
# with a digit ("b-river-depot", "room-12", "site-mars-base-7"). Plain hyphenated words
# ("door-counter", "sensor-health") are not ids.
_UUID = r"(?i:[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})"
_ID_SHAPES = rf"{_UUID}|[a-z][a-z0-9_]*(?:-[a-z0-9_]+){{2,}}|[a-z][a-z0-9_]*-\d[\w-]*"
_ID_IN_TEXT = re.compile(rf"(?<![\w-])({_ID_SHAPES})(?![\w])")
# After a word that says its kind, an id may be a bare number too ("room 4711", "room 0107"):
# digits only, so "Room 12A" stays a name's part.
_ID_AFTER_WORD = rf"(?<![\w-])({_ID_SHAPES}|\d{{1,12}}(?!\w)(?![.,]\d))"


def ids_in_text(text: str) -> list[str]:
    """Ids spelled out in a question, in order, without repeats."""
    seen: dict[str, None] = {}
    for match in _ID_IN_TEXT.finditer(text):
        seen.setdefault(match.group(1).rstrip("-_"), None)
    return list(seen)


def ids_after_word(text: str, word: str) -> list[str]:
    """Ids the question introduces with ``word`` ("room room-12a", "in room 4711"): the
    question's own statement of what kind of id it typed."""
    pattern = re.compile(rf"\b{re.escape(word)}\s+{_ID_AFTER_WORD}", re.IGNORECASE)
    return list(dict.fromkeys(m.group(1).rstrip("-_") for m in pattern.finditer(text)))


@dataclass(frozen=True)
class NamedEntity:
    """A building or room as a tool result showed it."""

    kind: str
    entity_id: str
    name: str


def _walk(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _parse(result_json: str) -> Any:
    try:
        return json.loads(result_json)
    except ValueError:
        return None


def named_buildings(listing: ListBuildingsResult) -> list[NamedEntity]:
    """The named buildings of a ``list_buildings`` result (what names are matched against)."""
    return [
        NamedEntity("building", b.building_id, b.name)
        for b in listing.buildings
        if b.building_id is not None and b.name is not None
    ]


def named_rooms(details: GetBuildingResult) -> list[NamedEntity]:
    """The named rooms of a ``get_building`` result."""
    return [
        NamedEntity("room", r.room_id, r.name)
        for r in details.rooms
        if r.room_id is not None and r.name is not None
    ]


def named_entities(result_json: str) -> list[NamedEntity]:
    """Every object in any tool's result JSON that carries exactly one entity id and a name
    (the planner reads its own steps typed: ``named_buildings``, ``named_rooms``)."""
    out: list[NamedEntity] = []
    for record in _walk(_parse(result_json)):
        name = record.get("name")
        kinds = [(key, kind) for key, kind in ENTITY_KEYS.items() if key in record]
        if len(kinds) == 1 and isinstance(name, str) and isinstance(record[kinds[0][0]], str):
            out.append(NamedEntity(kinds[0][1], record[kinds[0][0]], name))
    return out


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w]+", " ", text.lower().replace("'s ", " ")).split())


def match_names(question: str, entities: Iterable[NamedEntity]) -> list[NamedEntity]:
    """The entities whose full name the question mentions (case, punctuation and a
    possessive folded), longest name first, so "Bay Hall B" wins over "Bay Hall"."""
    padded = f" {_normalize(question)} "
    found = [e for e in entities if e.name.strip() and f" {_normalize(e.name)} " in padded]
    taken: list[NamedEntity] = []
    for entity in sorted(found, key=lambda e: -len(e.name)):
        name = f" {_normalize(entity.name)} "
        if not any(name in f" {_normalize(longer.name)} " for longer in taken):
            taken.append(entity)  # "Bay Hall" inside "Bay Hall B" is not a mention
    return taken


@dataclass
class KnownEntities:
    """The ids one request has resolved, per kind, first seen first."""

    ids: dict[str, dict[str, None]] = field(default_factory=dict)

    def add(self, kind: str, entity_id: str) -> None:
        if entity_id:
            self.ids.setdefault(kind, {}).setdefault(entity_id, None)

    def add_ids(self, ids: Iterable[str], kinds: Sequence[str]) -> None:
        """Ids the user typed: allowed for every id kind (a typed id that does not exist or
        is not the caller's gets the tools' one not-found answer)."""
        for entity_id in ids:
            for kind in kinds:
                self.add(kind, entity_id)

    def add_result(self, result_json: str) -> None:
        """Every id a tool result holds under an id key (``room_id``, ``chunk_id``, ...)."""
        for record in _walk(_parse(result_json)):
            for key, kind in ENTITY_KEYS.items():
                value = record.get(key)
                if isinstance(value, str):
                    self.add(kind, value)

    def choices(self, kinds: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """``ChatRequest.choices`` for these kinds (an empty tuple: nothing resolved yet)."""
        return {kind: tuple(self.ids.get(kind, {})) for kind in kinds}
