"""Answers the service composes from the planner's tool results (agent.small_model.composing): the
model is not called, every figure comes from a tool result, and unknown and forbidden entities read
the same. Runs the real planner and tools against the in-process simulators; the model is a
ScriptedModel with no replies, so any model call would fail the test."""

from __future__ import annotations

from typing import Any

import pytest
from agent_helpers import ACME_STAFF, ADMIN, NORTHWIND_STAFF, mesh_user

from agent.answer import DoneEvent, TokenEvent
from agent.loop import Agent
from agent.small_model.composing import compose_greeting, sensor_word
from agent.small_model.intents import live_intent, sensor_types
from agent.small_model.strategy import SmallModelStrategy
from agent.testing import ScriptedModel, text_reply
from tests.shipped_tools import shipped_registry

NOBODY = mesh_user("tess", ("ghost-domain", "business_admin"))  # a domain with no building


def silent_model() -> ScriptedModel:
    return ScriptedModel(tool_calling_mode="json_schema")


def composing_agent(make_local_agent: Any, model: ScriptedModel | None = None) -> Agent:
    agent: Agent = make_local_agent(model or silent_model(), plan_first="on")
    assert isinstance(agent.strategy, SmallModelStrategy)
    assert agent.strategy.compose  # the default
    return agent


def is_composed(answer: Any) -> bool:
    return any("composed by the service" in note for note in answer.notes)


CASES = [
    (
        "How busy is Harbor Warehouse right now?",
        NORTHWIND_STAFF,
        ["get_room_occupancy"],
        ["Loading Dock A", "Cold Store", "no live people count"],
    ),
    (
        "Which room in Acme Tower is the busiest right now?",
        ACME_STAFF,
        ["get_room_occupancy"],
        ["The busiest room right now is"],
    ),
    (
        "Does the Quiet Room in Acme Labs have any sensors?",
        ACME_STAFF,
        ["list_sensors"],
        ["No sensors are installed in Quiet Room"],
    ),
    (
        "Which sensors are installed in room room-acme-labs-server of building bld-acme-labs?",
        ACME_STAFF,
        ["list_sensors"],
        ["temperature", "humidity"],
    ),
    (
        "Is the temperature sensor in Loading Dock B at Harbor Warehouse reporting right now?",
        NORTHWIND_STAFF,
        ["get_latest_sensor_data"],
        ["offline", "no current reading"],
    ),
    (
        "How high is the CO2 concentration in room room-acme-labs-server right now?",
        ACME_STAFF,
        ["get_latest_sensor_data"],
        ["No CO2 sensor is installed in Server Room"],
    ),
    (
        "What is the current CO2 level in room room-acme-tower-conf-12a?",
        ACME_STAFF,
        ["get_latest_sensor_data"],
        ["ppm"],
    ),
    (
        "How did the temperature in room room-acme-labs-server change over the last 8 hours?",
        ACME_STAFF,
        ["get_sensor_history"],
        ["ranged from", "°C"],
    ),
    (
        "How many people are in room room-acme-labs-quiet right now?",
        ACME_STAFF,
        ["get_room_occupancy"],
        ["no live people count"],
    ),
    (
        "Which rooms does building bld-acme-tower have?",
        ACME_STAFF,
        ["get_building"],
        ["Lobby", "Cafeteria", "12A"],
    ),
    (
        "Which floor is room room-acme-tower-conf-12a on, and how many people is it planned for?",
        ACME_STAFF,
        ["get_room"],
        ["floor 12", "planned for 14 people"],
    ),
    ("Which buildings can I see?", NORTHWIND_STAFF, ["list_buildings"], ["Harbor Warehouse"]),
    ("Which buildings can I see?", NOBODY, ["list_buildings"], ["cannot see any buildings"]),
]


@pytest.mark.parametrize(("question", "user", "last_tools", "phrases"), CASES)
async def test_a_settled_live_data_question_is_answered_without_the_model(
    make_local_agent: Any, question: str, user: Any, last_tools: list[str], phrases: list[str]
) -> None:
    answer = await composing_agent(make_local_agent).answer(question, user)

    assert answer.decision == "answered" and is_composed(answer), answer
    assert answer.tool_calls[-1].name in last_tools
    for phrase in phrases:
        assert phrase in answer.answer, answer.answer
    assert answer.usage.input_tokens == 0 and answer.usage.output_tokens == 0
    # Composed only after the grounding check passed: nothing ungrounded was reported.
    assert answer.retrieval.ungrounded == []
    print(f"\n{question}\n  -> {answer.answer}")


async def test_no_reading_is_composed_where_there_is_none(make_local_agent: Any) -> None:
    """The fabrication bait: a room with no CO2 sensor, an offline sensor, a null occupancy."""
    for question, user, forbidden in [
        ("How high is the CO2 concentration in room room-acme-labs-server?", ACME_STAFF, "ppm"),
        ("What is the temperature in Loading Dock B (room room-harbor-dock-b) right now?",
         NORTHWIND_STAFF, "°C"),
        ("How many people are in room room-acme-labs-quiet right now?", ACME_STAFF, "people,"),
    ]:  # fmt: skip
        answer = await composing_agent(make_local_agent).answer(question, user)
        assert is_composed(answer)
        assert forbidden not in answer.answer, answer.answer


@pytest.mark.parametrize(
    ("question", "ids"),
    [
        ("Which rooms does building {} have?", ("bld-northwind-harbor", "bld-mars-base-7")),
        ("What is the temperature in room {}?", ("room-harbor-cold-store", "room-harbor-nowhere")),
    ],
)
async def test_unknown_and_forbidden_entities_get_the_same_composed_answer(
    make_local_agent: Any, question: str, ids: tuple[str, str]
) -> None:
    texts = []
    for entity_id in ids:
        answer = await composing_agent(make_local_agent).answer(
            question.format(entity_id), ACME_STAFF
        )
        assert is_composed(answer) and "could not find" in answer.answer
        assert "Harbor" not in answer.answer.replace(entity_id, "")
        texts.append(answer.answer.replace(entity_id, "<id>"))
    assert texts[0] == texts[1]


async def test_an_unclear_question_still_goes_to_the_model(make_local_agent: Any) -> None:
    model = ScriptedModel(text_reply("I don't know."), tool_calling_mode="json_schema")
    answer = await composing_agent(make_local_agent, model).answer(
        "Which firmware version is the CO2 sensor in room room-acme-tower-conf-12a running?",
        ACME_STAFF,
    )
    assert not is_composed(answer)
    assert len(model.requests) == 1


async def test_composing_can_be_switched_off(make_local_agent: Any) -> None:
    model = ScriptedModel(text_reply("Harbor Warehouse is busy."), tool_calling_mode="json_schema")
    agent: Agent = make_local_agent(model, plan_first="on", compose_answers=False)
    answer = await agent.answer("How busy is Harbor Warehouse right now?", NORTHWIND_STAFF)
    assert not is_composed(answer) and len(model.requests) == 1


async def test_a_greeting_is_answered_at_once(make_local_agent: Any) -> None:
    answer = await composing_agent(make_local_agent).answer("Hello!", ADMIN)
    types = sensor_types(shipped_registry().specs())  # what the greeting lists: the tools'
    assert answer.answer == compose_greeting("Hello!", types) and answer.tool_calls == []
    assert all(sensor_word(t) in answer.answer for t in types)
    assert compose_greeting("Thanks!").startswith("You're welcome!")


async def test_a_composed_answer_streams_as_one_token_then_done(make_local_agent: Any) -> None:
    events = [
        event
        async for event in composing_agent(make_local_agent).stream(
            "Does the Quiet Room in Acme Labs have any sensors?", ACME_STAFF
        )
    ]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert "".join(t.text for t in tokens) == done.response.answer


@pytest.mark.parametrize(
    ("question", "details", "occupancy"),
    [
        ("Which floor is it on, and how many people is it planned for?", True, False),
        ("How many people can it hold?", True, False),
        ("How many people can room room-acme-tower-cafeteria hold?", True, False),
        ("How many people can the Cafeteria in Acme Tower hold?", True, False),
        ("How many people are in it right now?", False, True),
        ("What is its capacity and how many people are in it now?", False, True),
    ],
)
def test_a_rooms_planned_size_is_not_its_live_count(
    question: str, details: bool, occupancy: bool
) -> None:
    intent = live_intent(question)
    assert (intent.details, intent.occupancy) == (details, occupancy)
