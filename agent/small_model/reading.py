"""What a question says, read once (``QuestionReading``): the planner, the router and the
composer work from this typed reading instead of each re-reading the raw text with its own
patterns.

Read up front, as soon as the question's standalone form is known
(``agent.small_model.followups``): whether it is a greeting, the documented tokens it names,
its content words, the buildings it names (matched against the caller's own list) and the
ids it types, whether it asks for the caller's buildings, and whether it uses the product's
or the live readings' vocabulary. Two readings need what the tools return first, and are
methods: the rooms it names (``rooms_named``: matched against the grounded buildings'
rooms) and what it asks of them (``intent``: read with every name and id it mentions taken
out, so "the Humidity Lab" says nothing about humidity).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.small_model.entities import NamedEntity, ids_after_word, ids_in_text, match_names
from agent.small_model.intents import (
    LiveIntent,
    asks_for_buildings,
    live_intent,
    named_sensor_types,
)
from agent.small_model.routing import beyond_reading, is_greeting, live_words, product_words
from agent.words import content_words, doc_tokens

__all__ = ["QuestionReading", "without"]


def without(question: str, mentions: Sequence[str]) -> str:
    """The question without the names and ids it mentions: "the Humidity Lab" or
    "lab-humidity-east" says nothing about humidity."""
    for mention in sorted(mentions, key=len, reverse=True):
        if mention.strip():
            question = re.sub(re.escape(mention), " ", question, flags=re.IGNORECASE)
    return question


def _unique(ids: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True)
class QuestionReading:
    """One question as the small-model strategy reads it (see the module docstring)."""

    text: str  # the question as searched: a follow-up's standalone form
    greeting: bool
    tokens: tuple[str, ...]  # documented tokens (error codes, setting keys), once each
    words: frozenset[str]  # content words (``agent.words``)
    buildings: tuple[NamedEntity, ...]  # the caller's buildings it names, longest name first
    typed_ids: tuple[str, ...]  # every id it spells out
    typed_buildings: tuple[str, ...]  # ids it types as buildings (or the caller's list holds)
    typed_rooms: tuple[str, ...]  # ids it types as rooms
    # Its content words besides the buildings' names and a live reading: what it asks of a
    # page about them, if anything (``routing.beyond_reading``).
    asks_beyond_names: frozenset[str]
    asks_for_buildings: bool  # which buildings the caller has
    product_words: bool  # names something of the product
    live_words: bool  # asks for a live reading or measurement
    sensor_types: tuple[str, ...] = ()  # the types the tools' schemas list (``intents``)

    @classmethod
    def of(
        cls,
        question: str,
        buildings: Sequence[NamedEntity],
        sensor_types: Sequence[str] = (),
    ) -> QuestionReading:
        """``question`` read against the caller's ``buildings`` (``list_buildings``) and the
        sensor types the tools list."""
        named = tuple(match_names(question, buildings))
        listed = {b.entity_id for b in buildings}
        # Ids are opaque: one is a building's when the caller's list holds it or the question
        # says so ("building X"), a room's when it says so ("room 4711"); any other is
        # resolved by lookup.
        said, said_rooms = ids_after_word(question, "building"), ids_after_word(question, "room")
        typed = _unique([*ids_in_text(question), *said, *said_rooms])
        as_buildings = _unique([*said, *(i for i in typed if i in listed)])
        as_rooms = _unique(i for i in said_rooms if i not in as_buildings)
        rest = without(question, [b.name for b in named])
        return cls(
            text=question,
            buildings=named,
            typed_ids=typed,
            typed_buildings=as_buildings,
            typed_rooms=as_rooms,
            greeting=is_greeting(question),
            asks_beyond_names=frozenset(beyond_reading(rest)),
            product_words=product_words(question),
            live_words=live_words(question) or bool(named_sensor_types(question, sensor_types)),
            tokens=tuple(doc_tokens(question)),
            words=frozenset(content_words(question)),
            asks_for_buildings=asks_for_buildings(question),
            sensor_types=tuple(sensor_types),
        )

    @property
    def unresolved_ids(self) -> tuple[str, ...]:
        """The ids it types whose kind neither the question nor the caller's list says."""
        kinds = {*self.typed_buildings, *self.typed_rooms}
        return tuple(i for i in self.typed_ids if i not in kinds)

    def resolved(self, rooms: Sequence[str], buildings: Sequence[str]) -> QuestionReading:
        """This reading with looked-up ids added to its typed rooms and buildings."""
        return dataclasses.replace(
            self,
            typed_rooms=_unique([*self.typed_rooms, *rooms]),
            typed_buildings=_unique([*self.typed_buildings, *buildings]),
        )

    def coverage(self, text: str) -> float:
        """The share of the question's content words that ``text`` contains (0 for none)."""
        if not self.words:
            return 0.0
        return len(self.words & content_words(text)) / len(self.words)

    def rooms_named(self, rooms: Sequence[NamedEntity]) -> list[NamedEntity]:
        """The rooms of ``rooms`` the question names, then those it types by id (one of
        ``rooms``, or else as typed: the tool answers an unknown or forbidden id with its
        one not-found result)."""
        found = list(match_names(self.text, rooms))
        by_id = {room.entity_id: room for room in rooms}
        for room_id in self.typed_rooms:
            room = by_id.get(room_id, NamedEntity("room", room_id, room_id))
            if room not in found:
                found.append(room)
        return found

    def intent(self, mentions: Sequence[str]) -> tuple[str, LiveIntent]:
        """What the question asks of its places, read without ``mentions`` (the names it
        used) and the ids it typed: that rest of the question, and its ``LiveIntent``."""
        rest = without(self.text, [*mentions, *self.typed_ids])
        return rest, live_intent(rest, self.sensor_types)
