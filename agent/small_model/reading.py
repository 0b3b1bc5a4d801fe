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
out, so "the Cold Store" says nothing about temperature).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.small_model.entities import NamedEntity, ids_in_text, match_names, typed_as
from agent.small_model.intents import LiveIntent, asks_for_buildings, live_intent
from agent.small_model.routing import beyond_reading, is_greeting, live_words, product_words
from agent.words import content_words, doc_tokens

__all__ = ["QuestionReading", "without"]


def without(question: str, mentions: Sequence[str]) -> str:
    """The question without the names and ids it mentions: "the Cold Store" or
    "room-harbor-cold-store" says nothing about temperature."""
    for mention in sorted(mentions, key=len, reverse=True):
        if mention.strip():
            question = re.sub(re.escape(mention), " ", question, flags=re.IGNORECASE)
    return question


@dataclass(frozen=True)
class QuestionReading:
    """One question as the small-model strategy reads it (see the module docstring)."""

    text: str  # the question as searched: a follow-up's standalone form
    greeting: bool
    tokens: tuple[str, ...]  # documented tokens (error codes, setting keys), once each
    words: frozenset[str]  # content words (``agent.words``)
    buildings: tuple[NamedEntity, ...]  # the caller's buildings it names, longest name first
    typed_ids: tuple[str, ...]  # every id it spells out
    typed_buildings: tuple[str, ...]  # ids it types as buildings
    typed_rooms: tuple[str, ...]  # ids it types as rooms
    # Its content words besides the buildings' names and a live reading: what it asks of a
    # page about them, if anything (``routing.beyond_reading``).
    asks_beyond_names: frozenset[str]
    asks_for_buildings: bool  # which buildings the caller has
    product_words: bool  # names something of the product
    live_words: bool  # asks for a live reading or measurement

    @classmethod
    def of(cls, question: str, buildings: Sequence[NamedEntity]) -> QuestionReading:
        """``question`` read against the caller's ``buildings`` (``list_buildings``)."""
        named = tuple(match_names(question, buildings))
        typed = tuple(ids_in_text(question))
        as_buildings, as_rooms = (
            typed_as(question, "building", "bld-"),
            typed_as(question, "room", "room-"),
        )
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
            live_words=live_words(question),
            tokens=tuple(doc_tokens(question)),
            words=frozenset(content_words(question)),
            asks_for_buildings=asks_for_buildings(question),
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
        return rest, live_intent(rest)
