"""``earlier``: earlier turns of a conversation reach the model between the system prompt and
the question, as they were given, in both tool-calling modes, on the JSON and the streamed
path; the system prompt (the model server's cached prefix) does not change, and nothing is
sent when there is none."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from agent_helpers import NORTHWIND_STAFF

from agent.answer import DoneEvent
from agent.llm.base import Message
from agent.llm.json_schema_mode import to_wire_messages
from agent.strategy import AgenticStrategy, RunHooks, RunStart
from agent.testing import ScriptedModel, text_reply
from agent.turns import MAX_EARLIER, PriorTurn

HISTORY = (
    Message("user", "How busy is Harbor Warehouse?"),
    Message("assistant", "Harbor Warehouse is at 40% of its capacity."),
    Message("user", "Which floor is the busiest?"),
    Message("assistant", "The ground floor."),
)
EARLIER = (  # the same two turns, as the request carries them
    PriorTurn(HISTORY[0].content or "", HISTORY[1].content or ""),
    PriorTurn(HISTORY[2].content or "", HISTORY[3].content or ""),
)
QUESTION = "and how many rooms does it have?"


@pytest.mark.parametrize("streaming", [False, True], ids=["answer", "stream"])
async def test_history_goes_between_the_system_prompt_and_the_question(
    make_local_agent: Any, streaming: bool
) -> None:
    model = ScriptedModel(text_reply("It has a few rooms."), text_reply("It has a few rooms."))
    agent = make_local_agent(model)
    if streaming:
        events = [e async for e in agent.stream(QUESTION, NORTHWIND_STAFF, earlier=EARLIER)]
        assert isinstance(events[-1], DoneEvent)
    else:
        await agent.answer(QUESTION, NORTHWIND_STAFF, earlier=EARLIER)
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
    await agent.answer(QUESTION, NORTHWIND_STAFF, earlier=EARLIER[:1])
    wire = to_wire_messages(model.requests[0].messages)
    assert wire[1] == {"role": "user", "content": "How busy is Harbor Warehouse?"}
    assert wire[2] == {
        "role": "assistant",
        "content": json.dumps(
            {"final_answer": "Harbor Warehouse is at 40% of its capacity."}, ensure_ascii=False
        ),
    }
    assert QUESTION in wire[3]["content"]


class _Recording(AgenticStrategy):
    """The default strategy, noting the earlier turns each run hands it."""

    def __init__(self) -> None:
        self.earlier: list[tuple[PriorTurn, ...]] = []

    def begin(self, start: RunStart) -> RunHooks:
        self.earlier.append(start.earlier)
        return super().begin(start)


@pytest.mark.parametrize(
    ("budget", "shown", "strategy_reads"),
    [(None, 2 * (MAX_EARLIER + 2), MAX_EARLIER), (25, 2, MAX_EARLIER), (0, 0, 0)],
    ids=["no-budget", "budget-fits-one", "budget-zero"],  # a turn here costs 19 estimated tokens
)
async def test_the_agent_derives_history_and_the_strategys_turns_from_one_list(
    make_local_agent: Any, budget: int | None, shown: int, strategy_reads: int
) -> None:
    """The request carries every earlier turn once (issue 41, item 3): the model is shown the
    newest that fit ``history_max_tokens`` (None: all; 0: none), the strategy reads the
    newest ``MAX_EARLIER`` (none at a budget of 0)."""
    turns = tuple(PriorTurn(f"question {n}?", f"answer {n}.") for n in range(MAX_EARLIER + 2))
    model = ScriptedModel(text_reply("It has a few rooms."))
    agent = make_local_agent(model)
    agent.config = dataclasses.replace(agent.config, history_max_tokens=budget)
    agent.strategy = recording = _Recording()
    await agent.answer(QUESTION, NORTHWIND_STAFF, earlier=turns)
    messages = model.requests[0].messages
    assert len(messages) == shown + 2  # the system prompt and the question around them
    assert recording.earlier == [turns[len(turns) - strategy_reads :] if strategy_reads else ()]
