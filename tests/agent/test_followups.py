"""Follow-ups searched and resolved as standalone questions (``agent.small_model.followups``, issue
17 item 3): the rewriter's rules on their own, then two-turn threads through the real loop (the
planner, the eight tools over the in-process simulators, a fake retriever that records what it was
asked) where the second turn's search and grounding use the rewritten question, and the model still
gets the question as typed."""

from __future__ import annotations

import re
from typing import Any

import pytest
from agent_helpers import ACME_STAFF, NORTHWIND_STAFF, FakeRetriever, hit

from agent.answer import AgentAnswer
from agent.llm.base import Message
from agent.loop import Agent
from agent.small_model.entities import NamedEntity
from agent.small_model.followups import (
    DeterministicRewriter,
    PassThroughRewriter,
    QueryRewriter,
    Rewrite,
)
from agent.small_model.intents import sensor_types
from agent.small_model.strategy import SmallModelStrategy
from agent.testing import ScriptedModel, text_reply
from agent.turns import PriorTurn, history_messages, prior_turn, without_markers
from foundation.observability import attributes as attr
from foundation.records import EntityRefOut, ToolCallTrace
from tests.shipped_tools import shipped_registry

HARBOR = NamedEntity("building", "bld-northwind-harbor", "Harbor Warehouse")
NW_HQ = NamedEntity("building", "bld-northwind-hq", "Northwind HQ")
NORTHWIND = (HARBOR, NW_HQ)
ACME = (
    NamedEntity("building", "bld-acme-tower", "Acme Tower"),
    NamedEntity("building", "bld-acme-labs", "Acme Labs"),
)
CV_E1033 = PriorTurn("What does CV-E1033 mean?", "CV-E1033 is clock skew: the ts is off.")

rewriter = DeterministicRewriter()
SENSOR_TYPES = sensor_types(shipped_registry().specs())  # the shipped tools' sensor types


def rewrite(question: str, *earlier: PriorTurn, known: tuple[NamedEntity, ...] = ()) -> Rewrite:
    return rewriter.rewrite_now(question, earlier, known=known, measures=SENSOR_TYPES)


# --- the rules -------------------------------------------------------------------------------


def test_it_is_a_query_rewriter_port() -> None:
    assert isinstance(rewriter, QueryRewriter)
    assert isinstance(PassThroughRewriter(), QueryRewriter)


@pytest.mark.parametrize(
    "question",
    [
        "How long is the occupancy alert cooldown?",
        "Is there a way to export reports?",  # an existential "there" refers to nothing
        "How do users change their password?",  # "their" binds to "users"
        "How do I make sure that alerts reach the on-call phone?",  # "that" joins a clause
        "What does CV-E1014 mean?",  # its own error code
        "How busy is Northwind HQ right now?",  # its own building
        "Which sensors are installed in room room-harbor-cold-store?",  # its own room id
        "Thanks, that helps!",
    ],
)
def test_a_standalone_question_is_left_unchanged(question: str) -> None:
    earlier = PriorTurn(
        "How busy is Harbor Warehouse?", "It is at 40%.", (("building", HARBOR.entity_id),)
    )
    result = rewrite(question, earlier, CV_E1033, known=NORTHWIND)
    assert result.query == question
    assert not result.rewritten
    assert result.carried == ()


def test_a_first_question_is_never_rewritten() -> None:
    result = rewrite("How do I fix it?")
    assert (result.query, result.rule) == ("How do I fix it?", "first_turn")


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("How do I fix it?", "How do I fix CV-E1033?"),
        ("what does that error mean for my gateway?", "what does CV-E1033 mean for my gateway?"),
        ("and CV-E1014?", "What does CV-E1014 mean?"),  # ellipsis: the code swapped
        ("what does that mean for my gateway?", "what does CV-E1033 mean for my gateway?"),
        ("Why is that?", "Why is CV-E1033?"),
    ],
)
def test_an_error_code_is_carried(question: str, expected: str) -> None:
    assert rewrite(question, CV_E1033).query == expected


def test_an_error_code_named_only_in_the_answer_is_carried_for_that_error() -> None:
    """The answer's code where the follow-up asks about a code ("that error"); otherwise the
    earlier question's topic (an answer may name codes in passing)."""
    earlier = PriorTurn(
        "Why does ingestion reject my readings?", "They were rejected with CV-E1033 (clock skew)."
    )
    assert rewrite("How do I fix that error?", earlier).query == "How do I fix CV-E1033?"
    assert rewrite("How do I fix it?", earlier).query == "How do I fix ingestion reject readings?"


def test_a_building_is_carried_by_name_from_the_turn_or_its_tool_calls() -> None:
    by_name = PriorTurn("How busy is Harbor Warehouse?", "40% of capacity.")
    by_call = PriorTurn(
        "How busy is bld-northwind-harbor?", "40%.", (("building", HARBOR.entity_id),)
    )
    for earlier in (by_name, by_call):
        result = rewrite("and which of its rooms has a CO2 sensor?", earlier, known=NORTHWIND)
        assert result.query == "and which of Harbor Warehouse's rooms has a CO2 sensor?"
        assert (result.rule, result.carried) == ("coreference", ("Harbor Warehouse",))
    there = rewrite("How many people are there?", by_name, known=NORTHWIND)
    assert there.query == "How many people are in Harbor Warehouse?"


def test_ellipsis_takes_the_previous_predicate() -> None:
    busy = PriorTurn(
        "How busy is Acme Tower right now?", "Busy.", (("building", "bld-acme-tower"),)
    )
    assert rewrite("what about Acme Labs?", busy, known=ACME).query == (
        "How busy is Acme Labs right now?"
    )
    assert rewrite("and the other building?", busy, known=ACME).query == (
        "How busy is Acme Labs right now?"
    )
    temperature = PriorTurn(
        "What is the temperature in room room-harbor-cold-store?",
        "4 °C.",
        (("room", "room-harbor-cold-store"),),
    )
    assert rewrite("and humidity?", temperature, known=NORTHWIND).query == (
        "What is the humidity in room room-harbor-cold-store?"
    )


def test_the_other_building_needs_exactly_one_left() -> None:
    busy = PriorTurn("How busy is Acme Tower?", "Busy.")
    three = (*ACME, NamedEntity("building", "bld-x", "Some Depot"))
    result = rewrite("and the other building?", busy, known=three)
    assert "Acme Labs" not in result.query and "Some Depot" not in result.query


def test_a_documentation_topic_is_carried_when_no_entity_is() -> None:
    earlier = PriorTurn("How do I set up an occupancy alert?", "Open Alerts and ...")
    result = rewrite("how often will it notify me?", earlier)
    assert result.query == "how often will occupancy alert notify me?"
    assert result.carried == ("occupancy alert",)


def test_a_three_turn_thread_carries_through_the_middle_turn() -> None:
    """The second turn's standalone form is what the third refers back to."""
    first = PriorTurn("How busy is Harbor Warehouse?", "40%.", (("building", HARBOR.entity_id),))
    second = PriorTurn("and which of its rooms has a CO2 sensor?", "Loading Dock A.")
    result = rewrite("is it currently reporting?", first, second, known=NORTHWIND)
    assert "Harbor Warehouse" in result.query


def test_the_newest_turn_that_was_about_something_wins() -> None:
    older = PriorTurn("How busy is Harbor Warehouse?", "40%.", (("building", HARBOR.entity_id),))
    newer = PriorTurn("What does CV-E1033 mean?", "Clock skew.")
    assert rewrite("How do I fix it?", older, newer, known=NORTHWIND).query == (
        "How do I fix CV-E1033?"
    )


# --- what may be carried: only the caller's own turns --------------------------------------


def _words(text: str) -> set[str]:
    return {w.casefold() for w in re.findall(r"[\w-]+", text)}


@pytest.mark.parametrize(
    ("question", "earlier"),
    [
        ("How do I fix it?", (CV_E1033,)),
        ("and which of its rooms has a CO2 sensor?", (PriorTurn("How busy is Harbor Warehouse?"),)),
        ("and the other building?", (PriorTurn("How busy is Harbor Warehouse right now?"),)),
        ("how often will it notify me?", (PriorTurn("How do I set up an occupancy alert?"),)),
        ("and humidity?", (PriorTurn("What is the temperature in room room-harbor-dock-a?"),)),
    ],
)
def test_a_rewrite_holds_only_words_of_the_question_the_turns_and_the_callers_list(
    question: str, earlier: tuple[PriorTurn, ...]
) -> None:
    result = rewrite(question, *earlier, known=NORTHWIND)
    assert result.rewritten
    seen = _words(question) | {w for t in earlier for w in _words(f"{t.question} {t.answer}")}
    seen |= {w for e in NORTHWIND for w in _words(e.name)}
    assert _words(result.query) <= seen | {"in", "s"}


def test_a_building_the_caller_cannot_see_now_is_not_carried() -> None:
    """An earlier turn's building id missing from the caller's own list (access lost, or an
    id the caller typed that is not theirs) is dropped, and nothing else stands in for it."""
    earlier = PriorTurn(
        "How busy is bld-acme-tower?", "No such building.", (("building", "bld-acme-tower"),)
    )
    result = rewrite("and how many floors does it have?", earlier, known=NORTHWIND)
    assert result.query == "and how many floors does it have?"
    assert result.rule == "nothing_to_carry"
    assert rewrite("the other building", earlier, known=NORTHWIND).query == "the other building"


def test_failed_tool_calls_carry_no_ids() -> None:
    def call(ok: bool, *entities: tuple[str, str]) -> ToolCallTrace:
        arguments = {kind: entity_id for kind, entity_id in entities}
        refs = tuple(EntityRefOut(kind=kind, id=entity_id) for kind, entity_id in entities)
        return ToolCallTrace(name="t", arguments=arguments, ok=ok, duration_ms=1, entities=refs)

    turn = prior_turn(
        "q",
        "a",
        [
            call(False, ("building", "bld-acme-tower")),  # not found as the caller
            call(True, ("building", "bld-northwind-harbor")),
            call(True, ("room", "room-harbor-dock-a"), ("room", "room-harbor-dock-b")),
        ],
    )
    assert turn.entity_ids == ("bld-northwind-harbor", "room-harbor-dock-a", "room-harbor-dock-b")


def test_the_models_history_is_derived_from_the_turns() -> None:
    """One list of turns in (``AgentRequest.earlier``); the model's messages come from it."""
    history = (
        Message("user", "What does CV-E1033 mean?"),
        Message("assistant", "Clock skew."),
        Message("user", "And CV-E1014?"),
        Message("assistant", "No readings yet."),
    )
    turns = (
        PriorTurn("What does CV-E1033 mean?", "Clock skew."),
        PriorTurn("And CV-E1014?", "No readings yet."),
    )
    assert history_messages(turns, max_tokens=None) == history


# --- two-turn threads through the loop --------------------------------------------------------

DOC_HITS = [
    hit(
        "c-skew",
        "CV-E1033 – Clock skew. The reading's ts differs from server time. Fix: enable NTP.",
        source="developer/error-codes.md",
    )
]


def _planning_agent(make_local_agent: Any, model: ScriptedModel, **overrides: Any) -> Agent:
    agent: Agent = make_local_agent(model, plan_first="on", **overrides)
    return agent


def _turn(question: str, answer: AgentAnswer) -> PriorTurn:
    return prior_turn(question, answer.answer, answer.tool_calls)


async def test_a_documentation_follow_up_searches_the_rewritten_query(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    retriever.hits = list(DOC_HITS)
    model = ScriptedModel(
        text_reply("CV-E1033 means clock skew. [^c-skew]"),
        text_reply("Enable NTP on the gateway. [^c-skew]"),
        tool_calling_mode="json_schema",
    )
    agent = _planning_agent(make_local_agent, model)
    first = await agent.answer("What does CV-E1033 mean?", ACME_STAFF)
    # What the model is shown of turn 1: its question, its answer without citation markers.
    history = (
        Message("user", "What does CV-E1033 mean?"),
        Message("assistant", without_markers(first.answer)),
    )
    second = await agent.answer(
        "How do I fix it?", ACME_STAFF, earlier=[_turn("What does CV-E1033 mean?", first)]
    )
    queries = [call["query"] for call in retriever.calls]
    assert queries == ["CV-E1033", "CV-E1033"]  # the code, as the planner searches a code
    assert "How do I fix it?" not in queries
    search = [t for t in second.tool_calls if t.name == "search_docs"]
    assert search and search[0].arguments == {"query": "CV-E1033"}  # shown in the trace
    assert any("follow-up searched as: 'How do I fix CV-E1033?'" in n for n in second.notes)
    # The model still gets the question as typed (after the history), and what it was
    # looked up as.
    messages = model.requests[-1].messages
    assert messages[1:3] == history
    assert messages[3] == Message("user", "How do I fix it?")
    assert "looked up as: How do I fix CV-E1033?" in (messages[-1].content or "")
    assert second.citations and second.citations[0].source == "developer/error-codes.md"


async def test_without_a_rewriter_the_follow_up_is_searched_as_typed(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    """The baseline the bench compares with: the same thread, ``PassThroughRewriter``."""
    retriever.hits = list(DOC_HITS)
    model = ScriptedModel(text_reply("I don't know."), tool_calling_mode="json_schema")
    agent = _planning_agent(make_local_agent, model)
    assert isinstance(agent.strategy, SmallModelStrategy)
    agent.strategy.rewriter = PassThroughRewriter()
    await agent.answer("How do I fix it?", ACME_STAFF, earlier=[CV_E1033])
    assert [call["query"] for call in retriever.calls] == ["How do I fix it?"]


async def test_a_live_data_follow_up_grounds_the_carried_building(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    """Turn 1 names Harbor Warehouse; turn 2 ("its rooms") is grounded on it: get_building and
    list_sensors for its id, composed by the service, no documentation search for the raw
    follow-up."""
    model = ScriptedModel(tool_calling_mode="json_schema")  # both answers are composed
    agent = _planning_agent(make_local_agent, model)
    question = "How busy is Harbor Warehouse right now?"
    first = await agent.answer(question, NORTHWIND_STAFF)
    assert any(t.name == "get_room_occupancy" for t in first.tool_calls)
    follow_up = "and which of its rooms has a CO2 sensor?"
    second = await agent.answer(
        follow_up,
        NORTHWIND_STAFF,
        earlier=[_turn(question, first)],
    )
    calls = {t.name: t.arguments for t in second.tool_calls}
    assert calls["get_building"] == {"building_id": "bld-northwind-harbor"}
    assert calls["list_sensors"] == {"building_id": "bld-northwind-harbor"}
    assert all(call["query"] != follow_up for call in retriever.calls)
    assert second.decision == "answered"
    assert "Loading Dock A" in second.answer  # a room with a CO2 sensor


async def test_a_carried_building_the_caller_cannot_see_is_not_fetched(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    """A turn about an id that is not the caller's (typed by them; not found): the follow-up
    does not carry it, so no tool is asked about it again."""
    model = ScriptedModel(text_reply("I don't know."), tool_calling_mode="json_schema")
    agent = _planning_agent(make_local_agent, model)
    earlier = PriorTurn("How busy is bld-acme-tower?", "I could not find that building.")
    answer = await agent.answer("how many floors does it have?", NORTHWIND_STAFF, earlier=[earlier])
    assert all("bld-acme-tower" not in str(t.arguments) for t in answer.tool_calls)
    assert not any("follow-up searched as" in n for n in answer.notes)


@pytest.mark.parametrize("payloads", [False, True], ids=["no-payloads", "payloads"])
async def test_the_rewrite_is_on_the_run_span(
    make_local_agent: Any, retriever: FakeRetriever, spans: Any, payloads: bool
) -> None:
    retriever.hits = list(DOC_HITS)
    model = ScriptedModel(text_reply("Enable NTP [1]."), tool_calling_mode="json_schema")
    agent = _planning_agent(make_local_agent, model, observe_payloads=payloads)
    await agent.answer("How do I fix it?", ACME_STAFF, earlier=[CV_E1033])
    (root,) = [s for s in spans.get_finished_spans() if s.name == "agent.answer"]
    assert root.attributes[attr.AGENT_QUERY_REWRITER] == "deterministic"
    assert root.attributes[attr.AGENT_QUERY_REWRITE_RULE] == "coreference"
    assert root.attributes[attr.AGENT_QUERY_REWRITTEN] is True
    standalone = root.attributes.get(attr.AGENT_QUERY_STANDALONE)
    assert standalone == ("How do I fix CV-E1033?" if payloads else None)


async def test_a_first_turn_leaves_no_rewrite_on_the_span(
    make_local_agent: Any, retriever: FakeRetriever, spans: Any
) -> None:
    retriever.hits = list(DOC_HITS)
    model = ScriptedModel(text_reply("Clock skew [1]."), tool_calling_mode="json_schema")
    agent = _planning_agent(make_local_agent, model)
    await agent.answer("What does CV-E1033 mean?", ACME_STAFF)
    (root,) = [s for s in spans.get_finished_spans() if s.name == "agent.answer"]
    assert attr.AGENT_QUERY_REWRITE_RULE not in (root.attributes or {})
