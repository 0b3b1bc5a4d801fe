"""``agent.grounding``: the claim extractor and normaliser (unit and property tests), its false
positives on the documentation's expected answers, and the loop's finishing step (repair once,
else IDK) on ``agent.testing.ScriptedModel`` in both tool-calling modes."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_helpers import MODES, NORTHWIND_STAFF, Call, Idk, Mode, Say, scripted
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.answer import AgentEvent, DoneEvent, TokenEvent
from agent.grounding import build_evidence, extract_claims, normalize, ungrounded
from agent.loop import Agent
from agent.prompts import IDK_MARKER
from agent.turns import PriorTurn

ROOT = Path(__file__).resolve().parents[2]


def missing(answer: str, *evidence: Any, question: str = "") -> list[str]:
    texts = [e if isinstance(e, str) else json.dumps(e) for e in evidence]
    return ungrounded(answer, build_evidence([question, *texts]))


# --- numbers and units ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "evidence"),
    [
        ("It holds 1,200 people.", {"capacity": 1200}),
        ("It holds 1200 people.", "a capacity of 1,200 people"),
        ("It holds 1 200 people.", "a capacity of 1,200"),
        ("It is 21 °C.", {"value": 21.0, "unit": "°C"}),
        ("It is 21.0 °C.", {"value": 21}),
        ("It is 21 °C.", {"value": 21.37}),  # rounded to the precision written
        ("It is 21.4 ℃.", {"value": 21.37}),
        ("It is 21.4°C.", {"value": 21.37}),
        ("Humidity is 42 %RH.", {"value": 42.2, "unit": "%RH"}),
        ("It is at 85% of capacity.", {"utilisation": 0.85}),
        ("It is at 48 % of capacity.", {"utilisation": 0.475}),
        ("The default is 15 minutes.", "Default `900`, range 60–86400."),
        ("The default is 900 seconds.", "the default is 15 minutes"),
        ("Retries take about 4h.", "about 4 hours in total"),
        ("It accepts 60-86400.", "range 60–86400"),
        ("The server room is on floor -1.", {"floor": -1}),
        ("It is on floor −1.", {"floor": -1}),
        ("A 14-day grace period.", "a 14-day seat grace period"),
        ("It has 4 rooms.", {"rooms": [{}, {}, {}, {}]}),  # a count of what the tool listed
        ("Alerts fire above 1,000 ppm.", "[1] Alerts: CO2 above 1,000 ppm raises an alert."),
        ("It reads 4.2 °C.", {"note": "last value 4.2 °C, at 2026-12-02T03:00:00Z"}),
        ("Nobody is there: 0 people.", {"occupancy": 0, "capacity": 12}),
    ],
)
def test_grounded_numbers_in_any_spelling(answer: str, evidence: Any) -> None:
    assert missing(answer, evidence) == []


@pytest.mark.parametrize(
    ("answer", "evidence", "flagged"),
    [
        ("It is 23.5 °C.", {"value": 21.37}, ["23.5 °C"]),
        ("It is 21.5 °C.", {"value": 21}, ["21.5 °C"]),  # more precise than the evidence
        (
            "It holds 40 people and is at 22 °C.",
            {"error": "Room not found"},
            ["40 people", "22 °C"],
        ),
        ("CO2 is 612 ppm.", {"readings": []}, ["612 ppm"]),
        # A reading needs a stated value: not a list's length, a timestamp's or an id's digits
        # (the 1.5B's "0.00 ppm (no sensor installed)" on 2026-12-02).
        (
            "The CO2 concentration is 0.00 ppm (no sensor installed).",
            {"room_id": "room-acme-labs-server", "sensors": [], "at": "2026-12-02T10:00:00Z"},
            ["0.00 ppm"],
        ),
        (
            "It holds 12 people.",
            {"room_id": "room-acme-tower-conf-12a", "capacity": None},
            ["12 people"],
        ),
        ("It reads 3 °C.", "[3] Sensors: readings arrive every minute.", ["3 °C"]),
        ("It is at 90% of capacity.", {"utilisation": 0.85}, ["90%"]),
    ],
)
def test_invented_numbers_are_flagged(answer: str, evidence: Any, flagged: list[str]) -> None:
    assert missing(answer, evidence) == flagged


def test_the_users_own_figures_may_be_repeated() -> None:
    question = "How did CO2 change over the last 8 hours in room-acme-tower-conf-12a?"
    answer = "Over the last 8 hours CO2 in room-acme-tower-conf-12a stayed near 598 ppm."
    assert missing(answer, {"mean": 598.4}, question=question) == []
    assert missing(answer, {"mean": 598.4}) == ["8 hours", "room-acme-tower-conf-12a"]


# --- what is not a claim -------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "Cooldown applies [^0123456789ab] and [1] and [chunk:abc-12].",
        "1. Lobby\n2. Cafeteria\n3) Conference room\n  10. Archive",
        "Steps: 1) open the page 2) click Export.",
        "There are four rooms and two sensors.",
        "The CO2 sensor and the PM2 meter use MQTT v5.",
        "See https://docs.example.com/v2/errors#e1033 for details.",
        "Use the door-counter and the sensor_type field of the sensor-service.",
        "",
    ],
)
def test_markers_numbering_words_and_plain_tokens_are_not_claims(answer: str) -> None:
    assert extract_claims(answer) == []


def test_codes_and_keys_are_ids_not_numbers() -> None:
    claims = extract_claims("CV-E1033 is raised after SENSOR_STALE_AFTER_SECONDS; see SP-25.")
    assert [(c.kind, c.text) for c in claims] == [
        ("id", "CV-E1033"),
        ("id", "SENSOR_STALE_AFTER_SECONDS"),
        ("id", "SP-25"),
    ]
    doc = "CV-E1033 Clock skew: INGEST_CLOCK_SKEW_TOLERANCE_SECONDS (300)."
    assert missing("CV-E1033 means more than 300 s of skew.", doc) == []
    assert missing("CV-E1034 means skew.", doc) == ["CV-E1034"]
    assert missing("Set ALERT_MAX_RATE.", doc) == ["ALERT_MAX_RATE"]


def test_a_version_is_grounded_only_by_the_same_string() -> None:
    """The 1.5B answered "firmware version 1.0" from a result with a floor of 1 (2026-12-02)."""
    result = '{"floor": 1, "sensors": [{"sensor_id": "sen-1", "sensor_type": "co2"}]}'
    assert missing("It runs firmware version 1.0.", result) == ["firmware version 1.0"]
    assert missing("It runs firmware 2.4.1 (release 7).", '{"firmware": "2.4.1"}') == ["release 7"]


def test_entity_ids_are_checked_whole() -> None:
    result = {"rooms": [{"room_id": "room-acme-tower-conf-12a", "name": "Conference Room 12A"}]}
    assert missing("Room room-acme-tower-conf-12a.", result) == []
    assert missing("Room ROOM-ACME-TOWER-CONF-12A.", result) == []
    assert missing("Room room-acme-tower-conf-12b.", result) == ["room-acme-tower-conf-12b"]
    assert missing("Building bld-acme-labs.", result) == ["bld-acme-labs"]


def test_room_designators_must_exist() -> None:
    result = {"rooms": [{"name": "Loading Dock A"}, {"name": "Conference Room 12A"}]}
    assert missing("Loading Dock A and Room 12A are busy.", result) == []
    assert missing("Loading Dock C is busy.", result) == ["Dock C"]
    assert missing("Room 12B is free.", result) == ["Room 12B"]


def test_known_names_must_come_from_the_evidence() -> None:
    evidence = build_evidence(['{"name": "Harbor Warehouse"}'], known_names=["Northwind HQ"])
    assert ungrounded("Harbor Warehouse is busy.", evidence) == []
    assert ungrounded("Northwind HQ is busy.", evidence) == ["Northwind HQ"]


# --- times and dates -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "Last reading at 14:05.",
        "Last reading at 14:05 UTC on 2025-03-04.",
        "Last reading at 2:05 pm.",
        "Last reading at 14:05:00.",
        "Last reading 2025-03-04T14:05:00Z.",
        "It peaked on March 4, 2025.",
    ],
)
def test_timestamps_ground_their_dates_and_clock_times(answer: str) -> None:
    assert missing(answer, {"timestamp": "2025-03-04T14:05:00Z"}) == []


def test_invented_times_are_flagged() -> None:
    result = {"timestamp": "2025-03-04T14:05:00Z"}
    assert missing("Last reading at 14:06.", result) == ["14:06"]
    assert missing("Last reading on 2025-03-05.", result) == ["2025-03-05"]
    assert missing("Counters reset at 3 am.", "DOOR_COUNTER_DRIFT_RESET_HOUR default `3`") == []


def test_normalize_is_nfkc_with_plain_dashes() -> None:
    assert normalize("21\u2009℃ \u2013 22\u00a0°C, \u22121") == "21 °C - 22 °C, -1"


# --- properties over generated answers -----------------------------------------------------

UNITS = ["", " °C", " ppm", " people", "%"]
VALUES = st.one_of(
    st.integers(min_value=0, max_value=999_999),
    st.decimals(min_value=0, max_value=9999, places=2, allow_nan=False, allow_infinity=False),
)


def spellings(value: Decimal | int) -> list[str]:
    """Ways an answer may write a number it read."""
    number = Decimal(value)
    out = [str(number), f"{number:,}", f"{number:.2f}", f"{number:,.2f}"]
    if number == number.to_integral_value():
        out.append(f"{number:.1f}")
    return out


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(VALUES, min_size=1, max_size=6),
    pick=st.integers(min_value=0),
    spelling=st.integers(min_value=0),
    unit=st.sampled_from(UNITS),
)
def test_any_number_copied_from_a_tool_result_is_grounded(
    values: list[Decimal | int], pick: int, spelling: int, unit: str
) -> None:
    result = {"readings": [{"value": float(v) if isinstance(v, Decimal) else v} for v in values]}
    chosen = values[pick % len(values)]
    written = spellings(chosen)[spelling % len(spellings(chosen))]
    assert missing(f"The reading is {written}{unit} [^abcdef123456].", result) == []


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=99), min_size=1, max_size=6),
    invented=st.integers(min_value=30_000, max_value=99_999),
    decimals=st.integers(min_value=0, max_value=2),
    unit=st.sampled_from(UNITS[:4]),
)
def test_any_number_not_in_the_evidence_is_flagged(
    values: list[int], invented: int, decimals: int, unit: str
) -> None:
    result = {"readings": [{"value": v, "timestamp": "2025-03-04T10:30:00Z"} for v in values]}
    # 300.00 up to 99,999: far from every evidence number (values, list length, 2025, 10, 30)
    written = f"{Decimal(invented).scaleb(-decimals):,}"
    assert missing(f"The reading is {written}{unit}.", result) == [f"{written}{unit}".strip()]


# --- false positives: the documentation's expected answers against their own pages ----------


def _facts() -> list[dict[str, Any]]:
    text = (ROOT / "documentation/FACTS.md").read_text(encoding="utf-8")
    data = yaml.safe_load(text.split("```yaml", 1)[1].split("```", 1)[0])
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "expected_answer" in node:
                found.append(node)
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(data)
    return found


def test_a_people_count_is_not_grounded_by_a_percentage() -> None:
    """The 1.5B answered "from 40 to 80 people" from "80% of derated capacity" (2026-12-02)."""
    page = "Dock Hall B warning (80% of derated capacity, i.e. 28 people): 40 x 0.85 = 34."
    answer = "It raises the capacity from 40 to 80 people; the warning fires at 80%."
    assert missing(answer, page) == ["80 people"]
    assert missing("Effective capacity 34 people, a warning at 28 people (80%).", page) == []
    assert missing("Keep humidity under 60 %RH.", "Humidity above 60 %RH raises an alert.") == []


def test_no_false_positives_on_the_documented_expected_answers() -> None:
    facts = _facts()
    assert len(facts) >= 10
    flagged = {}
    for fact in facts:
        pages = [fact["source"], *fact.get("also_in", [])]
        texts = [(ROOT / "documentation" / page).read_text(encoding="utf-8") for page in pages]
        evidence = build_evidence([*texts, fact.get("question", "")])
        bad = ungrounded(fact["expected_answer"], evidence)
        if bad:
            flagged[fact.get("id")] = bad
    assert flagged == {}


# --- the loop: repair once, else IDK ---------------------------------------------------------

QUESTION = "How many people does the Dispatch Office hold, and how warm is it?"
GET_ROOM = Call("get_room", {"room_id": "room-harbor-dispatch"})
GROUNDED = "The Dispatch Office (room-harbor-dispatch) is on floor 1 and holds 16 people."
INVENTED = "The Dispatch Office holds 30 people and is at 23.5 °C."


def done_of(events: list[AgentEvent]) -> DoneEvent:
    assert isinstance(events[-1], DoneEvent)
    assert sum(isinstance(e, DoneEvent) for e in events) == 1
    return events[-1]


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_a_grounded_answer_passes_untouched(mode: Mode, make_local_agent: Any) -> None:
    model = scripted(mode, GET_ROOM, Say(GROUNDED))
    answer = await make_local_agent(model).answer(QUESTION, NORTHWIND_STAFF)
    assert (answer.decision, answer.answer, answer.retrieval.ungrounded) == (
        "answered",
        GROUNDED,
        [],
    )
    assert len(model.requests) == 2 and not answer.notes


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_an_invented_figure_is_repaired_by_one_more_reply(
    mode: Mode, make_local_agent: Any
) -> None:
    model = scripted(mode, GET_ROOM, Say(INVENTED), Say(GROUNDED))
    answer = await make_local_agent(model).answer(QUESTION, NORTHWIND_STAFF)
    assert (answer.decision, answer.idk, answer.answer) == ("answered", False, GROUNDED)
    assert answer.retrieval.ungrounded == ["30 people", "23.5 °C"]
    assert any("answer repaired" in note for note in answer.notes)
    assert len(answer.usage.hops) == 3
    feedback = model.requests[-1].messages
    assert (feedback[-2].role, feedback[-2].content) == ("assistant", INVENTED)
    assert feedback[-1].role == "user"
    assert "do not appear in any tool result: 30 people; 23.5 °C" in (feedback[-1].content or "")
    model.assert_exhausted()


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_invented_twice_after_a_failed_tool_becomes_idk(
    mode: Mode, make_local_agent: Any
) -> None:
    """The small-model failure: a tool call fails and the answer invents a reading anyway."""
    model = scripted(
        mode,
        Call("get_latest_sensor_data", {"room_id": "room-harbor-nowhere"}),
        Say("Room room-harbor-nowhere is at 22 °C and holds 40 people."),
        Say("It is at 22 °C."),
    )
    answer = await make_local_agent(model).answer(
        "How warm is room-harbor-nowhere?", NORTHWIND_STAFF
    )
    assert not answer.tool_calls[0].ok
    assert (answer.decision, answer.idk, answer.answer) == ("idk", True, IDK_MARKER)
    assert answer.retrieval.ungrounded == ["22 °C", "40 people"]
    assert any("replaced by IDK" in note and "22 °C" in note for note in answer.notes)
    assert answer.citations == []


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize(
    ("overrides", "repaired"),
    [
        ({"plan_first": "on"}, False),  # auto: the small-model path answers IDK at once
        ({"plan_first": "on", "grounding_repair": "on"}, True),
        ({"grounding_repair": "off"}, False),
    ],
)
async def test_grounding_repair_setting(
    overrides: dict[str, str], repaired: bool, make_local_agent: Any
) -> None:
    model = scripted("json_schema", GET_ROOM, Say(INVENTED), *([Say(GROUNDED)] if repaired else []))
    answer = await make_local_agent(model, compose_answers=False, **overrides).answer(
        QUESTION, NORTHWIND_STAFF
    )
    assert answer.answer == (GROUNDED if repaired else IDK_MARKER)
    assert answer.retrieval.ungrounded == ["30 people", "23.5 °C"]
    model.assert_exhausted()  # no repair call where it is off


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_a_repair_that_says_idk_is_the_idk_answer(mode: Mode, make_local_agent: Any) -> None:
    model = scripted(mode, GET_ROOM, Say(INVENTED), Say(IDK_MARKER))
    answer = await make_local_agent(model).answer(QUESTION, NORTHWIND_STAFF)
    assert (answer.decision, answer.answer) == ("idk", IDK_MARKER)
    assert answer.retrieval.ungrounded == ["30 people", "23.5 °C"]


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_a_streamed_invented_answer_ends_with_the_corrected_done(
    mode: Mode, make_local_agent: Any
) -> None:
    for replies, expected in (((Say(GROUNDED),), GROUNDED), ((Say("It is 19 °C."),), IDK_MARKER)):
        model = scripted(mode, GET_ROOM, Say(INVENTED), *replies)
        agent: Agent = make_local_agent(model)
        events = [event async for event in agent.stream(QUESTION, NORTHWIND_STAFF)]
        streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert streamed == INVENTED  # already shown; the done answer supersedes it
        response = done_of(events).response
        assert response.answer == expected
        assert response.retrieval.ungrounded[:2] == ["30 people", "23.5 °C"]


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
async def test_greetings_and_idk_need_no_check(mode: Mode, make_local_agent: Any) -> None:
    for steps, decision in (
        ((Say("Hello! Ask me about your buildings."),), "answered"),
        ((Idk(), Idk()), "idk"),  # the second after the service's search (search_first)
    ):
        model = scripted(mode, *steps)
        answer = await make_local_agent(model).answer("Hi", NORTHWIND_STAFF)
        assert (answer.decision, answer.retrieval.ungrounded) == (decision, [])
        assert len(model.requests) == len(steps)


@pytest.mark.usefixtures("no_sockets")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("earlier", "now"),
    [
        ("How busy is Harbor Warehouse?", "Could 55 people work there?"),
        ("Could 55 people work at Harbor Warehouse?", "And what about the night shift?"),
    ],
    ids=["this question", "an earlier question"],
)
async def test_the_users_own_figures_are_evidence_in_a_conversation(
    mode: Mode, make_local_agent: Any, earlier: str, now: str
) -> None:
    """The figures the user typed, in this question or an earlier one, are theirs to repeat
    (the evidence once read only the conversation's first question, so a follow-up's own
    "55 people" was flagged as invented)."""
    said = "No: 55 people is above what the plan allows."
    answer = await make_local_agent(scripted(mode, Say(said))).answer(
        now, NORTHWIND_STAFF, earlier=[PriorTurn(earlier, "It is quiet.")]
    )
    assert (answer.decision, answer.answer, answer.retrieval.ungrounded) == ("answered", said, [])
