"""The planner (agent.small_model.planning) in front of the json_schema loop: routing,
entity grounding with ids limited to what this request resolved, and documentation fetched up front.

The model is a FunctionModel that records each request, so the tests see exactly what the
model was offered (tools, ``choices``, ``allow_refusal``), and the JSON step schema the
json_schema adapter builds from it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from agent_helpers import NORTHWIND_STAFF, FakeRetriever, hit, mesh_user

from agent.llm.base import ChatRequest, ChatResult, MalformedReply, ProviderUnavailable
from agent.llm.json_schema_mode import step_schema
from agent.loop import Agent
from agent.small_model.planning import SNIPPET_CHARS, compact_hits
from agent.small_model.reading import QuestionReading
from agent.testing import FunctionModel, ScriptedModel, text_reply, tool_call, tool_calls_reply
from agent.tools.twin import BUILDING_NOT_FOUND

HARBOR_ROOMS = [
    "room-harbor-dock-a",
    "room-harbor-dock-b",
    "room-harbor-cold-store",
    "room-harbor-dispatch",
]
ACME_STAFF = mesh_user("u-acme", ("acme", "business_staff"))


def planned(make_local_agent: Any, model: Any) -> Agent:
    """An agent that plans first and lets the model write every answer (composing off: these
    tests look at what the model is offered; tests/agent/test_composing.py covers the rest)."""
    agent: Agent = make_local_agent(model, plan_first="on", compose_answers=False)
    return agent


def json_model(*replies: ChatResult) -> ScriptedModel:
    return ScriptedModel(*replies, tool_calling_mode="json_schema")


def tool_branches(request: ChatRequest) -> dict[str, dict[str, Any]]:
    """The tool branches of the step schema the adapter sends for this request."""
    schema = step_schema(request.tools, request.choices, allow_refusal=request.allow_refusal)
    out = {}
    for branch in schema["oneOf"]:
        props = branch["properties"]
        if "tool" in props:
            out[props["tool"]["const"]] = props["arguments"]
    return out


def has_decline(request: ChatRequest) -> bool:
    schema = step_schema(request.tools, request.choices, allow_refusal=request.allow_refusal)
    return any("decline" in b["properties"] for b in schema["oneOf"])


async def test_a_named_building_is_resolved_before_the_model_is_called(
    make_local_agent: Any,
) -> None:
    """Name -> id -> rooms -> occupancy run as the caller before the model's first call; the
    model only writes the answer (and can only pick the ids the steps returned)."""
    model = json_model(text_reply("Loading Dock A and B are in use."))
    agent: Agent = planned(make_local_agent, model)

    answer = await agent.answer("How busy is Harbor Warehouse right now?", NORTHWIND_STAFF)

    names = [c.name for c in answer.tool_calls]
    assert names == ["list_buildings", "get_building", "get_room_occupancy"]
    assert answer.tool_calls[0].arguments == {}  # the lookup that found the name
    assert answer.tool_calls[1].arguments == {"building_id": "bld-northwind-harbor"}
    assert set(answer.tool_calls[2].arguments["room_ids"]) == set(HARBOR_ROOMS)
    assert all(c.ok for c in answer.tool_calls)
    assert "route: live_data" in " ".join(answer.notes)
    first = model.requests[0]
    assert set(first.choices["room"]) == set(HARBOR_ROOMS)
    assert first.choices["building"] == ("bld-northwind-harbor",)
    assert '"occupancy"' in (first.messages[-2].content or "")  # the result is shown
    reminder = first.messages[-1]  # then the question again, after the long results
    assert reminder.role == "user" and "How busy is Harbor Warehouse" in (reminder.content or "")
    branches = tool_branches(first)
    assert "search_docs" not in branches  # live data: no documentation tool
    room_ids = branches["get_room_occupancy"]["properties"]["room_ids"]
    assert set(room_ids["items"]["enum"]) == set(HARBOR_ROOMS)
    assert not has_decline(first)  # a question naming the caller's building is in scope


@pytest.mark.parametrize(
    ("question", "user", "calls", "arguments"),
    [
        (  # the id also spells its building's name: grounded, then measured on the typed room
            "What is the current CO2 level in room room-acme-tower-conf-12a?",
            ACME_STAFF,
            ["list_buildings", "get_building", "get_latest_sensor_data"],
            {"room_id": "room-acme-tower-conf-12a", "sensor_type": "co2"},
        ),
        (  # no building named: measured on the typed room id alone
            "What is the temperature in room room-harbor-cold-store?",
            NORTHWIND_STAFF,
            ["get_latest_sensor_data"],
            {"room_id": "room-harbor-cold-store", "sensor_type": "temperature"},
        ),
    ],
)
async def test_a_room_the_question_types_by_id_gets_its_measurement(
    make_local_agent: Any,
    question: str,
    user: Any,
    calls: list[str],
    arguments: dict[str, Any],
) -> None:
    model = json_model(text_reply("Here is what the sensor says."))
    answer = await planned(make_local_agent, model).answer(question, user)

    assert [c.name for c in answer.tool_calls] == calls
    assert answer.tool_calls[-1].arguments == arguments
    assert answer.tool_calls[-1].ok, answer.tool_calls[-1].error


async def test_a_typed_room_id_the_caller_may_not_see_gets_the_one_not_found_answer(
    make_local_agent: Any,
) -> None:
    """Measured as the caller: a foreign room is answered exactly like an unknown one."""
    results = []
    for room in ("room-harbor-cold-store", "room-harbor-nowhere"):
        model = json_model(text_reply("I could not find that room."))
        answer = await planned(make_local_agent, model).answer(
            f"What is the temperature in room {room}?", ACME_STAFF
        )
        (call,) = answer.tool_calls
        assert call.name == "get_latest_sensor_data" and not call.ok
        results.append(model.requests[0].messages[-1].content.replace(room, "<id>"))
    assert results[0] == results[1]


@pytest.mark.parametrize(
    ("question", "call", "arguments"),
    [
        (
            "Does the Quiet Room in Acme Labs have any sensors?",
            "list_sensors",
            {"building_id": "bld-acme-labs", "room_id": "room-acme-labs-quiet"},
        ),
        (
            "What is the CO2 level in the Wet Lab at Acme Labs?",
            "get_latest_sensor_data",
            {"room_id": "room-acme-labs-wet-lab", "sensor_type": "co2"},
        ),
        (
            "How did the temperature in the Server Room at Acme Labs change over the last 8 hours?",
            "get_sensor_history",
            {"room_id": "room-acme-labs-server", "sensor_type": "temperature", "hours": 8},
        ),
    ],
)
async def test_the_measurement_a_question_asks_for_runs_on_the_room_it_names(
    make_local_agent: Any, question: str, call: str, arguments: dict[str, Any]
) -> None:
    model = json_model(text_reply("Here is what the sensors say."))
    answer = await planned(make_local_agent, model).answer(question, ACME_STAFF)

    assert [c.name for c in answer.tool_calls] == ["list_buildings", "get_building", call]
    assert answer.tool_calls[-1].arguments == arguments
    assert answer.tool_calls[-1].ok, answer.tool_calls[-1].error


async def test_no_measurement_when_the_intent_is_unclear(make_local_agent: Any) -> None:
    model = json_model(text_reply("Acme Tower has a Lobby, a Cafeteria and room 12A."))
    answer = await planned(make_local_agent, model).answer("Tell me about Acme Tower.", ACME_STAFF)
    assert [c.name for c in answer.tool_calls] == ["list_buildings", "get_building"]


async def test_unknown_and_forbidden_building_names_plan_the_same(
    make_local_agent: Any,
) -> None:
    """Harbor Warehouse is northwind's; for an acme caller it must look like a name that
    does not exist: same route, same tools offered, same (empty) ids."""
    seen = []
    for question in (
        "How busy is Harbor Warehouse right now?",
        "How busy is Riverside Mall right now?",
    ):
        model = json_model(text_reply("I don't know."))
        answer = await planned(make_local_agent, model).answer(question, ACME_STAFF)
        request = model.requests[0]
        seen.append(
            (
                [c.name for c in answer.tool_calls],
                [n for n in answer.notes if n.startswith("route")],
                sorted(tool_branches(request)),
                request.choices["room"],
                request.choices["building"],
            )
        )
        assert "Harbor" not in json.dumps([m.content for m in request.messages[2:]])
    assert seen[0] == seen[1]
    assert seen[0][0] == []  # nothing shown to the model: the lookup found no match


async def test_a_typed_building_id_is_grounded_before_the_model_writes(
    make_local_agent: Any,
) -> None:
    """A typed building id is looked up as the caller up front, like a named building: an
    unknown id and another tenant's get the same not-found step and the same prompt."""
    prompts = []
    for building in ("bld-mars-base-7", "bld-northwind-harbor"):
        model = json_model(text_reply("I could not find that building."))
        agent: Agent = planned(make_local_agent, model)
        answer = await agent.answer(f"Which rooms does building {building} have?", ACME_STAFF)

        (call,) = answer.tool_calls
        assert (call.name, call.arguments) == ("get_building", {"building_id": building})
        assert call.error == BUILDING_NOT_FOUND
        request = model.requests[0]
        assert request.choices["building"] == (building,)
        prompts.append(json.dumps([m.content for m in request.messages]).replace(building, "<id>"))
    assert prompts[0] == prompts[1]


async def test_id_tools_are_not_offered_before_an_id_is_known(make_local_agent: Any) -> None:
    """No building named, no id typed: get_building and the room tools cannot be called
    (an id would have to be invented); list_buildings can."""
    model = json_model(
        tool_calls_reply(tool_call("list_buildings", {})),
        text_reply("Which building's lobby do you mean: Acme Tower or Acme Labs?"),
    )
    answer = await planned(make_local_agent, model).answer(
        "How many people are in the lobby right now?", ACME_STAFF
    )

    first, second = model.requests
    assert "get_building" not in tool_branches(first)
    assert "get_room_occupancy" not in tool_branches(first)
    assert "list_buildings" in tool_branches(first)
    # after list_buildings returned them, the caller's building ids are allowed
    assert set(second.choices["building"]) == {"bld-acme-tower", "bld-acme-labs"}
    enum = tool_branches(second)["get_building"]["properties"]["building_id"]["enum"]
    assert set(enum) == {"bld-acme-tower", "bld-acme-labs"}
    assert answer.decision == "answered"


async def test_a_documentation_question_gets_a_compact_search_up_front(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    long_tail = " ".join(f"Unrelated sentence number {n} about dashboards." for n in range(40))
    retriever.hits = [
        hit("c-stale", f"{long_tail} SENSOR_STALE_AFTER_SECONDS defaults to 900 seconds."),
        hit("c-other", "Alerts repeat at most once per cooldown period."),
        hit("c-third", "Reports are exported as CSV."),
        hit("c-fourth", "Never shown: only the best three chunks are."),
    ]
    model = json_model(text_reply("It defaults to 900 seconds. [^c-stale]"))

    answer = await planned(make_local_agent, model).answer(
        "What is the default of SENSOR_STALE_AFTER_SECONDS?", ACME_STAFF
    )

    assert [c.name for c in answer.tool_calls] == ["search_docs"]
    assert [c.chunk_id for c in answer.citations] == ["c-stale"]
    request = model.requests[0]
    assert request.choices["chunk"] == ("c-stale", "c-other", "c-third")
    assert not has_decline(request)  # a documented token: never declined as off-topic
    assert [spec.name for spec in request.tools] == ["search_docs"]
    lines = (request.messages[-2].content or "").splitlines()
    # Each chunk is shown under a one-token label; the answer still cites the chunk id.
    assert [line.split("]")[0] for line in lines] == ["[1", "[2", "[3"]
    assert request.source_labels == {"1": "c-stale", "2": "c-other", "3": "c-third"}
    assert "900 seconds" in lines[0] and len(lines[0]) < 600  # trimmed to what matches
    assert "Unrelated sentence" not in lines[0]
    assert answer.retrieval.chunk_ids == ["c-stale", "c-other", "c-third"]


@pytest.mark.parametrize(
    ("similarity", "route", "declinable"), [(0.62, "documentation", False), (0.40, "open", True)]
)
async def test_a_paraphrase_close_to_a_chunk_is_documentation_and_never_declined(
    make_local_agent: Any,
    retriever: FakeRetriever,
    similarity: float,
    route: str,
    declinable: bool,
) -> None:
    """Few shared words, close meaning: the search's cosine routes it, not word overlap."""
    retriever.hits = [
        dataclasses.replace(
            hit("c-e1039", "Undelivered events after the retry schedule disable the endpoint."),
            similarity=similarity,
        )
    ]
    model = json_model(text_reply("The endpoint was disabled; re-enable it. [^c-e1039]"))

    answer = await planned(make_local_agent, model).answer(
        "Our receiver was down for hours and now nothing arrives - what happened?", ACME_STAFF
    )

    assert next(n for n in answer.notes if n.startswith("route")).startswith(f"route: {route}")
    request = model.requests[0]
    assert has_decline(request) is declinable
    shown = [c.name for c in answer.tool_calls]
    assert shown == (["search_docs"] if route == "documentation" else [])
    # open: the service's search matched poorly, so the model is not offered another one
    assert ("search_docs" in tool_branches(request)) is (route == "documentation")


async def test_a_greeting_is_offered_no_tool(make_local_agent: Any) -> None:
    model = json_model(text_reply("Hello! I can help with your buildings."))
    answer = await planned(make_local_agent, model).answer("Hello!", ACME_STAFF)

    assert answer.tool_calls == []
    assert model.requests[0].tools == ()
    assert "route: greeting" in " ".join(answer.notes)


async def test_native_mode_keeps_the_plain_loop_by_default(make_local_agent: Any) -> None:
    requests: list[ChatRequest] = []

    def reply(request: ChatRequest) -> ChatResult:
        requests.append(request)
        return text_reply("Hello!")

    answer = await make_local_agent(FunctionModel(reply), plan_first="auto").answer(
        "How busy is Harbor Warehouse right now?", NORTHWIND_STAFF
    )

    assert answer.tool_calls == []
    assert requests[0].choices == {} and requests[0].allow_refusal
    assert len(requests[0].tools) == 8


async def test_warm_up_sends_each_static_prefix_once_with_a_one_token_reply(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    requests: list[ChatRequest] = []

    def reply(request: ChatRequest) -> ChatResult:
        requests.append(request)
        raise MalformedReply("one token is not a step")

    model = FunctionModel(reply, tool_calling_mode="json_schema")
    agent: Agent = make_local_agent(model, plan_first="auto")
    asked: list[ChatRequest] = []

    assert await agent.warm_up() is True
    whole_prefix, docs_prefix, both_prefix = requests
    both = both_prefix.messages[0].content or ""
    assert "get_room_occupancy" in both  # "both" offers every tool, in its short prompt
    assert len(both) < len(whole_prefix.messages[0].content or "") * 0.6
    for request in requests:
        assert request.max_output_tokens == 1
        assert [m.role for m in request.messages] == ["system", "user"]

    # The same system messages questions get, so the server's prompt cache serves them:
    # the whole prompt for a greeting, the short one for a documentation question.
    def answer(request: ChatRequest) -> ChatResult:
        asked.append(request)
        return text_reply("It defaults to 900 seconds.")

    answer_model = FunctionModel(answer, tool_calling_mode="json_schema")
    answering = make_local_agent(answer_model, plan_first="auto", compose_answers=False)
    await answering.answer("Hello!", ACME_STAFF)
    retriever.hits = [hit("c-stale", "SENSOR_STALE_AFTER_SECONDS defaults to 900 seconds.")]
    await answering.answer("What is the default of SENSOR_STALE_AFTER_SECONDS?", ACME_STAFF)
    assert [request.messages[0] for request in asked] == [
        whole_prefix.messages[0],
        docs_prefix.messages[0],
    ]


async def test_a_documentation_route_reads_the_short_answer_prompt(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    """Its search is done: the model reads the answer rules and one tool, not the live-data
    tools and their examples (a fifth of the prompt: faster to read after, and to write)."""
    retriever.hits = [hit("c-stale", "SENSOR_STALE_AFTER_SECONDS defaults to 900 seconds.")]
    model = json_model(text_reply("It defaults to 900 seconds. [^c-stale]"), text_reply("Hi!"))
    agent = planned(make_local_agent, model)

    await agent.answer("What is the default of SENSOR_STALE_AFTER_SECONDS?", ACME_STAFF)
    await agent.answer("Hello!", ACME_STAFF)

    docs, greeting = (request.messages[0].content or "" for request in model.requests)
    assert "search_docs(query: string)" in docs and "get_room_occupancy" not in docs
    assert "get_room_occupancy" in greeting
    assert len(docs) < len(greeting) / 3


async def test_warm_up_never_calls_a_provider_in_native_mode(make_local_agent: Any) -> None:
    requests: list[ChatRequest] = []

    def record(request: ChatRequest) -> ChatResult:
        requests.append(request)
        return text_reply("x")

    model = FunctionModel(record)
    assert await make_local_agent(model, plan_first="auto").warm_up() is False
    assert requests == []


async def test_warm_up_reports_a_model_that_is_not_up(make_local_agent: Any) -> None:
    def down(request: ChatRequest) -> ChatResult:
        raise ProviderUnavailable("connection refused")

    model = FunctionModel(down, tool_calling_mode="json_schema")
    assert await make_local_agent(model, plan_first="auto").warm_up() is False


def test_a_snippet_too_long_for_its_budget_ends_at_a_boundary_with_an_ellipsis() -> None:
    from agent.small_model.planning import _clip

    text = "No occupancy source: the room has no people counter. This is returned as 409 by"
    assert _clip(text, 70) == "No occupancy source: the room has no people counter. …"
    assert _clip("one two three four five six", 12) == "one two …"
    assert _clip("short", 12) == "short"


@pytest.mark.parametrize(
    "question", ["Which buildings can I see?", "List all the buildings I have access to."]
)
async def test_a_question_for_the_callers_buildings_gets_the_list_shown(
    make_local_agent: Any, question: str
) -> None:
    model = json_model(text_reply("You can see Harbor Warehouse."))
    answer = await planned(make_local_agent, model).answer(question, NORTHWIND_STAFF)

    assert [c.name for c in answer.tool_calls] == ["list_buildings"]
    request = model.requests[0]
    assert "bld-northwind-harbor" in (request.messages[-2].content or "")  # the list is shown
    assert not has_decline(request)
    assert "route: live_data" in " ".join(answer.notes)


async def test_a_room_name_is_not_read_as_the_measurement_asked_for(make_local_agent: Any) -> None:
    """ "Cold Store" names a room; it does not ask for a temperature."""
    model = json_model(text_reply("The Cold Store has no occupancy sensor."))
    answer = await planned(make_local_agent, model).answer(
        "How many people are in the Cold Store at Harbor Warehouse (room room-harbor-cold-store)"
        " at the moment?",
        NORTHWIND_STAFF,
    )
    names = [c.name for c in answer.tool_calls]
    assert names == ["list_buildings", "get_building", "get_room_occupancy"]
    assert answer.tool_calls[-1].arguments == {"room_ids": ["room-harbor-cold-store"]}


async def test_a_token_named_only_in_a_section_heading_is_found_and_its_entry_shown_first(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    """An error code's reference entry names it in its heading only; a page that mentions it
    in passing ranks first in the search but is not its definition."""
    passing = hit("c-api", "A sensor that never reported returns 404 with CV-E1014.")
    entry = dataclasses.replace(
        hit("c-entry", "The sensor is registered but has never sent a reading."),
        section="Error code reference > CV-E1014 – No readings yet",
    )
    retriever.hits = [passing, entry]
    model = json_model(text_reply("It means the sensor never reported. [1]"))
    answer = await planned(make_local_agent, model).answer("When do I get CV-E1014?", ACME_STAFF)

    assert "route: documentation (a documented token the search found)" in answer.notes
    shown = model.requests[0].messages[-2].content or ""
    assert shown.index("No readings yet") < shown.index("returns 404")


async def test_a_token_the_callers_search_does_not_find_is_answered_idk_after_the_search(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    """A hidden or unknown page's token: the search runs (and is in the trace), the answer is
    IDK, never a decline; the same for a page that does not exist."""
    retriever.hits = [hit("c-other", "Alerts repeat at most once per cooldown period.")]
    answer = await make_local_agent(ScriptedModel(), plan_first="on").answer(
        "What is Procedure KESTREL-7 and which command locks out a gateway?", ACME_STAFF
    )
    assert [c.name for c in answer.tool_calls] == ["search_docs"]
    assert answer.decision == "idk" and answer.idk and answer.citations == []
    assert any("does not find" in note for note in answer.notes)


async def test_a_product_question_the_callers_documentation_does_not_answer_is_idk(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    """A restricted or missing page about the product: the search is shown, the answer is
    IDK without a model call (never a decline, never a guess from weak chunks)."""
    retriever.hits = [
        dataclasses.replace(hit("c-theme", "Alert colours follow the theme."), similarity=0.45)
    ]
    model = ScriptedModel()
    answer = await make_local_agent(model, plan_first="on").answer(
        "Can I switch the CrowdVision web app to dark mode?", ACME_STAFF
    )
    assert [c.name for c in answer.tool_calls] == ["search_docs"]
    assert answer.decision == "idk" and answer.citations == [] and model.requests == []
    assert any(n.startswith("route: documentation (about the product") for n in answer.notes)


async def test_an_off_topic_question_stays_with_the_model_which_may_decline(
    make_local_agent: Any, retriever: FakeRetriever
) -> None:
    retriever.hits = [dataclasses.replace(hit("c-x", "Rooms and floors."), similarity=0.3)]
    model = json_model(text_reply("I can only help with CrowdVision."))
    answer = await planned(make_local_agent, model).answer(
        "How do I share my screen in a Zoom meeting?", ACME_STAFF
    )
    assert has_decline(model.requests[0]) and answer.tool_calls == []
    assert any(n.startswith("route: open") for n in answer.notes)


def test_a_snippet_keeps_the_matching_sentences_before_the_lines_that_follow_them() -> None:
    text = (
        "Each rule has a cooldown. After a rule sends a notification for a room, it will not "
        "notify again for the same room and alert type until the cooldown has passed, even if "
        "the alert clears and fires again in between. The alert history still records every "
        "transition.\n- The default cooldown is 15 minutes, set platform-wide by "
        "ALERT_COOLDOWN_MINUTES.\n- A business_admin can set a domain default under Settings "
        "or override it per rule, from 1 minute to 1440 minutes (24 hours).\n- Escalation from "
        "warning to critical always notifies immediately; the cooldown applies per type."
    )
    question = "How long is the alert cooldown by default, and what does it do?"
    reading = QuestionReading.of(question, [])
    [line] = compact_hits(reading, [hit("c1", text)], ["1"]).splitlines()
    # both halves of the question: what it does (a matching sentence) and its default
    assert "will not notify again" in line and "15 minutes" in line
    assert "business_admin" not in line  # the default's follower lost to a matching sentence
    assert len(line) <= SNIPPET_CHARS + 80


@pytest.mark.parametrize(
    ("question", "route"),
    [
        (  # the page is about what it asks, besides the building's name: both
            "During the forklift shift, how many people are allowed in the second dock hall "
            "of the Harbor Warehouse?",
            "both",
        ),
        # the same close pages name the building, but it asks only for a reading: live data
        ("How full is the Harbor Warehouse at the moment?", "live_data"),
        ("How busy is Harbor Warehouse right now?", "live_data"),  # make run's example
    ],
)
async def test_a_close_page_about_a_named_building_makes_it_both(
    make_local_agent: Any, retriever: FakeRetriever, question: str, route: str
) -> None:
    retriever.hits = [
        dataclasses.replace(
            hit("c-dock-b", "During the forklift shift Dock Hall B allows 34 people."),
            title="Custom capacity rules for the Harbor warehouse",
            section="Dock Hall B: forklift-shift derating",
            similarity=0.7,
        ),
        dataclasses.replace(
            hit("c-ask", 'Ask "What is the capacity of Dock Hall B right now?" and it answers.'),
            title="Custom capacity rules for the Harbor warehouse",
            section="Asking the assistant about Harbor",
            similarity=0.62,
        ),
    ]
    model = json_model(text_reply("34 people during the forklift shift. [^c-dock-b]"))

    answer = await planned(make_local_agent, model).answer(question, NORTHWIND_STAFF)

    assert next(n for n in answer.notes if n.startswith("route")).startswith(f"route: {route}")
    shown = [c.name for c in answer.tool_calls]
    assert ("search_docs" in shown) is (route == "both")
    assert "get_building" in shown  # the building is grounded either way
    # both reads the short answer prompt with every tool; live data the whole prompt
    system = model.requests[0].messages[0].content or ""
    assert "get_room_occupancy" in system
    assert ("Examples:\nHello!" in system) is (route == "live_data")
