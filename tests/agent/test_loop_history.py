"""``history``: earlier turns of a conversation reach the model between the system prompt and
the question, as they were given, in both tool-calling modes, on the JSON and the streamed
path; the system prompt (the model server's cached prefix) does not change, and nothing is
sent when there is none."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_helpers import NORTHWIND_STAFF

from agent.answer import DoneEvent
from agent.llm.base import Message
from agent.llm.json_schema_mode import to_wire_messages
from agent.testing import ScriptedModel, text_reply

HISTORY = (
    Message("user", "How busy is Harbor Warehouse?"),
    Message("assistant", "Harbor Warehouse is at 40% of its capacity."),
    Message("user", "Which floor is the busiest?"),
    Message("assistant", "The ground floor."),
)
QUESTION = "and how many rooms does it have?"


@pytest.mark.parametrize("streaming", [False, True], ids=["answer", "stream"])
async def test_history_goes_between_the_system_prompt_and_the_question(
    make_local_agent: Any, streaming: bool
) -> None:
    model = ScriptedModel(text_reply("It has a few rooms."), text_reply("It has a few rooms."))
    agent = make_local_agent(model)
    if streaming:
        events = [e async for e in agent.stream(QUESTION, NORTHWIND_STAFF, history=HISTORY)]
        assert isinstance(events[-1], DoneEvent)
    else:
        await agent.answer(QUESTION, NORTHWIND_STAFF, history=HISTORY)
    await agent.answer(QUESTION, NORTHWIND_STAFF)  # the same question, no history
    with_history, without = model.requests[0].messages, model.requests[1].messages
    assert [m.role for m in with_history] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert with_history[1:5] == HISTORY
    assert with_history[0] == without[0]  # the same system prompt: the cached prefix holds
    assert with_history[-1] == without[-1] == Message("user", QUESTION)
    assert len(without) == 2


async def test_json_schema_mode_shows_earlier_answers_as_final_answer_steps(
    make_local_agent: Any,
) -> None:
    """The small-model path: the planner runs first (its steps come after the question), and
    an earlier answer reads as the step the model answers with."""
    model = ScriptedModel(text_reply("It has a few rooms."), tool_calling_mode="json_schema")
    agent = make_local_agent(model, plan_first="on", compose_answers=False)
    await agent.answer(QUESTION, NORTHWIND_STAFF, history=HISTORY[:2])
    wire = to_wire_messages(model.requests[0].messages)
    assert wire[1] == {"role": "user", "content": "How busy is Harbor Warehouse?"}
    assert wire[2] == {
        "role": "assistant",
        "content": json.dumps(
            {"final_answer": "Harbor Warehouse is at 40% of its capacity."}, ensure_ascii=False
        ),
    }
    assert QUESTION in wire[3]["content"]
