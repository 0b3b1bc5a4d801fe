"""The json_schema tool-calling mode's pure parts: schema, prompt text, step parsing and the
incremental final_answer extractor."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.llm.base import MalformedReply, Message, ToolCall, ToolExample, ToolSpec, Usage
from agent.llm.json_schema_mode import (
    DEFAULT_EXAMPLES,
    FINAL_ANSWER_MAX_CHARS,
    FinalAnswerExtractor,
    WorkedExample,
    parse_step,
    render_tool_prompt,
    step_schema,
    to_wire_messages,
    tool_signature,
    whole_sentences,
)
from agent.markers import IDK_MARKER

OCCUPANCY = ToolSpec(
    "get_room_occupancy",
    "Live occupancy\n   of a room.",
    {
        "type": "object",
        "properties": {"room_id": {"type": "string"}, "window": {"enum": ["now", "hour"]}},
        "required": ["room_id"],
    },
)
BUILDINGS = ToolSpec("list_buildings", "The buildings you can see.", {})


def test_schema_branches() -> None:
    schema = step_schema([OCCUPANCY, BUILDINGS])
    assert schema["type"] == "object"
    branches = schema["oneOf"]
    assert len(branches) == 5
    assert branches[1]["properties"]["arguments"] == {"type": "object", "properties": {}}
    assert [next(iter(b["properties"])) for b in branches] == ["reason"] * 5


def test_schema_hoists_tool_definitions_to_the_root() -> None:
    """Pydantic puts enums and nested models under $defs; nested under "arguments", their
    "#/$defs/..." refs would resolve against the response schema's root."""
    tool = ToolSpec(
        "history",
        "",
        {
            "type": "object",
            "properties": {
                "kind": {"$ref": "#/$defs/Kind"},
                "window": {"$ref": "#/definitions/Window"},
            },
            "$defs": {"Kind": {"enum": ["co2", "temperature"], "type": "string"}},
            "definitions": {
                "Window": {"type": "object", "properties": {"k": {"$ref": "#/$defs/Kind"}}}
            },
        },
    )
    schema = step_schema([tool, OCCUPANCY])
    arguments = schema["oneOf"][0]["properties"]["arguments"]
    assert "$defs" not in arguments and "definitions" not in arguments
    assert arguments["properties"]["kind"] == {"$ref": "#/$defs/history__Kind"}
    assert arguments["properties"]["window"] == {"$ref": "#/$defs/history__Window"}
    assert schema["$defs"] == {
        "history__Kind": {"enum": ["co2", "temperature"], "type": "string"},
        "history__Window": {
            "type": "object",
            "properties": {"k": {"$ref": "#/$defs/history__Kind"}},
        },
    }
    assert "$defs" not in step_schema([OCCUPANCY])
    assert tool_signature(tool) == 'history(kind?: "co2"|"temperature", window?: object)'


def test_tool_signature_and_prompt() -> None:
    assert tool_signature(OCCUPANCY) == 'get_room_occupancy(room_id: string, window?: "now"|"hour")'
    assert tool_signature(BUILDINGS) == "list_buildings()"
    lobby = WorkedExample(
        "How full is the lobby?",
        {"reason": "live data", "tool": "get_room_occupancy", "arguments": {"room_id": "lobby"}},
    )
    hidden = WorkedExample("Ingest now", {"reason": "admin", "tool": "ingest", "arguments": {}})
    prompt = render_tool_prompt([OCCUPANCY, BUILDINGS], [*DEFAULT_EXAMPLES, lobby, hidden])
    assert (
        '- get_room_occupancy(room_id: string, window?: "now"|"hour"): Live occupancy of a room.'
        in prompt
    )
    assert "- list_buildings(): The buildings you can see." in prompt
    assert (
        'How full is the lobby? -> {"reason": "live data", "tool": "get_room_occupancy", '
        '"arguments": {"room_id": "lobby"}}' in prompt
    )
    assert '"decline": true' in prompt and '"idk": true' in prompt
    assert "ingest" not in prompt  # an example for a tool this user does not have
    for line in prompt.splitlines():
        if " -> " in line:
            json.loads(line.split(" -> ", 1)[1])  # every example is valid JSON


def test_tools_own_examples_fill_the_slot_in_prompt_order() -> None:
    def spec(name: str, order: int) -> ToolSpec:
        example = ToolExample(f"Ask {name}?", f"needs {name}", {"q": name})
        return ToolSpec(name, f"The {name} tool.", {}, examples=(example,), prompt_order=order)

    more = WorkedExample("Ask b again?", {"reason": "b too", "tool": "b", "arguments": {}})
    prompt = render_tool_prompt([spec("b", 2), spec("a", 1)], DEFAULT_EXAMPLES, [more])
    questions = [line.split(" -> ")[0] for line in prompt.splitlines() if " -> " in line]
    assert questions == [
        "Hello!",
        "What is the capital of France?",
        "Ask a?",
        "Ask b?",
        "Ask b again?",
        "(after the tools returned nothing relevant)",
    ]
    assert 'Ask a? -> {"reason": "needs a", "tool": "a", "arguments": {"q": "a"}}' in prompt
    assert "Ask b again?" not in render_tool_prompt([spec("a", 1)], DEFAULT_EXAMPLES, [more])
    slotless = render_tool_prompt([spec("a", 1)], [DEFAULT_EXAMPLES[0]])
    assert slotless.splitlines()[-1].startswith("Ask a? -> ")  # no slot: tools' at the end


@pytest.mark.parametrize(
    ("step", "kind", "text"),
    [
        ('{"reason": "off-topic", "decline": true}', "refusal", None),
        ('{"reason": "nothing found", "idk": true}', "text", IDK_MARKER),
    ],
)
def test_decline_and_idk_steps_are_mode_neutral_replies(
    step: str, kind: str, text: str | None
) -> None:
    result = _parse(step)
    assert (result.kind, result.text, result.tool_calls) == (kind, text, ())
    assert result.reason == json.loads(step)["reason"]


def test_wire_messages_merge_consecutive_tool_results() -> None:
    calls = (ToolCall("call_1", "a", '{"x": 1}'), ToolCall("call_2", "b", "not json"))
    wire = to_wire_messages(
        [
            Message("user", "q"),
            Message("assistant", tool_calls=calls),
            Message("tool", "r1", tool_call_id="call_1"),
            Message("tool", "r2", tool_call_id="call_2", name="b"),
            Message("assistant", "final words"),
        ],
        tool_result_note=None,
    )
    assert wire == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": '{"tool": "a", "arguments": {"x": 1}}\n'
            '{"tool": "b", "arguments": "not json"}',
        },
        {"role": "user", "content": "Result of a (call_1):\nr1\n\nResult of b (call_2):\nr2"},
        {"role": "assistant", "content": '{"final_answer": "final words"}'},
    ]


def _parse(content: str) -> Any:
    return parse_step(
        content, [OCCUPANCY], usage=Usage(), model="m", finish_reason="stop", call_number=3
    )


def test_parse_step_tolerates_a_code_fence() -> None:
    result = _parse('```json\n{"reason": "r", "tool": "get_room_occupancy", "arguments": {}}\n```')
    assert result.tool_calls == (ToolCall("call_3", "get_room_occupancy", "{}"),)


def test_parse_step_truncated_mentions_the_length_limit() -> None:
    with pytest.raises(MalformedReply, match="output token limit"):
        parse_step(
            '{"reason": "r", "final_ans',
            [],
            usage=Usage(),
            model="m",
            finish_reason="length",
            call_number=1,
        )
    with pytest.raises(MalformedReply, match="empty"):
        _parse("  ")
    with pytest.raises(MalformedReply, match="must be true"):
        _parse('{"reason": "r", "decline": false}')


def test_a_final_answer_cut_by_the_length_cap_keeps_its_whole_sentences() -> None:
    final = step_schema([])["oneOf"][0]["properties"]["final_answer"]
    assert final["maxLength"] == FINAL_ANSWER_MAX_CHARS  # the grammar ends a rambling answer
    sentence = "The default is 2000 points per request. "
    capped = (sentence * 20)[:FINAL_ANSWER_MAX_CHARS]
    step = json.dumps({"reason": "r", "final_answer": capped, "sources": []})
    answer = _parse(step).text
    assert answer is not None and answer.endswith("request.")
    assert len(answer) == len(sentence) * (FINAL_ANSWER_MAX_CHARS // len(sentence)) - 1
    # one long sentence: its whole words and an ellipsis; a shorter answer is left alone
    words = ("word " * 100)[: FINAL_ANSWER_MAX_CHARS - 2]  # ends mid-word
    assert whole_sentences(words, len(words)) == ("word " * 63).rstrip() + " …"
    assert whole_sentences("Short. Answer") == "Short. Answer"


def _feed_in_pieces(document: str, cuts: list[int]) -> str:
    extractor = FinalAnswerExtractor()
    bounds = sorted({c % (len(document) + 1) for c in cuts} | {0, len(document)})
    return "".join(extractor.feed(document[a:b]) for a, b in itertools.pairwise(bounds))


ANSWERS = st.text(
    alphabet=st.characters(codec="utf-8") | st.sampled_from(['"', "\\", "\n", "😀", "\u2028"]),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    answer=ANSWERS,
    reason=ANSWERS,
    ascii_only=st.booleans(),
    answer_first=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_extractor_streams_exactly_the_final_answer(
    answer: str, reason: str, ascii_only: bool, answer_first: bool, cuts: list[int]
) -> None:
    fields: dict[str, Any] = {"reason": reason, "final_answer": answer}
    if answer_first:
        fields = {"final_answer": answer, "reason": reason}
    fields["extra"] = {"final_answer": "nested, not streamed", "list": ["final_answer"]}
    document = json.dumps(fields, ensure_ascii=ascii_only, indent=None)
    assert _feed_in_pieces(document, cuts) == answer


def test_extractor_ignores_other_branches_and_nested_keys() -> None:
    extractor = FinalAnswerExtractor()
    document = json.dumps(
        {"reason": "final_answer", "tool": "x", "arguments": {"final_answer": "no"}}
    )
    assert extractor.feed(document) == ""
    assert not extractor.found
    done = FinalAnswerExtractor()
    assert done.feed('{"final_answer": "a\\u00e9b", "idk": true}') == "aéb"
    assert done.found and done.done


def test_sources_become_citation_markers_once() -> None:
    from agent.llm.base import Usage
    from agent.llm.json_schema_mode import parse_step, source_markers

    step = (
        '{"reason": "docs", "final_answer": "Cooldown is 15 minutes [^aaa111].", '
        '"sources": ["aaa111", "bbb222", "bbb222", " "]}'
    )
    result = parse_step(step, [], usage=Usage(), model="m", finish_reason="stop", call_number=1)
    assert result.text == "Cooldown is 15 minutes [^aaa111]. [^bbb222]"
    assert source_markers("x", None) == ""
    assert source_markers("x", "not a list") == ""


def test_source_labels_are_offered_and_cited_as_chunk_ids() -> None:
    labels = {"1": "aaa111", "2": "bbb222"}
    schema = step_schema([], {"chunk": ("aaa111", "bbb222", "ccc333")}, source_labels=labels)
    (answer_branch,) = [b for b in schema["oneOf"] if "final_answer" in b["properties"]]
    # A labelled chunk is offered by its label, an unlabelled one (a later search) by its id.
    assert answer_branch["properties"]["sources"]["items"]["enum"] == ["1", "2", "ccc333"]

    step = '{"reason": "docs", "final_answer": "It is 15 minutes [^2].", "sources": ["1", "2"]}'
    result = parse_step(
        step,
        [],
        usage=Usage(),
        model="m",
        finish_reason="stop",
        call_number=1,
        source_labels=labels,
    )
    assert result.text == "It is 15 minutes [^bbb222]. [^aaa111]"


def test_a_user_turn_after_results_replaces_the_note_in_one_message() -> None:
    wire = to_wire_messages(
        [
            Message("user", "q"),
            Message("assistant", tool_calls=(ToolCall("c1", "a", "{}"),)),
            Message("tool", "r1", tool_call_id="c1"),
            Message("user", "The question was: q"),
        ],
        tool_result_note="Next step: ...",
    )
    assert wire[-1] == {"role": "user", "content": "Result of a (c1):\nr1\n\nThe question was: q"}
    assert len(wire) == 3
