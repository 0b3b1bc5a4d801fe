"""Follow-up questions as standalone search queries (issue 17, item 3).

"How do I fix it?" after "What does AB-E2044 mean?" searches for nothing useful as typed, and
"and which of its rooms has a CO2 sensor?" names no building to ground. Before the service
searches the documentation and resolves building and room names (``agent.small_model.planning``), a
``QueryRewriter`` turns the question into a standalone one from the conversation's earlier
turns. The rewritten text is used for the search query and the entity resolution only; the
model still gets the user's question as typed, with the history (``Agent.answer``).

``DeterministicRewriter`` (the default) is a handful of rules, no model call:

* **Standalone questions are left alone**: a question that names its own building, room id,
  error code or setting key, or that neither refers back ("it", "its", "that error",
  "there") nor trails off ("and humidity?", "what about Maple Court?"), is searched as typed.
* **Co-reference**: a question that refers back gets its first referring expression replaced
  by what the most recent earlier turn was about ("how do I fix it?" -> "how do I fix
  AB-E2044?", "its rooms" -> "Riverside Depot's rooms", "there" -> "in Riverside Depot").
* **Ellipsis**: a fragment ("what about Maple Court?", "and the other building?", "and
  humidity?") takes the previous question's predicate: the previous (standalone) question
  with its entity or sensor type swapped for the fragment's, or, with nothing to swap, the
  fragment followed by what the previous turn was about.

What a turn was about (one thing is carried, the most specific): the error codes and
setting keys its standalone question names; else the one room it typed or its successful
tool calls used (with the reading it asked for: "how did it change?" -> "how did the
humidity in room-x change?"); else the buildings it names or its tool calls used (ids turned
into names through ``known``); else the content words of its question, without a how-to's
verb (a documentation topic: "How do I create an alert rule?" -> "alert rule"). The codes
its answer names stand in where the follow-up asks about a code ("that error") or the turn
has no topic. The most recent turn that was about something wins.

Permissions: the rewriter reads nothing but the question, the caller's own earlier turns
(``PriorTurn``: stored when the caller asked them, answered as the caller) and ``known``
(the buildings the caller's own ``list_buildings`` returned in this run). A building id of an
earlier turn that is not in ``known`` (the caller lost access, or it is gone) is dropped.
Whatever it carries is then searched and resolved as the caller, like a typed question.

Plain Python, no I/O. The port is async so that a model-based rewriter can implement it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agent.small_model.entities import NamedEntity, ids_in_text, match_names
from agent.small_model.intents import sensor_type_words
from agent.turns import MAX_EARLIER, PriorTurn
from agent.words import doc_tokens

__all__ = [
    "DeterministicRewriter",
    "PassThroughRewriter",
    "QueryRewriter",
    "Rewrite",
]

MAX_WORDS = 14  # longer questions bind their own pronouns ("how do users change their ...")
MAX_FRAGMENT_WORDS = 8  # an elliptical fragment ("and the other building?") is short
MAX_TOPIC_WORDS = 6

# "that error", "this setting", "the same room": a demonstrative with a noun of the domain.
_NOUNS = (
    r"error(?:\s+code)?|code|setting|key|variable|page|section|building|room|site|sensor|"
    r"alert|rule|feature|endpoint|limit|one"
)
_REFERRING = re.compile(
    rf"\b(?P<np>(?:that|this|the\s+same)\s+(?:{_NOUNS}))\b"
    r"|\b(?P<poss>its|their)\b"
    r"|\b(?P<there>(?:in|at|from|for)\s+there)\b"
    r"|\b(?P<pron>it|they|them|those|these)\b"
    # "what does that mean?", "why is that?": a demonstrative standing for a thing
    r"|\b(?P<that>that|this)\b(?=\s+(?:mean|means|do|does|work|works|happen|happens)\b"
    r"|\s*[?.!]*\s*$)"
    r"|\b(?P<end>there)\s*[?.!]*\s*$",
    re.IGNORECASE,
)
# "and humidity?", "what about Maple Court?", "how about the other building?": a fragment.
_ELLIPSIS = re.compile(
    r"^\s*(?:(?:and|or|but|also|so|ok(?:ay)?)[,\s]+)?(?:what|how)\s+about\b[,\s]*"
    r"|^\s*(?:and|or|also|same\s+for)\b"
    r"(?![,\s]*(?:how|what|which|why|when|where|who|whose|can|could|do|does|did|is|are|was|"
    r"were|will|would|should|has|have)\b)[,\s]*",
    re.IGNORECASE,
)
_ASKS_FOR_CODE = re.compile(r"\b(?:error|code|setting|key|variable)\b", re.IGNORECASE)
_OTHER = re.compile(r"\bthe\s+other\s+(?:one|building|site)\b", re.IGNORECASE)
# Occupancy, a measurement an ellipsis swaps ("and how busy?") besides the sensor types the
# tools list (``measures``: "and humidity?").
_OCCUPANCY_WORDS = ("occupancy", "busiest", "busy")


@functools.lru_cache(maxsize=32)
def _measures(sensor_types: tuple[str, ...]) -> re.Pattern[str]:
    """The measurement words an ellipsis swaps: the sensor types as a question writes them
    (``intents.sensor_type_words``) and occupancy."""
    words = [w for kind in sensor_types for w in sensor_type_words(kind)]
    words = sorted({*words, *_OCCUPANCY_WORDS}, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b", re.IGNORECASE)


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'-]*")
# Words that say nothing about a documentation topic.
_GENERIC = frozenset(
    re.findall(
        r"\S+",
        """a an the and or but if of to in on at by for with from into about as is are was were be
    been being do does did doing have has had having i me my we our you your it its this that
    these those there here what which who whom whose when where why how can could would should
    will shall may might must not no yes so than then too very just also any all some each get
    got set up out over under again once more most much many such only own same both few other
    mean means meaning explain tell know need want please show find use used work works happen
    happens happened say says said thing things way ok okay thanks measure measures answer""",
    )
)


@dataclass(frozen=True)
class Rewrite:
    """A question and the standalone form it is searched and resolved as."""

    original: str
    query: str
    rule: str  # first_turn, standalone, coreference, ellipsis, nothing_to_carry
    carried: tuple[str, ...] = field(default=())  # what came from earlier turns

    @property
    def rewritten(self) -> bool:
        return self.query != self.original


@runtime_checkable
class QueryRewriter(Protocol):
    """Turns a follow-up into the standalone query the service searches and resolves."""

    name: str

    async def rewrite(
        self,
        question: str,
        earlier: Sequence[PriorTurn],
        *,
        known: Sequence[NamedEntity] = (),
        measures: Sequence[str] = (),
    ) -> Rewrite:
        """``earlier``: the caller's earlier turns, oldest first. ``known``: the buildings the
        caller can see now (their ``list_buildings``), to recognise and name them.
        ``measures``: the sensor types the tools list (``intents.sensor_types``)."""
        ...


class PassThroughRewriter:
    """No rewriting: every question is searched as typed (the baseline it is measured on)."""

    name = "none"

    async def rewrite(
        self,
        question: str,
        earlier: Sequence[PriorTurn],
        *,
        known: Sequence[NamedEntity] = (),
        measures: Sequence[str] = (),
    ) -> Rewrite:
        return Rewrite(question, question, "first_turn" if not earlier else "standalone")


@dataclass(frozen=True)
class _About:
    """What a turn was about: entities (codes, keys, buildings, a room id) or a topic."""

    tokens: tuple[str, ...] = ()
    buildings: tuple[str, ...] = ()
    rooms: tuple[str, ...] = ()
    topic: tuple[str, ...] = ()

    measure: str | None = None  # the sensor type or occupancy word its question asked about

    @property
    def carried(self) -> tuple[str, ...]:
        """The most specific group: its codes and keys, else its one room, else its
        buildings, else its topic ("it" is one thing: the room, not the room and its
        building)."""
        for group in (self.tokens, self.rooms, self.buildings):
            if group:
                return group
        return (" ".join(self.topic),) if self.topic else ()

    def text(self) -> str:
        return " and ".join(self.carried)


def _dedupe(items: Sequence[str]) -> tuple[str, ...]:
    seen: dict[str, str] = {}
    for item in items:
        seen.setdefault(item.casefold(), item)
    return tuple(seen.values())


class DeterministicRewriter:
    """The rules of the module docstring: no model call, microseconds per question."""

    name = "deterministic"

    async def rewrite(
        self,
        question: str,
        earlier: Sequence[PriorTurn],
        *,
        known: Sequence[NamedEntity] = (),
        measures: Sequence[str] = (),
    ) -> Rewrite:
        return self.rewrite_now(question, earlier, known=known, measures=measures)

    def rewrite_now(
        self,
        question: str,
        earlier: Sequence[PriorTurn],
        *,
        known: Sequence[NamedEntity] = (),
        measures: Sequence[str] = (),
    ) -> Rewrite:
        """``rewrite``, synchronously."""
        pattern = _measures(tuple(measures))
        turns = list(earlier)[-MAX_EARLIER:]
        if not turns:
            return Rewrite(question, question, "first_turn")
        buildings = [e for e in known if e.kind == "building"]
        # Each earlier turn as it was searched: its own standalone form, oldest first.
        standalone: list[str] = []
        for index, turn in enumerate(turns):
            previous = [
                PriorTurn(q, t.answer, t.entities)
                for q, t in zip(standalone, turns[:index], strict=True)
            ]
            standalone.append(self._one(turn.question, previous, buildings, pattern).query)
        resolved = [
            PriorTurn(q, t.answer, t.entities) for q, t in zip(standalone, turns, strict=True)
        ]
        return self._one(question, resolved, buildings, pattern)

    # --- one question against turns whose questions are already standalone ---------------

    def _one(
        self,
        question: str,
        turns: Sequence[PriorTurn],
        buildings: Sequence[NamedEntity],
        measures: re.Pattern[str],
    ) -> Rewrite:
        if not turns:
            return Rewrite(question, question, "first_turn")
        own = _own_entities(question, buildings)
        other = _other_building(question, turns, buildings)
        if other is not None:
            own = (*own, other)
        ellipsis = _ELLIPSIS.match(question)
        words = len(_WORD.findall(question))
        if ellipsis and words <= MAX_FRAGMENT_WORDS:
            return self._ellipsis(question, ellipsis.end(), own, other, turns, buildings, measures)
        if own:
            return Rewrite(question, question, "standalone")
        referring = _referring(question)
        if referring is None or words > MAX_WORDS:
            return Rewrite(question, question, "standalone")
        codes_first = bool(_ASKS_FOR_CODE.search(referring.group(0)))
        about = _latest_about(turns, buildings, measures, codes_first=codes_first)
        if about is None:
            return Rewrite(question, question, "nothing_to_carry")
        text = about.text()
        if about.rooms and about.measure and not measures.search(question):
            text = f"the {about.measure} in {text}"  # "how did it change": the reading's room
        query = _substitute(question, referring, text)
        return Rewrite(question, query, "coreference", about.carried)

    def _ellipsis(
        self,
        question: str,
        lead_end: int,
        own: Sequence[str],
        other: str | None,
        turns: Sequence[PriorTurn],
        buildings: Sequence[NamedEntity],
        measures: re.Pattern[str],
    ) -> Rewrite:
        fragment = question[lead_end:].strip().rstrip("?.! ").strip()
        if other is not None:
            fragment = _OTHER.sub(other, fragment)
        previous = turns[-1].question
        about = _latest_about(turns, buildings, measures)
        swapped = _swap(previous, fragment, own, buildings, measures)
        if swapped is not None:
            return Rewrite(question, swapped, "ellipsis", about.carried if about else ())
        if own and other is None:
            # "what about Maple Court?" with nothing of its kind to swap: the previous question
            # about this entity instead.
            query = f"{previous.rstrip('?.! ')} {fragment}?"
            return Rewrite(question, query, "ellipsis", ())
        if about is None:
            return Rewrite(question, question, "nothing_to_carry")
        query = f"{fragment} {about.text()}?" if fragment else question
        return Rewrite(question, query, "ellipsis", about.carried)


# --- the pieces ---------------------------------------------------------------------------------


def _without_ids(text: str) -> str:
    """``text`` without its ids: "rm-maple-court-server" does not name Maple Court."""
    for entity_id in ids_in_text(text):
        text = text.replace(entity_id, " ")
    return text


def _own_entities(text: str, buildings: Sequence[NamedEntity]) -> tuple[str, ...]:
    """The codes, keys, ids and building names ``text`` names itself."""
    names = [e.name for e in match_names(_without_ids(text), buildings)]
    return _dedupe([*doc_tokens(text), *ids_in_text(text), *names])


def _building_names(
    text: str, ids: Sequence[str], buildings: Sequence[NamedEntity]
) -> tuple[str, ...]:
    """The buildings ``text`` names or types by id, and the building ``ids`` a turn's tools
    used, by name where the caller's list has them; a building the caller cannot see now is
    dropped (with no list: a used id is kept as it is). Ids are opaque: a typed id is a
    building's when the caller's list holds it."""
    by_id: Mapping[str, str] = {e.entity_id: e.name for e in buildings}
    found = [e.name for e in match_names(_without_ids(text), buildings)]
    for entity_id in [*ids_in_text(text), *ids]:
        if entity_id in by_id:
            found.append(by_id[entity_id])
        elif not buildings and entity_id in ids:
            found.append(entity_id)
    return _dedupe(found)


def _about(
    turn: PriorTurn,
    buildings: Sequence[NamedEntity],
    measures: re.Pattern[str],
    *,
    codes_first: bool = False,
) -> _About:
    """What one turn (its question already standalone) was about. The codes its answer
    names count where its question names none and no topic, unless the follow-up asks about
    a code ("that error": ``codes_first``)."""
    tokens = doc_tokens(turn.question)
    named = _building_names(turn.question, turn.ids_of("building"), buildings)
    if not named and not tokens:
        named = _building_names(turn.answer, (), buildings)
    used_rooms = turn.ids_of("room")
    typed_rooms = [i for i in ids_in_text(turn.question) if i in used_rooms]
    rooms = typed_rooms or list(used_rooms)
    if len(rooms) > 1:
        rooms = []  # a whole building's rooms (occupancy of all): no one room was the subject
    measure = measures.search(turn.question)
    found = _About(
        tuple(tokens), named, _dedupe(rooms), measure=measure.group(0) if measure else None
    )
    answer_codes = tuple(doc_tokens(turn.answer)[:2])
    if codes_first and not tokens and answer_codes:
        return dataclasses.replace(found, tokens=answer_codes)
    if found.carried:
        return found
    if ids_in_text(turn.question) or turn.entity_ids:
        return _About()  # about an entity the caller cannot see now: nothing to carry
    topic = _topic(turn.question)
    return _About(topic=topic) if topic else _About(tokens=answer_codes)


# "How do I create ...", "how to add ...", "can I export ...": the word after it is a verb.
_HOW_TO = re.compile(
    r"^\s*(?:how\s+(?:do|can|should)\s+(?:i|we|you)|how\s+to|can\s+(?:i|we))\s+(\w+)", re.I
)


def _topic(question: str) -> tuple[str, ...]:
    """The content words of a question, without the verb of a how-to ("How do I create an
    alert rule?" is about an alert rule) and without ids."""
    words = [w.removesuffix("'s") for w in _WORD.findall(_without_ids(question))]
    words = [w for w in words if w.casefold() not in _GENERIC]
    how_to = _HOW_TO.match(question)
    if how_to and len(words) > 1 and words[0].casefold() == how_to.group(1).casefold():
        words = words[1:]
    return _dedupe(words)[:MAX_TOPIC_WORDS]


def _latest_about(
    turns: Sequence[PriorTurn],
    buildings: Sequence[NamedEntity],
    measures: re.Pattern[str],
    *,
    codes_first: bool = False,
) -> _About | None:
    """What the most recent turn that was about something was about."""
    for turn in reversed(turns):
        about = _about(turn, buildings, measures, codes_first=codes_first)
        if about.carried:
            return about
    return None


def _other_building(
    question: str, turns: Sequence[PriorTurn], buildings: Sequence[NamedEntity]
) -> str | None:
    """ "the other building": the one building of the caller's list that no earlier turn
    mentioned, when exactly one of two or more is left; else None."""
    if not _OTHER.search(question) or len(buildings) < 2:
        return None
    mentioned: set[str] = set()
    for turn in turns:
        mentioned.update(_building_names(turn.question, turn.ids_of("building"), buildings))
        mentioned.update(_building_names(turn.answer, (), buildings))
    left = [e.name for e in buildings if e.name not in mentioned]
    return left[0] if len(left) == 1 and mentioned else None


def _referring(question: str) -> re.Match[str] | None:
    """The first expression of ``question`` that refers back to an earlier turn. A plural
    pronoun after a plural noun of the question binds to it ("how do users change their
    password?"), not to an earlier turn."""
    for match in _REFERRING.finditer(question):
        plural = (match.group("pron") or match.group("poss") or "").casefold()
        if plural in _PLURAL_PRONOUNS and _plural_noun_before(question[: match.start()]):
            continue
        return match
    return None


_PLURAL_PRONOUNS = frozenset({"they", "them", "their", "those", "these"})


def _plural_noun_before(text: str) -> bool:
    return any(
        len(w) > 3 and w.casefold().endswith("s") and w.casefold() not in _GENERIC
        for w in _WORD.findall(text)
    )


def _substitute(question: str, match: re.Match[str], text: str) -> str:
    """``question`` with the referring expression ``match`` replaced by ``text``."""
    if match.group("poss"):
        replacement = f"{text}'s"
    elif match.group("there"):
        preposition = match.group("there").split()[0]
        replacement = f"{preposition} {text}"
    elif match.group("end"):
        replacement = f"in {text}"
        return question[: match.start()] + replacement + question[match.end("end") :]
    else:
        replacement = text
    return question[: match.start()] + replacement + question[match.end() :]


def _swap(
    previous: str,
    fragment: str,
    own: Sequence[str],
    buildings: Sequence[NamedEntity],
    measures: re.Pattern[str],
) -> str | None:
    """The previous question with its entity (or measurement) swapped for the fragment's, or
    None when the previous question holds nothing of the same kind."""
    if own:
        new = own[0]
        kind = _kind(new, buildings)
        old = [m for m in _mentions(previous, buildings) if _kind(m, buildings) == kind]
        old = [m for m in old if m.casefold() != new.casefold()]
        if not old:
            return None
        return _replace_all(previous, old, new)
    measure = measures.search(fragment)
    if measure is None:
        return None
    old_measure = measures.search(previous)
    if old_measure is None:
        return None
    # The entity stays: only the measurement changes.
    return previous[: old_measure.start()] + measure.group(0) + previous[old_measure.end() :]


def _kind(entity: str, buildings: Sequence[NamedEntity]) -> str:
    """What a mention is: a documented token, one of the caller's buildings (by name or id),
    or another id (a room's, or one the caller cannot see: ids are opaque)."""
    if doc_tokens(entity):
        return "token"
    folded = entity.casefold()
    if any(folded in (b.name.casefold(), b.entity_id.casefold()) for b in buildings):
        return "building"
    return "id" if ids_in_text(entity) else "building"


def _mentions(text: str, buildings: Sequence[NamedEntity]) -> list[str]:
    """The entities ``text`` names, as written in it."""
    found = [*doc_tokens(text), *ids_in_text(text)]
    for entity in match_names(text, buildings):
        match = re.search(re.escape(entity.name), text, re.IGNORECASE)
        if match:
            found.append(match.group(0))
    return found


def _replace_all(text: str, old: Sequence[str], new: str) -> str:
    """``text`` with the first of ``old`` replaced by ``new`` and the others by nothing."""
    first, *rest = sorted(old, key=text.find)
    text = text.replace(first, new, 1)
    for item in rest:
        text = re.sub(rf"\s*(?:and\s+)?{re.escape(item)}", "", text, count=1)
    return text
