"""Versioned system prompts (``system_<version>.md`` + ``modes_<version>.json``) and the fixed
sentences the service detects or writes itself (defined in :mod:`agent.markers`).

The markdown is the prompt; ``modes_<version>.json`` holds the few sentences that differ per
tool-calling mode (native: the model writes the refusal/IDK sentence; json_schema: it picks
the ``decline``/``idk`` branch and the service writes the sentence) and the worked examples
shown in json_schema mode that are about no particular tool.

What the prompt says about a tool comes from the tools offered (``ToolSpec.guidance``, one
line each in place of ``{{tool_guidance}}``; ``ToolSpec.examples`` in place of the
``"{{tool_examples}}"`` entry of ``examples``), so adding a tool needs no prompt edit. A
version's own extra tool examples (``more_tool_examples``) follow that tool's examples.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from agent.llm.base import ToolSpec
from agent.llm.json_schema_mode import (
    ExampleItem,
    Slot,
    WorkedExample,
    render_tool_list,
    render_tool_prompt,
)
from agent.markers import DECLINE_TEXT, IDK_MARKER, REFUSAL_MARKER

__all__ = [
    "DECLINE_TEXT",
    "DEFAULT_VERSION",
    "IDK_MARKER",
    "PROMPT_DIR",
    "REFUSAL_MARKER",
    "Mode",
    "PromptError",
    "SystemPrompt",
    "is_idk",
    "is_refusal",
    "load_system_prompt",
]

PROMPT_DIR = Path(__file__).parent
DEFAULT_VERSION = "v1"

Mode = Literal["native", "json_schema"]
# A placeholder alone on its line (group 1) or inline (group 2).
_PLACEHOLDER = re.compile(r"^\{\{(\w+)\}\}\n|\{\{(\w+)\}\}", re.M)
_CONSTANTS = {"IDK_MARKER": IDK_MARKER, "REFUSAL_MARKER": REFUSAL_MARKER}


class PromptError(RuntimeError):
    """A prompt file is missing or refers to an unknown placeholder."""


def _fill(text: str, values: dict[str, str], source: str) -> str:
    def replace(match: re.Match[str]) -> str:
        own_line = match.group(1) is not None
        name = match.group(1) if own_line else match.group(2)
        if name not in values:
            raise PromptError(f"{source}: unknown placeholder {{{{{name}}}}}")
        if own_line:  # an empty value drops its line (e.g. no tool has guidance)
            return values[name] + "\n" if values[name] else ""
        return values[name]

    return _PLACEHOLDER.sub(replace, text)


@dataclass(frozen=True)
class SystemPrompt:
    version: str
    template: str
    rules: dict[str, dict[str, str]]
    examples: tuple[ExampleItem, ...]
    more_tool_examples: tuple[WorkedExample, ...] = ()
    # ``answer_<version>.md``: the short system message of a route the service searched up
    # front, in json_schema mode (None: those routes read the whole prompt); answer_tasks:
    # its opening sentence per kind of route (``modes_<version>.json``).
    answer_template: str | None = None
    answer_tasks: dict[str, str] = dataclasses.field(default_factory=dict)

    def render(self, mode: Mode, tools: Sequence[ToolSpec] = ()) -> str:
        """The system message for a tool-calling mode and the offered tools (their guidance
        lines; json_schema adds the step format, the tool list and worked examples)."""
        if mode not in self.rules:
            raise PromptError(f"prompt {self.version} has no rules for mode {mode!r}")
        rules = {
            k: _fill(v, _CONSTANTS, f"modes_{self.version}") for k, v in self.rules[mode].items()
        }
        values = {**_CONSTANTS, **rules, "tool_guidance": tool_guidance(tools)}
        text = _fill(self.template, values, f"system_{self.version}.md").strip()
        if mode == "json_schema":
            text += "\n\n" + render_tool_prompt(tools, self.examples, self.more_tool_examples)
        return text

    def render_answer(
        self, mode: Mode, tools: Sequence[ToolSpec] = (), *, live: bool = False
    ) -> str | None:
        """The system message of a model call after the service searched up front (routes
        that want documentation, json_schema mode only): the answer rules, the reply format
        and ``tools`` (what the route offers), without the scope rules the route already
        settled and the tools' worked examples. A fifth to a half of the whole prompt: on
        the local 1.5B a tail reads ~30% faster and a reply writes ~20% faster after ~600
        cached tokens than after ~2,400 (bench/RESULTS.md). ``live``: the route also looked
        up live data (its own opening sentence). None: no ``answer_<version>.md``, or native
        mode."""
        if mode != "json_schema" or self.answer_template is None:
            return None
        source = f"answer_{self.version}.md"
        task = self.answer_tasks.get("live" if live else "documentation")
        if task is None:
            raise PromptError(
                f"modes_{self.version}.json: answer_tasks lacks live or documentation"
            )
        values = {"tool_lines": render_tool_list(tools), "task": task}
        return _fill(self.answer_template, values, source).strip()


def tool_guidance(tools: Sequence[ToolSpec]) -> str:
    """The offered tools' guidance, one ``- `` line each, in prompt order."""
    ordered = sorted(tools, key=lambda spec: spec.prompt_order)
    return "\n".join(f"- {spec.guidance}" for spec in ordered if spec.guidance)


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
    examples = tuple(_example_item(item) for item in data.get("examples", []))
    more = tuple(WorkedExample(q, step) for q, step in data.get("more_tool_examples", []))
    template = template_path.read_text(encoding="utf-8")
    answer_path = PROMPT_DIR / f"answer_{version}.md"
    answer = answer_path.read_text(encoding="utf-8") if answer_path.is_file() else None
    tasks = {str(k): str(v) for k, v in data.get("answer_tasks", {}).items()}
    prompt = SystemPrompt(version, template, rules, examples, more, answer, tasks)
    for mode in ("native", "json_schema"):
        prompt.render(mode)  # fail fast on a missing mode or a bad placeholder
    for live in (False, True):
        prompt.render_answer("json_schema", live=live)
    return prompt


def _example_item(item: Any) -> ExampleItem:
    """``[question, step]``, or the ``"{{tool_examples}}"`` slot."""
    if isinstance(item, str):
        try:
            return Slot(item)
        except ValueError:
            raise PromptError(f"unknown examples entry {item!r}") from None
    question, step = item
    return WorkedExample(question, step)


def _normalise(text: str) -> str:
    return " ".join(text.replace("\u2019", "'").split()).strip().strip('"').strip()


def is_idk(text: str | None) -> bool:
    """The model answered with the IDK marker (possibly followed by more text)."""
    return bool(text) and _normalise(text or "").casefold().startswith(IDK_MARKER.casefold())


def is_refusal(text: str | None) -> bool:
    """The model's native-mode out-of-scope refusal (it starts with the marker sentence)."""
    return bool(text) and _normalise(text or "").casefold().startswith(REFUSAL_MARKER.casefold())
