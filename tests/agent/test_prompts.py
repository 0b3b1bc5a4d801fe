"""The versioned system prompt and the marker sentences the service detects."""

from __future__ import annotations

import pytest

from agent.llm.json_schema_mode import step_schema
from agent.prompts import (
    DECLINE_TEXT,
    IDK_MARKER,
    REFUSAL_MARKER,
    PromptError,
    is_idk,
    is_refusal,
    load_system_prompt,
)
from agent.tools import build_default_registry


def test_native_prompt_names_both_markers() -> None:
    text = load_system_prompt("v1").render("native")
    assert f'starts exactly with "{REFUSAL_MARKER}"' in text
    assert IDK_MARKER in text
    assert "{{" not in text
    for topic in ("math", "coding", "translation", "personal advice", "Greetings"):
        assert topic in text
    assert "[^" in text  # the citation format


def test_json_schema_prompt_has_the_step_format_and_examples() -> None:
    specs = build_default_registry().specs()
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
