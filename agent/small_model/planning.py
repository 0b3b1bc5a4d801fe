"""The service's first step for small models: route the question, ground its entities and
fetch documentation up front, so the model is handed a smaller, better-posed job.

Used by the loop in ``json_schema`` mode (the packaged local models); native providers keep
the plain agentic loop. Everything here runs as the asking user through the same
``ToolExecutor`` the model's calls use (Cedar, the ACL filter, the one not-found answer), so
the planner can never show a building or chunk the model could not have fetched itself.

What it does, in order:

1. ``list_buildings`` as the caller (a lookup, not shown to the model), to match the
   building names the question mentions; ids the question types count as entities too.
2. A documentation search with the question, unless it is a greeting or names entities
   without a documented token, to score how well the documentation covers it.
3. ``routing.route`` on those signals.
4. For live data: for each named building (at most ``MAX_GROUNDED``), ``get_building`` (its
   rooms and their ids) runs as a visible tool step, then the one measurement the question
   clearly asks for (``agent.small_model.intents``); the model starts from the ids and the figures
   instead of guessing them. For documentation: the
   search becomes a visible ``search_docs`` step holding only the best few chunks, trimmed
   to the sentences that match.

Visible steps appear in the tool trace and as ``tool`` events, exactly like the model's own
calls. The lookup of step 1 appears in the trace only when the grounding used it (a building
matched); its result never reaches the model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from agent.answer import AgentEvent, ProgressEvent, ToolEvent
from agent.llm.base import Message, ToolCall, ToolSpec
from agent.progress import tool_started
from agent.prompts import IDK_MARKER
from agent.run_state import Run, tool_trace
from agent.small_model.composing import compose_greeting, compose_live
from agent.small_model.entities import (
    KnownEntities,
    NamedEntity,
    match_names,
    named_buildings,
    named_rooms,
)
from agent.small_model.followups import DeterministicRewriter, QueryRewriter, Rewrite
from agent.small_model.intents import LiveIntent, sensor_types
from agent.small_model.reading import QuestionReading
from agent.small_model.reference import compose_reference
from agent.small_model.routing import (
    DOC_SIMILARITY,
    Route,
    RouteDecision,
    RouteSignals,
)
from agent.small_model.routing import route as decide_route
from agent.tools.executor import ToolExecutor
from agent.tools.registry import ToolOutcome, result_of
from agent.tools.search_docs import SearchDocs
from agent.tools.sensor import GetLatestSensorData, GetSensorHistory, ListSensors
from agent.tools.twin import (
    MAX_OCCUPANCY_ROOMS,
    GetBuilding,
    GetRoom,
    GetRoomOccupancy,
    ListBuildings,
)
from agent.turns import PriorTurn
from agent.words import content_words
from retrieval.search import SearchHit

__all__ = [
    "MAX_GROUNDED",
    "Plan",
    "Planner",
    "compact_hits",
    "offered_tools",
]

MAX_GROUNDED = 2  # named buildings resolved up front (their rooms go to the model)
DOC_HITS_SHOWN = 3  # chunks of the up-front search the model sees
SNIPPET_CHARS = 360  # the best chunk, after trimming to the matching sentences (prompt tokens)
RUNNER_UP_CHARS = 200  # each further chunk: usually context, rarely the answer

LIVE_KINDS = ("building", "room")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


# A question naming a building is also about a page that names it (``_page_about``) when it
# asks at least PAGE_MIN_WORDS content words besides the name and a live reading, and the
# page covers PAGE_COVERAGE of them. Fitted on the golden set before its dev/test split
# (2026-12-04, ``agent-service bench router``, now on dev): a paraphrase of a site's rules
# page asks 14 such words and its page covers 0.43 of them; "How busy is <building> right
# now?" asks none, "How full is <building> at the moment?" one. Refit on dev only.
PAGE_MIN_WORDS = 3
PAGE_COVERAGE = 0.25


@dataclass(frozen=True)
class Plan:
    """What the loop offers the model for this question: the route, the tools, and which
    entity kinds its id arguments are limited to (``Run.entities``)."""

    decision: RouteDecision
    tools: tuple[ToolSpec, ...]
    constrained_kinds: tuple[str, ...] = (*LIVE_KINDS, "chunk")
    # Written by the service from the visible steps (``agent.small_model.composing``): the
    # loop uses it, once grounded, instead of calling the model. None: the model answers.
    answer: str | None = None
    # The question as it was searched and resolved (``agent.small_model.followups``): a follow-up's
    # standalone form. None: the question as asked (no earlier turns).
    rewrite: Rewrite | None = None


def _trim(reading: QuestionReading, text: str, limit: int = SNIPPET_CHARS) -> str:
    """The chunk's sentences that match the question best (at least half the best match),
    best first, then the sentence after each one kept (where an explanation usually follows
    its keyword), in their order, within ``limit`` characters; the opening sentences when
    none matches. A matching sentence goes before any follower: "the cooldown ... will not
    notify again" answers "what does it do" better than the line after "15 minutes"."""
    sentences = [s.strip() for s in _SENTENCE.split(text) if s.strip()]
    if sum(len(s) + 1 for s in sentences) <= limit:
        return " ".join(sentences)
    scores = [reading.coverage(sentence) for sentence in sentences]
    best = max(scores)
    ranked = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))
    matching = [i for i in ranked if best > 0 and scores[i] >= best / 2] or [0]
    keep: list[int] = []
    used = 0

    def fit(index: int) -> None:
        nonlocal used
        if index in keep or index >= len(sentences):
            return
        if used + len(sentences[index]) > limit and keep:
            return
        keep.append(index)
        used += len(sentences[index]) + 1

    for index in matching:
        fit(index)
    for index in [i for i in matching if i in keep]:
        fit(index + 1)
    return _clip(" ".join(sentences[i] for i in sorted(keep)), limit + 40)


def _clip(text: str, limit: int) -> str:
    """``text`` cut at the last word boundary within ``limit``, marked with an ellipsis: a
    small model copies a snippet cut mid-word into its answer as it is."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    sentence_end = max(head.rfind(". "), head.rfind("; "))
    if sentence_end > limit // 2:  # a whole clause or sentence is worth more than a fragment
        return head[: sentence_end + 1] + " …"
    return head.rsplit(" ", 1)[0].rstrip(" ,;:") + " …"


def compact_hits(reading: QuestionReading, hits: Sequence[SearchHit], labels: Sequence[str]) -> str:
    """The search result the model sees: the best chunks, trimmed, each on one line after its
    label and section (plain text: JSON quoting would cost a small model's prompt ~15 tokens
    a chunk; a label is cited in one token, an id in about seven)."""
    lines = [
        f"[{label}] {hit.section}: "
        f"{_trim(reading, hit.text, SNIPPET_CHARS if rank == 0 else RUNNER_UP_CHARS)}"
        for rank, (hit, label) in enumerate(zip(hits[:DOC_HITS_SHOWN], labels, strict=False))
    ]
    return "\n".join(lines) if lines else "No documentation matched."


def _reminder(question: str, decision: RouteDecision, searched: str | None = None) -> str:
    if decision.wants_docs and not decision.wants_live:
        use = (
            "Answer only what it asks, in one or two short sentences, from the results "
            "above; sources: the number in brackets of each result you used."
        )
    else:
        use = (
            "Answer it in one or two sentences from the results above: say plainly what they "
            "show (including that a building or room was not found, that no sensor is "
            "installed, or that a reading is missing or offline)."
        )
    asked = f"The question was: {question}\n"
    if searched is not None:  # a follow-up: what it was understood as
        asked += f"(A follow-up, looked up as: {searched})\n"
    return f"{asked}{use} Call another tool only if you still need data."


def _names(hit: SearchHit, token: str) -> bool:
    """Whether the chunk's text or its section heading holds ``token`` (an error code's
    reference entry names it in its heading only: "AB-E2012 – No data yet")."""
    token = token.casefold()
    return token in hit.text.casefold() or token in hit.section.casefold()


def _defining_first(hits: Sequence[SearchHit], tokens: Sequence[str]) -> tuple[SearchHit, ...]:
    """The hits whose section heading names one of the tokens first (the token's own entry,
    not a page that mentions it in passing), otherwise in the search's order."""
    defining = [h for h in hits if any(t.casefold() in h.section.casefold() for t in tokens)]
    return (*defining, *(h for h in hits if h not in defining))


def _page_about(reading: QuestionReading, hits: Sequence[SearchHit]) -> bool:
    """A chunk close to the question names one of its buildings and covers what the question
    asks besides the name and a live reading ("the forklift-shift limit of Dock Hall B at
    Harbor" and Harbor's rules page), not merely the name ("how busy is Riverside Depot
    right now" against the page's "ask ... the capacity of Dock Hall B right now")."""
    words = reading.asks_beyond_names
    if len(words) < PAGE_MIN_WORDS:
        return False
    texts = [
        f"{hit.title or ''} {hit.section} {hit.text}"
        for hit in hits
        if (hit.similarity or 0.0) >= DOC_SIMILARITY
    ]
    return any(
        match_names(text, reading.buildings)
        and len(words & content_words(text)) / len(words) >= PAGE_COVERAGE
        for text in texts
    )


class Planner:
    """Builds the ``Plan`` of one run and adds its visible steps to the run."""

    def __init__(
        self,
        tools: ToolExecutor,
        *,
        compose: bool = False,
        rewriter: QueryRewriter | None = None,
        earlier: Sequence[PriorTurn] = (),
    ) -> None:
        self.tools = tools
        self.compose = compose  # write settled answers (greetings, live data, entries) here
        self.rewriter = rewriter or DeterministicRewriter()
        self.earlier = tuple(earlier)  # the caller's earlier turns of the conversation
        self.entities = KnownEntities()  # the ids resolved so far (what id arguments may name)
        self.source_labels: dict[str, str] = {}  # label -> id of each chunk shown
        self._calls = 0
        self._steps: list[tuple[ToolCall, Message]] = []  # visible steps not yet in messages
        self._shown: list[ToolOutcome] = []  # every visible step's outcome, in order
        self._docs: list[SearchHit] = []  # the documentation chunks shown, in order
        self._intent = LiveIntent()
        self._specs: tuple[ToolSpec, ...] = ()  # the tools offered this run
        self._rest = ""  # the question without the names and ids it mentions

    async def plan(
        self, run: Run, question: str, specs: Sequence[ToolSpec]
    ) -> AsyncIterator[AgentEvent | Plan]:
        """Yields a ``tool`` event per visible step, then the ``Plan``. A follow-up is
        searched and resolved as its standalone form (``agent.small_model.followups``): from here on
        ``question`` is that form, ``asked`` the question as the user typed it."""
        self._specs = tuple(specs)
        names = {spec.name for spec in specs}
        entities = self.entities
        lookup: ToolOutcome | None = None
        buildings: list[NamedEntity] = []
        if ListBuildings.name in names:
            lookup, buildings = await self._buildings(run)
        types = sensor_types(specs)
        rewrite = await self._rewrite(run, question, buildings, types)
        reading = QuestionReading.of(rewrite.query if rewrite else question, buildings, types)
        async for looked_up in self._resolve(run, reading, names):
            if isinstance(looked_up, QuestionReading):
                reading = looked_up
            else:
                yield looked_up
        entities.add_ids(reading.typed_ids, LIVE_KINDS)
        named, tokens = list(reading.buildings), reading.tokens
        search: ToolOutcome | None = None
        if SearchDocs.name in names and not reading.greeting:
            # A documented token finds its own section best on its own (keyword search);
            # the whole sentence buries it under the question's common words. A question
            # naming entities is searched too: a page about them ("the forklift-shift
            # limit of Dock Hall B") makes it both, not live data alone.
            query = " ".join(tokens) if tokens else reading.text
            search = await self._execute(run, SearchDocs.name, {"query": query[:500]})
        if search is not None and search.ok and tokens:
            search = dataclasses.replace(search, chunks=_defining_first(search.chunks, tokens))
        hits = list(search.chunks) if search is not None and search.ok else []
        signals = RouteSignals(
            greeting=reading.greeting,
            entities=len(named) + len(entities.ids.get("building", {})),
            doc_tokens_found=any(_names(hit, token) for token in tokens for hit in hits),
            doc_tokens=bool(tokens),
            doc_coverage=max((reading.coverage(hit.text) for hit in hits), default=0.0),
            doc_similarity=max((hit.similarity or 0.0 for hit in hits), default=0.0),
            doc_names_entity=_page_about(reading, hits),
            building_list=lookup is not None and lookup.ok and reading.asks_for_buildings,
            product_words=reading.product_words,
            live_words=reading.live_words,
        )
        decision = decide_route(signals)
        run.notes.append(f"route: {decision.route} ({decision.why})")
        yield ProgressEvent(stage="route", route=decision.route)
        if decision.wants_live:
            grounded: list[tuple[NamedEntity, list[NamedEntity]]] = []
            if signals.building_list and not named and lookup is not None:
                yield self._show_lookup(run, lookup)
            if named and lookup is not None:
                yield self._traced_lookup(run, lookup)
            known = {building.entity_id for building in named}
            typed = [NamedEntity("building", i, i) for i in reading.typed_buildings]
            typed = [b for b in typed if b.entity_id not in known]
            for building in (named + typed)[:MAX_GROUNDED]:
                async for item in self._ground(run, building):
                    if isinstance(item, list):
                        grounded.append((building, item))
                    else:
                        yield item
            async for event in self._measure(run, reading, grounded):
                yield event
        if decision.wants_docs and search is not None and (hits or search.ok):
            yield self._show_docs(run, search, reading)  # none found: shown as such
        searched = reading.text if rewrite is not None and rewrite.rewritten else None
        self._flush(run, question, decision, searched)
        answer = self._composed(reading, signals, decision)
        yield Plan(decision, offered_tools(decision.route, specs), answer=answer, rewrite=rewrite)

    async def _rewrite(
        self,
        run: Run,
        question: str,
        buildings: Sequence[NamedEntity],
        types: Sequence[str],
    ) -> Rewrite | None:
        """The follow-up's standalone form (None: no earlier turns), noted on the run."""
        if not self.earlier:
            return None
        rewrite = await self.rewriter.rewrite(
            question, self.earlier, known=buildings, measures=types
        )
        if rewrite.rewritten:
            carried = ", ".join(rewrite.carried) or "the previous question"
            run.notes.append(
                f"follow-up searched as: {rewrite.query!r} ({rewrite.rule}; from the "
                f"conversation: {carried})"
            )
        return rewrite

    async def _resolve(
        self, run: Run, reading: QuestionReading, names: set[str]
    ) -> AsyncIterator[ToolEvent | QuestionReading]:
        """The kind of each id the question types without saying what it is, looked up as
        the caller (ids are opaque): a room when ``get_room`` finds it (the lookup is in the
        trace), else a building (grounded like one: an unknown id gets its not-found answer).
        Yields the lookups' ``tool`` events, then the resolved reading."""
        rooms: list[str] = []
        buildings: list[str] = []
        for entity_id in reading.unresolved_ids[:MAX_GROUNDED]:
            lookup = None
            if GetRoom.name in names:
                lookup = await self._execute(run, GetRoom.name, {"room_id": entity_id})
            if lookup is not None and lookup.ok:
                rooms.append(entity_id)
                yield self._traced_lookup(run, lookup)
            else:
                buildings.append(entity_id)
        yield reading.resolved(rooms, buildings) if rooms or buildings else reading

    def _composed(
        self, reading: QuestionReading, signals: RouteSignals, decision: RouteDecision
    ) -> str | None:
        """The answer the visible steps settle (``agent.small_model.composing``), where
        composing is on."""
        if not self.compose:
            return None
        if decision.route == "greeting":
            return compose_greeting(reading.text, reading.sensor_types)
        if decision.idk:
            return IDK_MARKER  # the caller's documentation does not hold what it asks
        if decision.route == "documentation":
            return compose_reference(reading.text, self._docs)
        if decision.route != "live_data":
            return None
        return compose_live(
            self._rest or reading.text,
            self._intent,
            self._shown,
            building_list=signals.building_list,
            sensor_types=reading.sensor_types,
        )

    # --- the lookups --------------------------------------------------------------------------

    def _call(self, name: str, arguments: dict[str, object]) -> ToolCall:
        self._calls += 1
        return ToolCall(f"plan_{self._calls}", name, json.dumps(arguments))

    async def _execute(self, run: Run, name: str, arguments: dict[str, object]) -> ToolOutcome:
        return await self.tools.execute(self._call(name, arguments), run.request)

    async def _visible(
        self, run: Run, name: str, arguments: dict[str, object]
    ) -> AsyncIterator[AgentEvent | ToolOutcome]:
        """A step the model will see: ``tool_started``, the ``tool`` event, then the outcome."""
        call = self._call(name, arguments)
        yield tool_started(call)
        outcome = await self.tools.execute(call, run.request)
        self.entities.add_result(outcome.result_json)
        self._shown.append(outcome)
        yield self._record(run, outcome, outcome.result_json)
        yield outcome

    async def _buildings(self, run: Run) -> tuple[ToolOutcome, list[NamedEntity]]:
        """The caller's buildings (``list_buildings`` as the caller), to match names."""
        outcome = await self._execute(run, ListBuildings.name, {})
        listing = result_of(outcome, ListBuildings)
        return outcome, named_buildings(listing) if listing is not None else []

    def _show_lookup(self, run: Run, lookup: ToolOutcome) -> ToolEvent:
        """The building list as a visible step: it is the answer to "which buildings"."""
        self.entities.add_result(lookup.result_json)
        self._shown.append(lookup)
        return self._record(run, lookup, lookup.result_json)

    @staticmethod
    def _traced_lookup(run: Run, lookup: ToolOutcome) -> ToolEvent:
        """The name lookup the grounding used: in the trace (it ran, as the caller, and the
        answer rests on it), not in the model's messages (get_building shows the building)."""
        trace = tool_trace(lookup)
        run.traces.append(trace)
        return ToolEvent(call=trace)

    # --- the visible steps --------------------------------------------------------------------

    def _record(self, run: Run, outcome: ToolOutcome, content: str) -> ToolEvent:
        call = ToolCall(outcome.call_id, outcome.name, json.dumps(outcome.arguments))
        self._steps.append((call, Message("tool", content, tool_call_id=call.id, name=call.name)))
        trace = tool_trace(outcome)
        run.traces.append(trace)
        return ToolEvent(call=trace)

    def _flush(
        self, run: Run, question: str, decision: RouteDecision, searched: str | None = None
    ) -> None:
        """The visible steps as ONE assistant turn and its results (one results block for
        the model, fewer tokens), then the question again: a small model that reads long
        results forgets what was asked and answers IDK."""
        if not self._steps:
            return
        calls = tuple(call for call, _ in self._steps)
        run.messages.append(Message("assistant", None, tool_calls=calls))
        run.messages.extend(result for _, result in self._steps)
        run.messages.append(Message("user", _reminder(question, decision, searched)))
        self._steps.clear()

    async def _ground(
        self, run: Run, building: NamedEntity
    ) -> AsyncIterator[AgentEvent | list[NamedEntity]]:
        """The building's visible step (its details and rooms); then its rooms."""
        self.entities.add("building", building.entity_id)
        rooms: list[NamedEntity] = []
        arguments: dict[str, object] = {"building_id": building.entity_id}
        async for item in self._visible(run, GetBuilding.name, arguments):
            if not isinstance(item, ToolOutcome):
                yield item
            elif (details := result_of(item, GetBuilding)) is not None:
                rooms = named_rooms(details)
        yield rooms

    async def _measure(
        self,
        run: Run,
        reading: QuestionReading,
        grounded: list[tuple[NamedEntity, list[NamedEntity]]],
    ) -> AsyncIterator[AgentEvent]:
        """The one measurement the question clearly asks for, on the rooms it names (or all
        rooms of the building, for occupancy); a named room's details (``get_room``) when it
        asks for no measurement; nothing when the intent is unclear."""
        all_rooms = [room for _, rooms in grounded for room in rooms]
        named = reading.rooms_named(all_rooms)[:MAX_GROUNDED]
        self._rest, intent = reading.intent([e.name for e in (*named, *(b for b, _ in grounded))])
        self._intent = intent
        calls: list[tuple[str, dict[str, object]]] = []
        if intent.occupancy:
            calls = self._occupancy(named, grounded, all_rooms)
        elif intent.inventory:
            for building, rooms in grounded:
                args: dict[str, object] = {"building_id": building.entity_id}
                in_building = [room for room in named if room in rooms]
                if in_building:
                    args["room_id"] = in_building[0].entity_id
                calls.append((ListSensors.name, args))
        elif intent.reading or intent.history_hours:
            for room in named:
                args = {"room_id": room.entity_id}
                if intent.sensor_type:
                    args["sensor_type"] = intent.sensor_type
                if intent.history_hours and intent.sensor_type:
                    calls.append((GetSensorHistory.name, {**args, "hours": intent.history_hours}))
                else:
                    calls.append((GetLatestSensorData.name, args))
        elif intent.details or intent.sensor_type is None:  # a room's floor, capacity, type
            calls = [(GetRoom.name, {"room_id": room.entity_id}) for room in named]
        for name, arguments in calls:
            async for item in self._visible(run, name, arguments):
                if not isinstance(item, ToolOutcome):
                    yield item

    def _occupancy(
        self,
        named: Sequence[NamedEntity],
        grounded: Sequence[tuple[NamedEntity, list[NamedEntity]]],
        all_rooms: Sequence[NamedEntity],
    ) -> list[tuple[str, dict[str, object]]]:
        """How busy the question's place is: one building and no room named, with a tool
        that answers occupancy for a building id alone (``ToolSpec.answers``): that tool;
        else the named rooms', or every grounded room's, occupancy."""
        if not named and len(grounded) == 1:
            for spec in self._specs:
                kinds = dict(spec.entity_arguments)
                if "occupancy" in spec.answers and list(kinds.values()) == ["building"]:
                    return [(spec.name, {next(iter(kinds)): grounded[0][0].entity_id})]
        ids = [room.entity_id for room in (named or all_rooms)][:MAX_OCCUPANCY_ROOMS]
        return [(GetRoomOccupancy.name, {"room_ids": ids})] if ids else []

    def _show_docs(self, run: Run, search: ToolOutcome, reading: QuestionReading) -> ToolEvent:
        """The up-front search as a visible ``search_docs`` step holding only the chunks
        shown (the only ones the answer may cite)."""
        shown = list(search.chunks[:DOC_HITS_SHOWN])
        run.seen_chunks.add(shown)
        self._docs = shown
        labels = []
        for hit in shown:
            self.entities.add("chunk", hit.chunk_id)
            label = str(len(self.source_labels) + 1)
            self.source_labels[label] = hit.chunk_id
            labels.append(label)
        visible = dataclasses.replace(search, chunks=tuple(shown))
        return self._record(run, visible, compact_hits(reading, shown, labels))


def offered_tools(route: Route, specs: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    """The tools a route offers the model (the warm-up reads the answer prompts built from
    them: ``Agent.warm_up``)."""
    if route == "greeting":
        return ()
    if route == "documentation":  # another search, nothing live
        return tuple(spec for spec in specs if spec.name == SearchDocs.name)
    if route in ("live_data", "open"):
        # open: the service's search with the whole question already matched poorly; a
        # second search by the small model found weak chunks it answered from anyway
        # ("switch to dark mode under Settings > Appearance"), so it may decline, say it
        # does not know, or use the live-data tools.
        return tuple(spec for spec in specs if spec.name != SearchDocs.name)
    return tuple(specs)
