"""Statements of live state and of the past need a result of this turn that settles them
(issue 42, item 3): "it is above the level right now" after lookups only is not an answer;
after a reading it is. The tools say what they settle (``ToolSpec.answers``); the check runs
in both modes, streamed or not, and only in runs about buildings or rooms."""

from __future__ import annotations

from typing import Any

import pytest
from agent_helpers import MODES, NORTHWIND_STAFF, Call, Mode, Say, scripted

from agent.answer import DoneEvent
from agent.grounding import unsupported_states

ROOM = "room-harbor-dispatch"
QUESTION = "Is the Dispatch Office above its CO2 limit?"
LOOKUP = Call("get_room", {"room_id": ROOM})
READING = Call("get_latest_sensor_data", {"room_id": ROOM})
HISTORY = Call("get_sensor_history", {"room_id": ROOM, "sensor_type": "co2", "hours": 48})
NOW = "Yes, it is above the limit right now."
PAST = "It was busy yesterday afternoon."


def test_the_phrases_and_what_settles_them() -> None:
    assert unsupported_states(NOW, set()) == ["is above"]
    assert unsupported_states("Live data is unavailable right now.", set()) == []
    assert unsupported_states(NOW, {"reading"}) == []
    assert unsupported_states(PAST, {"reading", "occupancy"}) == ["was busy", "yesterday"]
    assert unsupported_states(PAST, {"history"}) == []
    assert unsupported_states("The office has 16 seats.", set()) == []


async def _answer(agent: Any, streaming: bool) -> Any:
    if not streaming:
        return await agent.answer(QUESTION, NORTHWIND_STAFF)
    events = [e async for e in agent.stream(QUESTION, NORTHWIND_STAFF)]
    assert isinstance(events[-1], DoneEvent)
    return events[-1].response


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("streaming", [False, True], ids=["answer", "stream"])
@pytest.mark.parametrize("mode", MODES)
async def test_a_live_state_after_lookups_only_is_idk(
    mode: Mode, streaming: bool, make_local_agent: Any
) -> None:
    # The model says it again when told no reading shows it: IDK.
    agent = make_local_agent(scripted(mode, LOOKUP, Say(NOW), Say(NOW)), plan_first="off")
    answer = await _answer(agent, streaming)
    assert (answer.decision, answer.idk) == ("idk", True)
    assert answer.retrieval.ungrounded == ["is above"]
    assert answer.answered_by == "service"


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_a_live_state_after_a_reading_stands(mode: Mode, make_local_agent: Any) -> None:
    agent = make_local_agent(scripted(mode, READING, Say(NOW)), plan_first="off")
    answer = await agent.answer(QUESTION, NORTHWIND_STAFF)
    assert (answer.decision, answer.answer, answer.retrieval.ungrounded) == ("answered", NOW, [])


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_the_past_needs_a_history_not_todays_reading(
    mode: Mode, make_local_agent: Any
) -> None:
    today = make_local_agent(scripted(mode, READING, Say(PAST), Say(PAST)), plan_first="off")
    assert (await today.answer(QUESTION, NORTHWIND_STAFF)).decision == "idk"
    history = make_local_agent(scripted(mode, HISTORY, Say(PAST)), plan_first="off")
    assert (await history.answer(QUESTION, NORTHWIND_STAFF)).decision == "answered"


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_documentation_answers_are_not_held_to_readings(
    mode: Mode, make_local_agent: Any
) -> None:
    """No building or room in the run: "currently" in a documentation answer is prose."""
    said = "Exports are currently limited to CSV."
    agent = make_local_agent(scripted(mode, Say(said)), plan_first="off")
    answer = await agent.answer("Which export formats are there?", NORTHWIND_STAFF)
    assert (answer.decision, answer.answer) == ("answered", said)
