"""Prompt size per route, counted (not timed): regression guards for the small-model path.

On 2 CPU cores the local 1.5B reads ~40 prompt tokens/s, so every token of a request's
dynamic tail costs time. llama.cpp's prompt cache reuses the longest common prefix: the system
prompt (with the tool list and examples) must be byte-identical for every question, route
and caller, and everything per-question must come after it. Sizes are characters of the wire
messages (about 3.5-4 characters per Qwen token on this text); the budgets are today's sizes
plus a margin, so a change that bloats the tail fails here first.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_helpers import NORTHWIND_STAFF, FakeRetriever, hit, mesh_user

from agent.llm.json_schema_mode import to_wire_messages
from agent.testing import ScriptedModel, text_reply

ACME_STAFF = mesh_user("u-acme", ("acme", "business_staff"))

# question, caller, the first request's tail budget in characters (everything after the
# system prompt: the question, the planner's steps and results, the reminder)
ROUTES = [
    ("Hello!", ACME_STAFF, 100),
    ("What is the default of SENSOR_STALE_AFTER_SECONDS?", ACME_STAFF, 850),  # 764 measured
    ("How busy is Harbor Warehouse right now?", NORTHWIND_STAFF, 2500),  # 2261 measured
    ("Does the Quiet Room in Acme Labs have any sensors?", ACME_STAFF, 1700),  # 1509 measured
]


async def _first_request(make_local_agent: Any, question: str, user: Any) -> list[dict[str, Any]]:
    model = ScriptedModel(text_reply("ok"), tool_calling_mode="json_schema")
    # What the model reads when it writes the answer (composing off: with it on, the live
    # routes and greetings never reach the model).
    agent = make_local_agent(model, plan_first="on", compose_answers=False)
    await agent.answer(question, user)
    return to_wire_messages(model.requests[0].messages)


@pytest.fixture
def docs(retriever: FakeRetriever) -> None:
    long_text = " ".join(f"Sentence {n} about how dashboards group sensors." for n in range(30))
    retriever.hits = [
        hit(f"c{n}", f"{long_text} SENSOR_STALE_AFTER_SECONDS defaults to 900.") for n in range(5)
    ]


@pytest.mark.usefixtures("docs")
@pytest.mark.parametrize(("question", "user", "budget"), ROUTES, ids=[r[0][:24] for r in ROUTES])
async def test_the_dynamic_tail_stays_small(
    make_local_agent: Any, question: str, user: Any, budget: int
) -> None:
    wire = await _first_request(make_local_agent, question, user)
    tail = len(json.dumps(wire[1:], ensure_ascii=False))
    assert tail <= budget, f"{question!r}: the tail grew to {tail} characters (budget {budget})"


@pytest.mark.usefixtures("docs")
async def test_the_system_prompt_is_one_static_prefix_per_kind_of_call(
    make_local_agent: Any,
) -> None:
    """Two prefixes, each the same for every question and caller: the whole prompt (planned
    live data, greetings, open questions) and the documentation routes' short one (the
    server's prompt cache keeps both)."""
    systems: dict[str, set[str]] = {"whole": set(), "documentation": set()}
    for question, user, _ in ROUTES:
        wire = await _first_request(make_local_agent, question, user)
        assert wire[0]["role"] == "system"
        assert all(m["role"] != "system" for m in wire[1:])
        kind = "documentation" if "SENSOR_STALE" in question else "whole"
        systems[kind].add(wire[0]["content"])
    (whole,) = systems["whole"]
    (documentation,) = systems["documentation"]
    # 6,359 and 2,014 characters measured
    assert len(whole) <= 7000, f"the static prefix grew to {len(whole)} characters"
    assert len(documentation) <= 2200, f"the documentation prefix grew to {len(documentation)}"
