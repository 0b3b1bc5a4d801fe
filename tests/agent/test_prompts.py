"""The versioned system prompt and the marker sentences the service detects."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from agent.llm.base import ToolExample, ToolSpec
from agent.llm.json_schema_mode import response_format, step_schema
from agent.prompts import (
    DECLINE_TEXT,
    IDK_MARKER,
    REFUSAL_MARKER,
    Mode,
    PromptError,
    is_idk,
    is_refusal,
    load_system_prompt,
)
from agent.tools import Tool
from tests.shipped_tools import SHIPPED_TOOLS, shipped_registry

# sha256 of the renderings with the default registry, recorded BEFORE the per-tool prompt text
# (guidance lines, worked examples) moved onto the tool classes: moving it changed no byte.
# The json_schema ones changed since: the occupancy example no longer shows a reading time
# (the 1.5B copied "09:15 UTC" into its answers).
PINNED_PROMPTS = {
    ("v1", "native"): "53dc45cd0967167ea7983cba43a7fd13209a3200276c903b1065ab42d4411205",
    ("v1", "json_schema"): "182b44b9b5a5a3be4be3471ae3e14646ec5ea29afab559af830a74609117f6f3",
    ("v2", "native"): "4151b704cc019e59e8d4b9bcbffd8785516e5a17bd68066531825b3be94abf75",
    ("v2", "json_schema"): "55795f8ff8790b50cd4396efde0082e550fb35fadd88efbf752333bc6f80c7b5",
}
PINNED_RESPONSE_FORMATS = {
    False: "9c316b721d087837165e269a70ec230653cbd7cd36ac2119146c7df07919b806",
    True: "ba9df36a3788a39395c4a7299e28da9a9fb6ee7403ce758a03aecb6c059bc9e3",
}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(("version", "mode"), sorted(PINNED_PROMPTS))
def test_rendered_prompts_are_pinned(version: str, mode: Mode) -> None:
    text = load_system_prompt(version).render(mode, shipped_registry().specs())
    digest = sha256(text)
    assert digest == PINNED_PROMPTS[(version, mode)], f"the prompt changed; now {digest}"


@pytest.mark.parametrize("strict", [False, True])
def test_response_format_is_pinned(strict: bool) -> None:
    schema = response_format(shipped_registry().specs(), strict=strict)
    digest = sha256(json.dumps(schema))
    assert digest == PINNED_RESPONSE_FORMATS[strict], f"the schema changed; now {digest}"


def test_what_the_prompt_says_about_a_tool_comes_from_the_tool() -> None:
    specs = shipped_registry().specs()
    new = ToolSpec(
        "get_floor",
        "One floor of a building.",
        {"type": "object", "properties": {"floor": {"type": "integer"}}, "required": ["floor"]},
        guidance="Floors: get_floor.",
        examples=(ToolExample("What is on floor 2?", "a floor", {"floor": 2}),),
        prompt_order=15,  # between list_buildings (10) and get_building (20)
    )
    prompt = load_system_prompt()
    for mode in ("native", "json_schema"):
        lines = prompt.render(mode, [*specs, new]).splitlines()
        guidance = lines.index("- Floors: get_floor.")
        assert lines[guidance - 1].startswith("- Resolve a building name with list_buildings")
        assert "- Floors: get_floor." not in prompt.render(mode, specs)
    text = prompt.render("json_schema", [*specs, new])
    step = '{"reason": "a floor", "tool": "get_floor", "arguments": {"floor": 2}}'
    assert f"What is on floor 2? -> {step}" in text
    assert text.index("How busy is Riverside") < text.index("What is on floor 2?")
    assert text.index("What is on floor 2?") < text.index("Which rooms are in building")


@pytest.mark.parametrize("tool", SHIPPED_TOOLS)
def test_every_worked_example_is_a_valid_call(tool: type[Tool[Any, Any]]) -> None:
    for example in tool.examples:
        tool.args_model.model_validate(dict(example.arguments))


def test_a_tool_not_offered_leaves_no_trace_in_the_prompt() -> None:
    specs = [s for s in shipped_registry().specs() if s.name != "list_sensors"]
    for version in ("v1", "v2"):
        text = load_system_prompt(version).render("json_schema", specs)
        assert "list_sensors" not in text
        assert "Does building bld-123 have humidity sensors?" not in text


def test_v2_extra_examples_follow_search_docs_own() -> None:
    text = load_system_prompt("v2").render("json_schema", shipped_registry().specs())
    own, extra = text.index("How do I set up an occupancy alert?"), text.index("GW-201 mean?")
    assert own < extra < text.index("(after the tools returned nothing")
    no_docs = [s for s in shipped_registry().specs() if s.name != "search_docs"]
    assert "GW-201 mean?" not in load_system_prompt("v2").render("json_schema", no_docs)


def test_native_prompt_names_both_markers() -> None:
    text = load_system_prompt("v1").render("native")
    assert f'starts exactly with "{REFUSAL_MARKER}"' in text
    assert IDK_MARKER in text
    assert "{{" not in text
    for topic in ("math", "coding", "translation", "personal advice", "Greetings"):
        assert topic in text
    assert "[^" in text  # the citation format


def test_json_schema_prompt_has_the_step_format_and_examples() -> None:
    specs = shipped_registry().specs()
    text = load_system_prompt().render("json_schema", specs)
    assert '"decline": true' in text and '"idk": true' in text
    assert IDK_MARKER not in text  # the service writes the IDK text in this mode
    for spec in specs:
        assert f"- {spec.name}(" in text
    assert text.count(" -> {") >= 8  # worked examples
    # every example step matches the schema's branch keys
    assert step_schema(specs)["oneOf"]


def test_unknown_version_fails() -> None:
    with pytest.raises(PromptError):
        load_system_prompt("v999")


def test_decline_text_starts_with_the_marker() -> None:
    assert DECLINE_TEXT.startswith(REFUSAL_MARKER)
    assert is_refusal(DECLINE_TEXT)


@pytest.mark.parametrize(
    ("text", "idk", "refusal"),
    [
        (IDK_MARKER, True, False),
        (f'  "{IDK_MARKER}" ', True, False),
        (IDK_MARKER.replace("'", "\u2019"), True, False),
        ("I can only help with CrowdVision questions.", False, True),
        ("i can only help with crowdvision.", False, True),
        ("Harbor Warehouse has 4 rooms.", False, False),
        ("I don't know.", False, False),
        ("", False, False),
        (None, False, False),
    ],
)
def test_marker_detection(text: str | None, idk: bool, refusal: bool) -> None:
    assert is_idk(text) is idk
    assert is_refusal(text) is refusal


def test_the_documentation_answer_prompt_is_json_schema_only_and_lists_the_offered_tools() -> None:
    prompt = load_system_prompt("v1")
    specs = shipped_registry().specs()
    search = [spec for spec in specs if spec.name == "search_docs"]
    text = prompt.render_answer("json_schema", search)
    assert text is not None and "{{" not in text
    assert "- search_docs(query: string):" in text and "get_room" not in text
    assert '"idk": true' in text and '"decline": true' in text
    assert prompt.render_answer("native", search) is None  # a provider reads it all
    # A version without answer_<version>.md: documentation routes read the whole prompt.
    assert load_system_prompt("v2").render_answer("json_schema", search) is None


def test_the_two_answer_prompts_open_differently() -> None:
    """llama.cpp keeps a slot's prompt that shares most of a new prompt's start (reading the
    rest again) instead of restoring the full match from its RAM cache: the documentation
    and the live answer prompts must part within their first words."""
    prompt = load_system_prompt("v1")
    specs = shipped_registry().specs()
    docs = prompt.render_answer("json_schema", specs) or ""
    live = prompt.render_answer("json_schema", specs, live=True) or ""
    shared = next(i for i, (a, b) in enumerate(zip(docs, live, strict=False)) if a != b)
    assert shared < 40
