"""Tool calling through constrained JSON output, for small local models.

Small local models (Qwen2.5-Coder-1.5B on llama.cpp) do not fill ``tool_calls``, but they do
follow a JSON-schema ``response_format``. Each step the model emits one JSON object matching
one branch of a ``oneOf``:

* ``{"reason": "...", "tool": "<name>", "arguments": {...}}`` - one branch per tool, its
  ``arguments`` constrained by that tool's parameter schema;
* ``{"reason": "...", "final_answer": "..."}`` - the answer text;
* ``{"reason": "...", "decline": true}`` - out of scope; the service writes the refusal;
* ``{"reason": "...", "idk": true}`` - in scope but unanswerable; the service writes the IDK.

``reason`` is the FIRST property of every branch: a short rationale before the decision
measurably improves branch choice on a 1.5B model (NOTES.md). It is kept for traces only.

Tool results go back as plain ``user`` messages (see :func:`to_wire_messages`): no
``tools`` are declared in this mode, so ``tool`` roles and assistant ``tool_calls`` would be
refused by strict servers and are rendered unevenly by small models' chat templates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.llm.base import (
    ChatResult,
    MalformedReply,
    Message,
    ToolCall,
    ToolSpec,
    Usage,
)

SCHEMA_NAME = "agent_step"
REASON_SCHEMA: dict[str, Any] = {"type": "string", "description": "One short sentence: why."}

# Appended after the tool results of one step (a nudge small models need to stop calling tools).
DEFAULT_TOOL_RESULT_NOTE = (
    "Next step: call another tool only if you still need data; otherwise reply with "
    'final_answer, or with "idk": true if the results do not answer the question.'
)


def _branch(properties: dict[str, Any]) -> dict[str, Any]:
    props = {"reason": REASON_SCHEMA, **properties}
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


_DEF_KEYS = ("$defs", "definitions")


def _hoist_definitions(prefix: str, schema: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A tool's parameter schema nested under ``arguments``, with its ``$defs`` moved to the
    root (renamed ``<prefix>X``, refs rewritten): refs resolve against the document root."""

    def rewrite(node: Any) -> Any:
        if isinstance(node, Mapping):
            out: dict[str, Any] = {}
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str):
                    for def_key in _DEF_KEYS:
                        if value.startswith(f"#/{def_key}/"):
                            value = f"#/$defs/{prefix}{value[len(def_key) + 3 :]}"
                    out[key] = value
                else:
                    out[key] = rewrite(value)
            return out
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    definitions: dict[str, Any] = {}
    for def_key in _DEF_KEYS:
        for name, definition in (schema.get(def_key) or {}).items():
            definitions[prefix + name] = rewrite(definition)
    body = rewrite({k: v for k, v in schema.items() if k not in _DEF_KEYS})
    return body, definitions


def step_schema(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """The ``oneOf`` schema of one agent step: a branch per tool, then final_answer, decline
    and idk. Every branch lists ``reason`` first (llama.cpp keeps property order)."""
    branches = []
    definitions: dict[str, Any] = {}
    for tool in tools:
        arguments, tool_definitions = _hoist_definitions(
            f"{tool.name}__", tool.parameters or {"type": "object", "properties": {}}
        )
        definitions.update(tool_definitions)
        branches.append(
            _branch({"tool": {"type": "string", "const": tool.name}, "arguments": arguments})
        )
    # Small models rarely write inline [^id] markers; a sources list after the answer is a
    # slot they fill reliably. parse_step turns it into markers (validated like any other).
    branches.append(
        _branch(
            {
                "final_answer": {"type": "string"},
                "sources": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
            }
        )
    )
    branches.append(_branch({"decline": {"type": "boolean", "const": True}}))
    branches.append(_branch({"idk": {"type": "boolean", "const": True}}))
    schema: dict[str, Any] = {"type": "object", "oneOf": branches}
    if definitions:
        schema["$defs"] = definitions
    return schema


def response_format(tools: Sequence[ToolSpec], *, strict: bool = False) -> dict[str, Any]:
    """The ``response_format`` request field for this mode."""
    return {
        "type": "json_schema",
        "json_schema": {"name": SCHEMA_NAME, "strict": strict, "schema": step_schema(tools)},
    }


# --- the system-prompt part ------------------------------------------------------------------


@dataclass(frozen=True)
class WorkedExample:
    """One question and the exact JSON step the model should answer it with."""

    question: str
    step: Mapping[str, Any]


DEFAULT_EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample(
        "Hello!",
        {"reason": "a greeting", "final_answer": "Hello! How can I help you today?", "sources": []},
    ),
    WorkedExample(
        "What is the capital of France?",
        {"reason": "general knowledge, outside my scope", "decline": True},
    ),
    WorkedExample(
        "(after the tools returned nothing relevant)",
        {"reason": "the tools found nothing that answers this", "idk": True},
    ),
)


def _type_label(schema: Mapping[str, Any], definitions: Mapping[str, Any] | None = None) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str) and definitions is not None:
        target = definitions.get(ref.rsplit("/", 1)[-1])
        return _type_label(target) if isinstance(target, Mapping) else "object"
    if "enum" in schema and isinstance(schema["enum"], list):
        return "|".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        return f"array of {_type_label(schema['items'])}"
    return str(kind) if kind else "any"


def tool_signature(tool: ToolSpec) -> str:
    """``name(arg: type, optional?: type)``, from the tool's parameter schema."""
    properties = tool.parameters.get("properties") or {}
    required = set(tool.parameters.get("required") or ())
    definitions = {
        **(tool.parameters.get("definitions") or {}),
        **(tool.parameters.get("$defs") or {}),
    }
    args = []
    for name, schema in properties.items():
        label = _type_label(schema, definitions) if isinstance(schema, Mapping) else "any"
        args.append(f"{name}{'' if name in required else '?'}: {label}")
    return f"{tool.name}({', '.join(args)})"


def render_tool_prompt(
    tools: Sequence[ToolSpec],
    examples: Sequence[WorkedExample] = DEFAULT_EXAMPLES,
) -> str:
    """The json_schema-mode part of the system prompt: the reply format, the tool list (one
    line each) and one-line worked examples (question -> JSON step). Examples that name a tool
    not in ``tools`` are left out, so a per-user tool subset never shows a forbidden tool."""
    names = {tool.name for tool in tools}
    lines = [
        'Reply with exactly one JSON object per step. Start with a short "reason", then '
        "choose one:",
        '- {"reason": "...", "tool": "<tool name>", "arguments": {...}} to call one tool;',
        '- {"reason": "...", "final_answer": "...", "sources": ["<chunk_id>", ...]} to answer '
        "the user; sources lists the chunk_id of every search_docs result the answer uses "
        "([] when none);",
        '- {"reason": "...", "decline": true} when the question is outside your scope;',
        '- {"reason": "...", "idk": true} when the tools found nothing that answers it.',
    ]
    if tools:
        lines += ["", "Tools:"]
        for tool in tools:
            description = " ".join(tool.description.split())
            lines.append(
                f"- {tool_signature(tool)}: {description}"
                if description
                else f"- {tool_signature(tool)}"
            )
    shown = [ex for ex in examples if ex.step.get("tool") in (None, *names)]
    if shown:
        lines += ["", "Examples:"]
        for example in shown:
            step = json.dumps(dict(example.step), ensure_ascii=False)
            lines.append(f"{example.question} -> {step}")
    return "\n".join(lines)


# --- messages --------------------------------------------------------------------------------


def _arguments_object(raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw  # shown as the model wrote it


def to_wire_messages(
    messages: Sequence[Message], *, tool_result_note: str | None = DEFAULT_TOOL_RESULT_NOTE
) -> list[dict[str, Any]]:
    """Messages for a model that only knows system/user/assistant turns.

    * An assistant turn with tool calls becomes the JSON step it stood for
      (``{"tool": ..., "arguments": ...}``; one line per call).
    * An assistant text turn becomes ``{"final_answer": ...}``, the format the model replies in.
    * Consecutive ``tool`` messages become ONE user message: ``Result of <tool> (<call id>):``
      and the result text for each, then ``tool_result_note`` (a nudge towards answering).
    """
    wire: list[dict[str, Any]] = []
    pending: list[str] = []

    def flush_results() -> None:
        if pending:
            text = "\n\n".join(pending)
            if tool_result_note:
                text += "\n\n" + tool_result_note
            wire.append({"role": "user", "content": text})
            pending.clear()

    names: dict[str, str] = {}
    for message in messages:
        if message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "", "tool")
            label = f"{name} ({message.tool_call_id})" if message.tool_call_id else name
            pending.append(f"Result of {label}:\n{message.content or ''}")
            continue
        flush_results()
        if message.role == "assistant" and message.tool_calls:
            steps = []
            for call in message.tool_calls:
                names[call.id] = call.name
                step = {"tool": call.name, "arguments": _arguments_object(call.arguments)}
                steps.append(json.dumps(step, ensure_ascii=False))
            wire.append({"role": "assistant", "content": "\n".join(steps)})
        elif message.role == "assistant":
            content = json.dumps({"final_answer": message.content or ""}, ensure_ascii=False)
            wire.append({"role": "assistant", "content": content})
        else:
            wire.append({"role": message.role, "content": message.content or ""})
    flush_results()
    return wire


def prior_tool_calls(messages: Sequence[Message]) -> int:
    """How many tool calls the conversation already holds (numbers the next call ids)."""
    return sum(len(m.tool_calls) for m in messages if m.role == "assistant")


# --- parsing a step --------------------------------------------------------------------------

BranchKind = Literal["tool", "final_answer", "decline", "idk"]
_BRANCH_KEYS: tuple[BranchKind, ...] = ("tool", "final_answer", "decline", "idk")


def _strip_fences(text: str) -> str:
    text = text.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        if text.rstrip().endswith("```"):
            text = text.rstrip()[:-3]
    return text.strip()


def source_markers(answer: str, sources: object) -> str:
    """`` [^id]`` markers for the listed sources the answer does not already cite."""
    if not isinstance(sources, list):
        return ""
    markers = []
    for source in sources:
        if isinstance(source, str) and source.strip():
            marker = f"[^{source.strip()}]"
            if marker not in answer and marker not in markers:
                markers.append(marker)
    return (" " + " ".join(markers)) if markers else ""


def parse_step(
    content: str | None,
    tools: Sequence[ToolSpec],
    *,
    usage: Usage,
    model: str,
    finish_reason: str | None,
    call_number: int,
) -> ChatResult:
    """One JSON step -> ChatResult. Raises MalformedReply for invalid JSON, no or several
    branch keys, an unknown tool, or wrongly typed values (the loop feeds that back)."""
    text = _strip_fences(content or "")
    if not text:
        raise MalformedReply("the model returned no JSON step (empty content)")
    try:
        data = json.loads(text, strict=False)
    except ValueError as exc:
        hint = " (cut off by the output token limit?)" if finish_reason == "length" else ""
        raise MalformedReply(f"the model's step is not valid JSON{hint}: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedReply("the model's step must be a JSON object")
    present = [key for key in _BRANCH_KEYS if key in data]
    if len(present) != 1:
        expected = ", ".join(_BRANCH_KEYS)
        raise MalformedReply(f"the step must hold exactly one of {expected}; got {present}")
    reason_value = data.get("reason")
    reason = reason_value if isinstance(reason_value, str) else None
    branch = present[0]

    def result(kind: Any, text: str | None, calls: tuple[ToolCall, ...] = ()) -> ChatResult:
        return ChatResult(
            kind=kind,
            text=text,
            tool_calls=calls,
            usage=usage,
            model=model,
            finish_reason=finish_reason,
            reason=reason,
        )

    if branch == "tool":
        name = data["tool"]
        known = [tool.name for tool in tools]
        if not isinstance(name, str) or name not in known:
            raise MalformedReply(f"unknown tool {name!r}; available tools: {known}")
        arguments = data.get("arguments", {})
        if not isinstance(arguments, dict):
            raise MalformedReply(f"the arguments of {name} must be a JSON object")
        call = ToolCall(
            id=f"call_{call_number}",
            name=name,
            arguments=json.dumps(arguments, ensure_ascii=False),
        )
        return result("tool_calls", None, (call,))
    if branch == "final_answer":
        answer = data["final_answer"]
        if not isinstance(answer, str):
            raise MalformedReply("final_answer must be a string")
        return result("text", answer + source_markers(answer, data.get("sources")))
    if data[branch] is not True:
        raise MalformedReply(f'"{branch}" must be true')
    return result(branch, None)


# --- streaming the final answer --------------------------------------------------------------


def _is_high_surrogate(char: str) -> bool:
    return len(char) == 1 and 0xD800 <= ord(char) <= 0xDBFF


def _is_low_surrogate(char: str) -> bool:
    return len(char) == 1 and 0xDC00 <= ord(char) <= 0xDFFF


class FinalAnswerExtractor:
    """Incrementally pulls the decoded characters of the top-level ``final_answer`` string
    out of a JSON object arriving in arbitrary pieces (escapes and surrogate pairs split
    across pieces included). Everything else (reason, tool arguments) is skipped.

    The concatenated output equals ``json.loads(doc)["final_answer"]`` for a valid document;
    for an invalid one it is whatever came before the error (the caller discards it when the
    final parse raises MalformedReply).
    """

    def __init__(self, key: str = "final_answer") -> None:
        self._key = key
        self._depth = 0
        self._in_string = False
        self._role: Literal["key", "target", "other"] = "other"
        self._escape: str | None = None
        self._key_raw: list[str] = []
        self._last_key: str | None = None
        self._expect_key = False
        self._high: str | None = None  # a decoded high surrogate awaiting its pair
        self.found = False  # the target string has started
        self.done = False  # the target string has ended

    def feed(self, piece: str) -> str:
        out: list[str] = []
        for char in piece:
            if self._in_string:
                self._string_char(char, out)
            else:
                self._structural_char(char)
        return "".join(out)

    def _emit(self, text: str, out: list[str]) -> None:
        if self._high is not None:
            if text and _is_low_surrogate(text[0]):
                pair = (self._high + text[0]).encode("utf-16", "surrogatepass")
                out.append(pair.decode("utf-16"))
                text = text[1:]
            else:
                out.append(self._high)
            self._high = None
        if len(text) == 1 and _is_high_surrogate(text):
            self._high = text
        elif text:
            out.append(text)

    def _string_char(self, char: str, out: list[str]) -> None:
        if self._escape is not None:
            self._escape += char
            complete = (len(self._escape) == 2 and self._escape[1] != "u") or len(self._escape) == 6
            if not complete:
                return
            sequence, self._escape = self._escape, None
            if self._role == "key":
                self._key_raw.append(sequence)
            elif self._role == "target":
                try:
                    decoded = json.loads(f'"{sequence}"')
                except ValueError:
                    return
                self._emit(decoded, out)
            return
        if char == "\\":
            self._escape = "\\"
            return
        if char == '"':
            self._in_string = False
            if self._role == "key":
                try:
                    self._last_key = json.loads('"' + "".join(self._key_raw) + '"', strict=False)
                except ValueError:
                    self._last_key = None
            elif self._role == "target":
                if self._high is not None:
                    out.append(self._high)
                    self._high = None
                self.done = True
            return
        if self._role == "key":
            self._key_raw.append(char)
        elif self._role == "target":
            self._emit(char, out)

    def _structural_char(self, char: str) -> None:
        if char == '"':
            self._in_string = True
            if self._depth == 1 and self._expect_key:
                self._role = "key"
                self._key_raw = []
                self._expect_key = False
            elif self._depth == 1 and self._last_key == self._key and not self.done:
                self._role = "target"
                self.found = True
            else:
                self._role = "other"
        elif char in "{[":
            self._depth += 1
            if self._depth == 1 and char == "{":
                self._expect_key = True
        elif char in "}]":
            self._depth -= 1
        elif char == "," and self._depth == 1:
            self._expect_key = True
            self._last_key = None
