"""Versioned system prompts (``system_<version>.md`` + ``modes_<version>.json``) and the fixed
sentences the service detects or writes itself.

The markdown is the prompt; ``modes_<version>.json`` holds the few sentences that differ per
tool-calling mode (native: the model writes the refusal/IDK sentence; json_schema: it picks
the ``decline``/``idk`` branch and the service writes the sentence) and the worked examples
shown in json_schema mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from agent.llm.base import ToolSpec
from agent.llm.json_schema_mode import WorkedExample, render_tool_prompt

PROMPT_DIR = Path(__file__).parent
DEFAULT_VERSION = "v1"

# Returned verbatim when the data does not answer the question (and on hop exhaustion).
IDK_MARKER = "I don't know based on the available CrowdVision data."
# Every out-of-scope refusal starts with this; the service detects it in native mode.
REFUSAL_MARKER = "I can only help with CrowdVision"
# What the service answers for a json_schema-mode ``decline`` step.
DECLINE_TEXT = (
    f"{REFUSAL_MARKER}: your buildings and rooms, live occupancy and sensors, "
    "and how the platform works."
)

Mode = Literal["native", "json_schema"]
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_CONSTANTS = {"IDK_MARKER": IDK_MARKER, "REFUSAL_MARKER": REFUSAL_MARKER}


class PromptError(RuntimeError):
    """A prompt file is missing or refers to an unknown placeholder."""


def _fill(text: str, values: dict[str, str], source: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise PromptError(f"{source}: unknown placeholder {{{{{name}}}}}")
        return values[name]

    return _PLACEHOLDER.sub(replace, text)


@dataclass(frozen=True)
class SystemPrompt:
    version: str
    template: str
    rules: dict[str, dict[str, str]]
    examples: tuple[WorkedExample, ...]

    def render(self, mode: Mode, tools: Sequence[ToolSpec] = ()) -> str:
        """The system message for a tool-calling mode (json_schema adds the step format, the
        tool list and worked examples for the offered tools)."""
        if mode not in self.rules:
            raise PromptError(f"prompt {self.version} has no rules for mode {mode!r}")
        rules = {
            k: _fill(v, _CONSTANTS, f"modes_{self.version}") for k, v in self.rules[mode].items()
        }
        text = _fill(self.template, {**_CONSTANTS, **rules}, f"system_{self.version}.md").strip()
        if mode == "json_schema":
            text += "\n\n" + render_tool_prompt(tools, self.examples)
        return text


@cache
def load_system_prompt(version: str = DEFAULT_VERSION) -> SystemPrompt:
    template_path = PROMPT_DIR / f"system_{version}.md"
    modes_path = PROMPT_DIR / f"modes_{version}.json"
    if not template_path.is_file() or not modes_path.is_file():
        raise PromptError(f"prompt version {version!r} not found in {PROMPT_DIR}")
    data: dict[str, Any] = json.loads(modes_path.read_text(encoding="utf-8"))
    rules: dict[str, dict[str, str]] = {
        mode: {str(k): str(v) for k, v in data[mode].items()}
        for mode in ("native", "json_schema")
        if mode in data
    }
    examples = tuple(WorkedExample(question, step) for question, step in data.get("examples", []))
    prompt = SystemPrompt(version, template_path.read_text(encoding="utf-8"), rules, examples)
    for mode in ("native", "json_schema"):
        prompt.render(mode)  # fail fast on a missing mode or a bad placeholder
    return prompt


def _normalise(text: str) -> str:
    return " ".join(text.replace("\u2019", "'").split()).strip().strip('"').strip()


def is_idk(text: str | None) -> bool:
    """The model answered with the IDK marker (possibly followed by more text)."""
    return bool(text) and _normalise(text or "").casefold().startswith(IDK_MARKER.casefold())


def is_refusal(text: str | None) -> bool:
    """The model's native-mode out-of-scope refusal (it starts with the marker sentence)."""
    return bool(text) and _normalise(text or "").casefold().startswith(REFUSAL_MARKER.casefold())
