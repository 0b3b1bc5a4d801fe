"""The small-model strategy's sensor vocabulary comes from the tools' schemas (issue 42, item 5):
a type the schema lists is read in questions, swapped in follow-ups and written in answers;
nothing of the sample estate's types is spelled out in the agent."""

from __future__ import annotations

from agent.llm.base import ToolSpec
from agent.small_model.composing import capabilities, sensor_word
from agent.small_model.followups import DeterministicRewriter
from agent.small_model.intents import live_intent, sensor_types
from agent.small_model.reading import QuestionReading
from agent.turns import PriorTurn
from tests.shipped_tools import shipped_registry


def _spec(name: str, types: list[str], answers: tuple[str, ...] = ()) -> ToolSpec:
    parameters = {
        "type": "object",
        "properties": {"room_id": {"type": "string"}, "sensor_type": {"enum": types}},
    }
    return ToolSpec(name=name, description="", parameters=parameters, answers=answers)


def test_the_types_are_the_schemas_enum_without_what_a_tool_answers_alone() -> None:
    types = sensor_types(shipped_registry().specs())
    assert types and "occupancy" not in types  # get_room_occupancy answers occupancy
    specs = [
        _spec("latest", ["noise_level", "pm2_5", "occupancy"]),
        _spec("count", [], ("occupancy",)),
    ]
    assert sensor_types(specs) == ("noise_level", "pm2_5")


def test_a_type_only_another_tool_set_lists_is_read_from_the_question() -> None:
    types = ("noise_level", "pm2_5")
    intent = live_intent("What is the noise level in the atrium right now?", types)
    assert (intent.sensor_type, intent.reading) == ("noise_level", True)
    assert live_intent("What is the noise level in the atrium right now?", ()).sensor_type is None
    reading = QuestionReading.of("How high is pm2 5 there?", [], types)
    assert reading.live_words


def test_a_follow_up_swaps_a_type_the_tools_list() -> None:
    earlier = PriorTurn("What is the noise level in room 4711?", "41 dBA.", (("room", "4711"),))
    rewrite = DeterministicRewriter().rewrite_now(
        "and pm2_5?", [earlier], measures=("noise_level", "pm2_5")
    )
    assert rewrite.query == "What is the pm2_5 in room 4711?"


def test_types_are_written_as_words() -> None:
    assert [sensor_word(t) for t in ("door_counter", "co2", "pm2_5")] == [
        "door counter",
        "CO2",
        "PM2 5",
    ]
    assert "(noise level)" in capabilities(("noise_level",))
