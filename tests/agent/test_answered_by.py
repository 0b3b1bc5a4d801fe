"""Who wrote the answer (``AgentAnswer.answered_by``; docs/agent-loop.md has the definition):
``service`` for an answer the service composed from its own tool results and for the text it
put in place of the model's reply; ``model`` for the model's own reply after the service's
checks, its IDK and its decline. In both tool-calling modes as they ship (native: the plain
loop; json_schema: the small-model planner), answered whole and streamed (the ``done``
event). In process: ``agent.testing.ScriptedModel``, the simulators over ASGI, no sockets."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from agent_helpers import (
    ACME_STAFF,
    NORTHWIND_STAFF,
    Call,
    Decline,
    FakeRetriever,
    Idk,
    Mode,
    Say,
    hit,
    scripted,
)

from agent.answer import AgentAnswer, DoneEvent, TokenEvent
from agent.llm.base import ProviderUnavailable
from agent.loop import Agent
from agent.prompts import DECLINE_TEXT, IDK_MARKER
from agent.testing import FunctionModel, ScriptedModel, text_reply
from foundation.identity import AuthUser

# Each mode with the strategy it ships with: the planner is PLAN_FIRST=auto's choice for
# json_schema (the test suite's default is off).
SETUPS: dict[Mode, dict[str, Any]] = {"native": {}, "json_schema": {"plan_first": "on"}}
MODES = pytest.mark.parametrize("mode", list(SETUPS))
STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])

STALE = "SENSOR_STALE_AFTER_SECONDS defaults to 900 seconds."
STALE_QUESTION = "What is the default of SENSOR_STALE_AFTER_SECONDS?"
OPEN_QUESTION = "Tell me something interesting about my workplace."  # no route signal


def agent_for(make_local_agent: Any, model: ScriptedModel, mode: Mode, **overrides: Any) -> Agent:
    agent: Agent = make_local_agent(model, **{**SETUPS[mode], **overrides})
    return agent


async def ask(agent: Agent, question: str, user: AuthUser, streamed: bool) -> AgentAnswer:
    """The answer, whole or as the stream's one ``done`` event carries it."""
    if not streamed:
        return await agent.answer(question, user)
    events = [event async for event in agent.stream(question, user)]
    assert isinstance(events[-1], DoneEvent)
    assert sum(isinstance(event, DoneEvent) for event in events) == 1
    return events[-1].response


# --- the service --------------------------------------------------------------------------------


@STREAMED
@pytest.mark.parametrize(
    ("question", "user"),
    [
        ("Which buildings can I see?", NORTHWIND_STAFF),  # the building list
        ("How busy is Harbor Warehouse right now?", NORTHWIND_STAFF),  # live occupancy
        ("Hello!", ACME_STAFF),  # the greeting
        # a documented token the caller's search does not find: the routed IDK
        ("What is Procedure KESTREL-7 and which command locks out a gateway?", ACME_STAFF),
    ],
)
async def test_an_answer_the_service_composes_is_the_services(
    make_local_agent: Any,
    retriever: FakeRetriever,
    question: str,
    user: AuthUser,
    streamed: bool,
) -> None:
    retriever.hits = [hit("c-other", "Alerts repeat at most once per cooldown period.")]
    model = ScriptedModel(tool_calling_mode="json_schema")  # any model call fails the test
    answer = await ask(agent_for(make_local_agent, model, "json_schema"), question, user, streamed)

    assert model.requests == []
    assert any("composed by the service" in note for note in answer.notes), answer
    assert answer.answered_by == "service"


@STREAMED
async def test_a_quoted_reference_entry_is_the_services(
    make_local_agent: Any, retriever: FakeRetriever, streamed: bool
) -> None:
    section = "Configuration > Sensors > SENSOR_STALE_AFTER_SECONDS"
    retriever.hits = [dataclasses.replace(hit("c-stale", STALE), section=section)]
    model = ScriptedModel(tool_calling_mode="json_schema")
    answer = await ask(
        agent_for(make_local_agent, model, "json_schema"), STALE_QUESTION, ACME_STAFF, streamed
    )

    assert model.requests == [] and "900 seconds" in answer.answer
    assert (answer.decision, answer.answered_by) == ("answered", "service")


@MODES
@STREAMED
async def test_the_idk_answer_in_place_of_an_ungrounded_reply_is_the_services(
    mode: Mode, make_local_agent: Any, streamed: bool
) -> None:
    invented = "There are 73 people in your lobby right now."
    model = scripted(mode, Say(invented))
    agent = agent_for(make_local_agent, model, mode, grounding_repair="off")
    answer = await ask(agent, OPEN_QUESTION, NORTHWIND_STAFF, streamed)

    assert (answer.decision, answer.answer) == ("idk", IDK_MARKER)
    assert answer.retrieval.ungrounded == ["73 people"]
    assert answer.answered_by == "service"


@MODES
@STREAMED
async def test_the_idk_answer_for_an_empty_reply_is_the_services(
    mode: Mode, make_local_agent: Any, streamed: bool
) -> None:
    model = ScriptedModel(text_reply(""), tool_calling_mode=mode)
    answer = await ask(
        agent_for(make_local_agent, model, mode), OPEN_QUESTION, NORTHWIND_STAFF, streamed
    )
    assert "the model returned an empty answer" in answer.notes
    assert (answer.decision, answer.answered_by) == ("idk", "service")


@MODES
@STREAMED
async def test_the_idk_answer_of_an_exhausted_tool_loop_is_the_services(
    mode: Mode, make_local_agent: Any, streamed: bool
) -> None:
    model = scripted(mode, Call("list_buildings", {}))
    agent = agent_for(make_local_agent, model, mode, max_tool_hops=1)
    answer = await ask(agent, OPEN_QUESTION, NORTHWIND_STAFF, streamed)
    assert (answer.decision, answer.answered_by) == ("tool_loop_exhausted", "service")


@MODES
@STREAMED
async def test_the_provider_error_message_is_the_services(
    mode: Mode, make_local_agent: Any, streamed: bool
) -> None:
    model = ScriptedModel(ProviderUnavailable("connection refused"), tool_calling_mode=mode)
    answer = await ask(
        agent_for(make_local_agent, model, mode), OPEN_QUESTION, NORTHWIND_STAFF, streamed
    )
    assert (answer.decision, answer.answered_by) == ("provider_error", "service")


# --- the model ----------------------------------------------------------------------------------


@MODES
@STREAMED
async def test_the_models_checked_answer_is_the_models(
    mode: Mode, make_local_agent: Any, retriever: FakeRetriever, streamed: bool
) -> None:
    """Its invented citation stripped, its figure grounded: still the model's text."""
    retriever.hits = [hit("c-stale", STALE)]
    said = "It defaults to 900 seconds [^c-stale] [^ffffffffffff]."
    # native: the plain loop searches through the model; json_schema: the planner searched
    steps = [Call("search_docs", {"query": "sensor stale"})] if mode == "native" else []
    model = scripted(mode, *steps, Say(said))
    answer = await ask(
        agent_for(make_local_agent, model, mode), STALE_QUESTION, ACME_STAFF, streamed
    )

    assert model.requests and model.remaining == 0
    assert answer.answer == "It defaults to 900 seconds [^c-stale]."
    assert answer.retrieval.hallucinated_citations == ["ffffffffffff"]
    assert (answer.decision, answer.answered_by) == ("answered", "model")


@MODES
@STREAMED
async def test_a_repaired_answer_is_the_models(
    mode: Mode, make_local_agent: Any, streamed: bool
) -> None:
    repaired = "I can tell you about your buildings, rooms and sensors."
    model = scripted(mode, Say("There are 73 people in your lobby right now."), Say(repaired))
    agent = agent_for(make_local_agent, model, mode, grounding_repair="on")
    answer = await ask(agent, OPEN_QUESTION, NORTHWIND_STAFF, streamed)

    assert answer.answer == repaired and any("answer repaired" in n for n in answer.notes)
    assert answer.answered_by == "model"


@MODES
@STREAMED
async def test_the_models_own_idk_and_decline_are_the_models(
    mode: Mode, make_local_agent: Any, streamed: bool
) -> None:
    """Also where the service spells them (json_schema's ``idk`` and ``decline`` steps)."""
    # Native: IDK again after the search the service makes first (json_schema: the planner
    # searched before the model, agent.search_first).
    idks = (Idk(), Idk()) if mode == "native" else (Idk(),)
    model = scripted(mode, *idks, Decline())
    agent = agent_for(make_local_agent, model, mode)

    idk = await ask(agent, OPEN_QUESTION, NORTHWIND_STAFF, streamed)
    declined = await ask(agent, OPEN_QUESTION, NORTHWIND_STAFF, streamed)

    assert (idk.decision, idk.answer, idk.answered_by) == ("idk", IDK_MARKER, "model")
    assert (declined.decision, declined.answered_by) == ("declined_out_of_scope", "model")
    if mode == "json_schema":
        assert declined.answer == DECLINE_TEXT
    model.assert_exhausted()


@STREAMED
async def test_the_model_answers_a_composed_answer_that_fails_its_check(
    make_local_agent: Any, monkeypatch: pytest.MonkeyPatch, streamed: bool
) -> None:
    """A composer bug (a figure no tool result holds) goes to the model: its answer."""
    from agent.small_model import planning

    monkeypatch.setattr(planning.Planner, "_composed", lambda *_: "Harbor Warehouse is at 99 °C.")
    model = FunctionModel(
        lambda _: text_reply("You can see Harbor Warehouse."), tool_calling_mode="json_schema"
    )
    answer = await ask(
        make_local_agent(model, plan_first="on"),
        "Which buildings can I see?",
        NORTHWIND_STAFF,
        streamed,
    )
    assert model.requests and answer.answer == "You can see Harbor Warehouse."
    assert answer.answered_by == "model"


async def test_a_streamed_answer_carries_who_wrote_it_in_done_only(
    make_local_agent: Any,
) -> None:
    """The tokens are text; ``done`` says who wrote the answer it carries."""
    model = ScriptedModel(tool_calling_mode="json_schema")
    agent = agent_for(make_local_agent, model, "json_schema")
    events = [e async for e in agent.stream("Which buildings can I see?", NORTHWIND_STAFF)]
    tokens = "".join(e.text for e in events if isinstance(e, TokenEvent))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert tokens == done.response.answer and done.response.answered_by == "service"
    assert done.model_dump(mode="json")["response"]["answered_by"] == "service"
