"""agent.small_model.routing and agent.small_model.entities: the cheap signals the planner
routes on."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agent.llm.base import ToolSpec
from agent.llm.json_schema_mode import constrain_arguments, step_schema
from agent.small_model.entities import (
    KnownEntities,
    NamedEntity,
    ids_in_text,
    match_names,
    named_buildings,
    named_entities,
    named_rooms,
)
from agent.small_model.routing import (
    RouteSignals,
    coverage,
    doc_tokens,
    is_greeting,
    live_words,
    product_words,
    route,
)
from agent.tools.twin import GetBuildingResult, ListBuildingsResult


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("Which rooms does building bld-mars-base-7 have?", ["bld-mars-base-7"]),
        ("What is in room room-acme-tower-conf-12a?", ["room-acme-tower-conf-12a"]),
        ("Is room-12 free?", ["room-12"]),
        ("What does a red sensor-health dot mean on the door-counter page?", []),
        ("What does CV-E1033 mean?", []),  # an error code, not an id
    ],
)
def test_ids_in_text(text: str, ids: list[str]) -> None:
    assert ids_in_text(text) == ids


def test_names_match_whole_names_case_and_possessive_folded() -> None:
    entities = [
        NamedEntity("building", "b1", "Harbor Warehouse"),
        NamedEntity("room", "r1", "Loading Dock"),
        NamedEntity("room", "r2", "Loading Dock B"),
        NamedEntity("building", "b2", "Acme Tower"),
    ]
    found = match_names("Is loading dock B at Northwind's harbor warehouse full?", entities)
    assert [e.entity_id for e in found] == ["b1", "r2"]  # longest first; "Loading Dock" not
    assert match_names("Acme Towers are tall", entities) == []


def test_known_entities_collect_ids_from_results() -> None:
    known = KnownEntities()
    result = {"building": {"building_id": "b1", "name": "X"}, "rooms": [{"room_id": "r1"}]}
    known.add_result(json.dumps(result))
    known.add_result('{"error": "Room not found or not accessible."}')
    known.add_result("not json")
    assert known.choices(("building", "room", "chunk")) == {
        "building": ("b1",),
        "room": ("r1",),
        "chunk": (),
    }
    assert named_entities(json.dumps(result)) == [NamedEntity("building", "b1", "X")]


def test_named_entities_from_typed_results() -> None:
    """The planner's typed reads name what the generic JSON walk names."""
    listing = ListBuildingsResult.model_validate_json(
        '{"buildings":[{"building_id":"b1","name":"X","domain":"d","address":null,'
        '"floors":1,"room_count":2,"capacity":3},{"building_id":"b2","name":null,'
        '"domain":"d","address":null,"floors":null,"room_count":null,"capacity":null}],'
        '"count":2}'
    )
    assert named_buildings(listing) == [NamedEntity("building", "b1", "X")]
    assert named_buildings(listing) == named_entities(listing.model_dump_json())
    details = GetBuildingResult.model_validate_json(
        '{"building":{"building_id":"b1","name":"X","domain":"d","address":null,"floors":1,'
        '"room_count":2,"capacity":3},"rooms":[{"room_id":"r1","name":"Dock","floor":0,'
        '"capacity":4,"type":null},{"room_id":"r2","name":null,"floor":null,"capacity":null,'
        '"type":null}]}'
    )
    assert named_rooms(details) == [NamedEntity("room", "r1", "Dock")]


def test_routes() -> None:
    assert route(RouteSignals(entities=1)).route == "live_data"
    both = route(RouteSignals(entities=1, doc_tokens_found=True))
    assert both.route == "both" and not both.allow_refusal
    # a token the caller's search did not find ("rule set NW-HARBOR-CAP-3"): still both
    assert route(RouteSignals(entities=1, doc_tokens=True)).route == "both"
    # a close chunk naming the building and what the question asks about it: both
    assert route(RouteSignals(entities=1, doc_names_entity=True)).route == "both"
    assert route(RouteSignals(entities=1, doc_similarity=0.7)).route == "live_data"
    unknown = route(RouteSignals(doc_tokens=True))  # a token the caller's search cannot find
    assert unknown.route == "documentation" and not unknown.allow_refusal
    docs = route(RouteSignals(doc_tokens_found=True))
    assert docs.route == "documentation" and not docs.allow_refusal
    loose = route(RouteSignals(doc_coverage=0.8))
    assert loose.route == "documentation" and loose.allow_refusal
    assert route(RouteSignals(greeting=True, doc_coverage=0.9)).route == "greeting"
    assert route(RouteSignals(doc_coverage=0.3)).route == "open"
    # A close chunk (a paraphrase) is documentation, never declined; a distant one is not.
    close = route(RouteSignals(doc_coverage=0.3, doc_similarity=0.58))
    assert close.route == "documentation" and not close.allow_refusal
    assert route(RouteSignals(doc_coverage=0.3, doc_similarity=0.48)).route == "open"
    assert route(RouteSignals(entities=1, doc_similarity=0.9)).route == "live_data"


def test_a_product_question_the_callers_documentation_matches_weakly_is_idk_not_open() -> None:
    weak = RouteSignals(doc_coverage=0.25, doc_similarity=0.41, product_words=True)
    decision = route(weak)
    assert (decision.route, decision.allow_refusal, decision.idk) == ("documentation", False, True)
    # asking for a live reading: the live tools may answer it, so the model decides
    live = dataclasses.replace(weak, live_words=True)
    assert route(live).route == "open" and not route(live).idk
    # a documented token nobody finds is IDK too; a found one or a close chunk is not
    assert route(RouteSignals(doc_tokens=True)).idk
    assert not route(RouteSignals(doc_tokens_found=True)).idk
    assert not route(dataclasses.replace(weak, doc_similarity=0.6)).idk


@pytest.mark.parametrize(
    ("question", "product", "live"),
    [
        ("Can I switch the CrowdVision web app to dark mode?", True, False),
        ("How many free viewer accounts do we get with our seats?", True, False),
        ("How often are the signing keys of the claims gateway rotated?", True, False),
        ("Which sensors are offline?", False, True),
        ("How many people are in the Riverside Mall right now?", False, True),
        # off-topic rows of the golden set: none of the product's nouns
        ("Who designed the Empire State Building?", False, False),
        ("How do I share my screen in a Zoom meeting?", False, False),
        # quoted text is what to work on, not the topic; an apostrophe is not a quote
        ("Translate 'the meeting room is full' into German.", False, False),
        ("Translate 'reset the user password' into German.", False, False),
        ("What's the user's role?", True, False),
    ],
)
def test_product_and_live_words(question: str, product: bool, live: bool) -> None:
    assert (product_words(question), live_words(question)) == (product, live)


def test_signals() -> None:
    assert is_greeting("Hi there, what can you help me with?")
    assert not is_greeting("Which room in Acme Tower is the busiest right now?")
    assert doc_tokens("Is CV-E1033 related to ALERT_COOLDOWN_MINUTES?") == [
        "CV-E1033",
        "ALERT_COOLDOWN_MINUTES",
    ]
    assert coverage("sensor stale seconds", "A sensor is stale after 900 seconds.") == 1.0
    assert coverage("the of and", "anything") == 0.0


ROOM_TOOL = ToolSpec(
    "get_room",
    "",
    {"type": "object", "properties": {"room_id": {"type": "string"}}, "required": ["room_id"]},
    entity_arguments={"room_id": "room"},
)
SENSORS_TOOL = ToolSpec(
    "list_sensors",
    "",
    {
        "type": "object",
        "properties": {"building_id": {"type": "string"}, "room_id": {"type": "string"}},
        "required": ["building_id"],
    },
    entity_arguments={"building_id": "building", "room_id": "room"},
)


def test_constrained_arguments() -> None:
    args = ROOM_TOOL.parameters
    assert constrain_arguments(args, ROOM_TOOL.entity_arguments, {}) == args  # unconstrained
    assert constrain_arguments(args, ROOM_TOOL.entity_arguments, {"room": ()}) is None
    limited = constrain_arguments(args, ROOM_TOOL.entity_arguments, {"room": ("r1", "r2")})
    assert limited is not None and limited["properties"]["room_id"]["enum"] == ["r1", "r2"]
    # an optional id with nothing resolved is left out, the required one is limited
    sensors = constrain_arguments(
        SENSORS_TOOL.parameters,
        SENSORS_TOOL.entity_arguments,
        {"building": ("b1",), "room": ()},
    )
    assert sensors is not None and list(sensors["properties"]) == ["building_id"]


def test_step_schema_sources_and_refusal() -> None:
    schema = step_schema([ROOM_TOOL], {"room": (), "chunk": ("c1",)}, allow_refusal=False)
    kinds = [next(k for k in b["properties"] if k != "reason") for b in schema["oneOf"]]
    assert kinds == ["final_answer", "idk"]  # get_room dropped, no decline
    sources = schema["oneOf"][0]["properties"]["sources"]
    assert sources["items"]["enum"] == ["c1"]
    none_shown = step_schema([], {"chunk": ()})["oneOf"][0]["properties"]["sources"]
    assert none_shown["maxItems"] == 0
