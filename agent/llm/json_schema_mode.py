"""Tool calling through constrained JSON output, for small local models.

Small local models (Qwen2.5-Coder-1.5B on llama.cpp) do not fill ``tool_calls``, but they do
follow a JSON-schema ``response_format``. Each step the model emits one JSON object matching
one branch of a ``oneOf``:

* ``{"reason": "...", "tool": "<name>", "arguments": {...}}`` - one branch per tool, its
  ``arguments`` constrained by that tool's parameter schema;
* ``{"reason": "...", "final_answer": "..."}`` - the answer text;
* ``{"reason": "...", "decline": true}`` - out of scope: a ``refusal`` reply (the service
  writes the refusal text);
* ``{"reason": "...", "idk": true}`` - in scope but unanswerable: a ``text`` reply holding
  the IDK sentence (:data:`agent.markers.IDK_MARKER`), as a native model would write it.

``reason`` is the FIRST property of every branch: a short rationale before the decision
measurably improves branch choice on a 1.5B model (NOTES.md). It is kept for traces only.

Tool results go back as plain ``user`` messages (see :func:`to_wire_messages`): no
``tools`` are declared in this mode, so ``tool`` roles and assistant ``tool_calls`` would be
refused by strict servers and are rendered unevenly by small models' chat templates.

:class:`JsonSchemaMode` is this mode's ``ModeAdapter`` for ``OpenAICompatibleClient``: no
``tools`` are sent, the ``response_format`` constrains each reply to one step, and streaming
yields the ``final_answer`` string's characters as ``TextDelta`` while they arrive (an
incremental JSON string extractor); a tool step yields one ``ToolCallDelta`` at the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    MalformedReply,
    Message,
    ReplyKind,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolExample,
    ToolSpec,
    Usage,
)
from agent.llm.modes import ModeAdapter, ReplyMeta, prior_tool_calls
from agent.markers import IDK_MARKER

__all__ = [
    "DEFAULT_EXAMPLES",
    "DEFAULT_TOOL_RESULT_NOTE",
    "ExampleItem",
    "FinalAnswerExtractor",
    "JsonSchemaMode",
    "Slot",
    "WorkedExample",
    "constrain_arguments",
    "parse_step",
    "prior_tool_calls",
    "render_tool_list",
    "render_tool_prompt",
    "response_format",
    "source_markers",
    "step_schema",
    "to_wire_messages",
    "tool_examples",
    "tool_signature",
]

SCHEMA_NAME = "agent_step"
# The longest final answer the grammar lets the model write (characters). Answers asked for
# in "one or two short sentences" run 50-270 characters; the odd one that rambles on (475, 37
# s) is what sets the p95 on 2 cores, at ~7 generated tokens/s. A capped answer keeps its
# whole sentences (``whole_sentences``).
FINAL_ANSWER_MAX_CHARS = 320
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


def _constrain_value(schema: Mapping[str, Any], values: tuple[str, ...]) -> dict[str, Any]:
    """A string (or array-of-strings) property schema limited to ``values``."""
    out = dict(schema)
    if out.get("type") == "array" and isinstance(out.get("items"), Mapping):
        out["items"] = _constrain_value(out["items"], values)
        return out
    if "anyOf" in out and isinstance(out["anyOf"], list):
        out["anyOf"] = [_constrain_value(branch, values) for branch in out["anyOf"]]
        return out
    for key in ("minLength", "maxLength", "pattern"):
        out.pop(key, None)  # the enum says it all; fewer grammar rules
    out["enum"] = list(values)
    return out


def constrain_arguments(
    arguments: Mapping[str, Any],
    entity_arguments: Mapping[str, str],
    choices: Mapping[str, tuple[str, ...]],
) -> dict[str, Any] | None:
    """The tool's ``arguments`` schema with every entity-id argument limited to this
    request's resolved ids (``enum``), so the model cannot produce an invented id. None when
    a required id has no allowed value: the tool cannot be called validly this step."""
    properties = dict(arguments.get("properties") or {})
    required = list(arguments.get("required") or ())
    for name, kind in entity_arguments.items():
        if name not in properties or kind not in choices:
            continue
        values = choices[kind]
        if values:
            properties[name] = _constrain_value(properties[name], values)
        elif name in required:
            return None
        else:
            del properties[name]
    return {**arguments, "properties": properties}


def _sources_schema(
    choices: Mapping[str, tuple[str, ...]], source_labels: Mapping[str, str]
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": {"type": "string"}, "maxItems": 8}
    if "chunk" in choices:
        label_of = {chunk_id: label for label, chunk_id in source_labels.items()}
        shown = [label_of.get(chunk_id, chunk_id) for chunk_id in choices["chunk"]]
        if shown:
            schema["items"] = {"type": "string", "enum": list(dict.fromkeys(shown))}
        else:
            schema = {"type": "array", "maxItems": 0}
    return schema


def step_schema(
    tools: Sequence[ToolSpec],
    choices: Mapping[str, tuple[str, ...]] | None = None,
    *,
    allow_refusal: bool = True,
    source_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``oneOf`` schema of one agent step: a branch per tool, then final_answer, decline
    and idk. Every branch lists ``reason`` first (llama.cpp keeps property order).

    ``choices`` (``ChatRequest.choices``) limits entity ids and ``sources`` to what this
    request has resolved (a chunk with a label in ``source_labels`` is cited by its label);
    ``allow_refusal=False`` leaves the decline branch out."""
    choices = choices or {}
    branches = []
    definitions: dict[str, Any] = {}
    for tool in tools:
        arguments, tool_definitions = _hoist_definitions(
            f"{tool.name}__", tool.parameters or {"type": "object", "properties": {}}
        )
        constrained = constrain_arguments(arguments, tool.entity_arguments, choices)
        if constrained is None:
            continue
        definitions.update(tool_definitions)
        branches.append(
            _branch({"tool": {"type": "string", "const": tool.name}, "arguments": constrained})
        )
    # Small models rarely write inline [^id] markers; a sources list after the answer is a
    # slot they fill reliably. parse_step turns it into markers (validated like any other).
    branches.append(
        _branch(
            {
                "final_answer": {"type": "string", "maxLength": FINAL_ANSWER_MAX_CHARS},
                "sources": _sources_schema(choices, source_labels or {}),
            }
        )
    )
    if allow_refusal:
        branches.append(_branch({"decline": {"type": "boolean", "const": True}}))
    branches.append(_branch({"idk": {"type": "boolean", "const": True}}))
    schema: dict[str, Any] = {"type": "object", "oneOf": branches}
    if definitions:
        schema["$defs"] = definitions
    return schema


def response_format(
    tools: Sequence[ToolSpec],
    *,
    strict: bool = False,
    choices: Mapping[str, tuple[str, ...]] | None = None,
    allow_refusal: bool = True,
    source_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``response_format`` request field for this mode."""
    schema = step_schema(tools, choices, allow_refusal=allow_refusal, source_labels=source_labels)
    return {
        "type": "json_schema",
        "json_schema": {"name": SCHEMA_NAME, "strict": strict, "schema": schema},
    }


# --- the system-prompt part ------------------------------------------------------------------


@dataclass(frozen=True)
class WorkedExample:
    """One question and the exact JSON step the model should answer it with."""

    question: str
    step: Mapping[str, Any]


class Slot(Enum):
    """In an examples list: where the offered tools' own examples (``ToolSpec.examples``) go."""

    TOOL_EXAMPLES = "{{tool_examples}}"


ExampleItem = WorkedExample | Slot

DEFAULT_EXAMPLES: tuple[ExampleItem, ...] = (
    WorkedExample(
        "Hello!",
        {"reason": "a greeting", "final_answer": "Hello! How can I help you today?", "sources": []},
    ),
    WorkedExample(
        "What is the capital of France?",
        {"reason": "general knowledge, outside my scope", "decline": True},
    ),
    Slot.TOOL_EXAMPLES,
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


_STEP_FORMAT = (
    'Reply with exactly one JSON object per step. Start with a short "reason", then choose one:',
    '- {"reason": "...", "tool": "<tool name>", "arguments": {...}} to call one tool;',
    '- {"reason": "...", "final_answer": "...", "sources": ["<chunk_id>", ...]} to answer '
    "the user; sources lists the chunk_id of every search_docs result the answer uses "
    "([] when none);",
    '- {"reason": "...", "decline": true} when the question is outside your scope;',
    '- {"reason": "...", "idk": true} when the tools found nothing that answers it.',
)


def render_tool_prompt(
    tools: Sequence[ToolSpec],
    examples: Sequence[ExampleItem] = DEFAULT_EXAMPLES,
    more: Sequence[WorkedExample] = (),
) -> str:
    """The json_schema-mode part of the system prompt: the reply format, the tool list (one
    line each) and one-line worked examples (question -> JSON step).

    The offered tools' own examples go where ``examples`` holds ``Slot.TOOL_EXAMPLES`` (at
    the end without one), in prompt order, each tool's followed by the ``more`` examples
    that call it. Examples that name a tool not in ``tools`` are left out, so a per-user
    tool subset never shows a forbidden tool."""
    lines = list(_STEP_FORMAT)
    if tools:
        lines += ["", render_tool_list(tools)]
    shown = [_example_line(example) for example in _examples(tools, examples, more)]
    if shown:
        lines += ["", "Examples:", *shown]
    return "\n".join(lines)


def render_tool_list(tools: Sequence[ToolSpec]) -> str:
    """``Tools:`` and one line per tool (its signature and description); empty for none."""
    return "\n".join(["Tools:", *(_tool_line(tool) for tool in tools)]) if tools else ""


def _tool_line(tool: ToolSpec) -> str:
    description = " ".join(tool.description.split())
    return (
        f"- {tool_signature(tool)}: {description}" if description else f"- {tool_signature(tool)}"
    )


def _example_line(example: WorkedExample) -> str:
    return f"{example.question} -> {json.dumps(dict(example.step), ensure_ascii=False)}"


def _examples(
    tools: Sequence[ToolSpec], examples: Sequence[ExampleItem], more: Sequence[WorkedExample]
) -> Iterator[WorkedExample]:
    names = {tool.name for tool in tools}
    items = list(examples)
    if Slot.TOOL_EXAMPLES not in items:
        items.append(Slot.TOOL_EXAMPLES)
    for item in items:
        if item is Slot.TOOL_EXAMPLES:
            yield from tool_examples(tools, more)
        elif isinstance(item, WorkedExample) and item.step.get("tool") in (None, *names):
            yield item


def tool_examples(
    tools: Sequence[ToolSpec], more: Sequence[WorkedExample] = ()
) -> Iterator[WorkedExample]:
    """The tools' own examples as JSON steps, in prompt order (``ToolSpec.prompt_order``;
    ties keep the given order), each tool's followed by the ``more`` examples calling it."""
    for tool in sorted(tools, key=lambda spec: spec.prompt_order):
        for example in tool.examples:
            yield _tool_step(tool.name, example)
        yield from (example for example in more if example.step.get("tool") == tool.name)


def _tool_step(name: str, example: ToolExample) -> WorkedExample:
    step = {"reason": example.reason, "tool": name, "arguments": dict(example.arguments)}
    return WorkedExample(example.question, step)


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
      and the result text for each, then ``tool_result_note`` (a nudge towards answering), or
      instead the user message that follows the results, if one does.
    """
    wire: list[dict[str, Any]] = []
    pending: list[str] = []

    def flush_results(follow_up: str | None = None) -> None:
        """The pending results as one user message; a user message that follows them joins
        it, in place of the note (one turn, fewer prompt tokens)."""
        if pending:
            note = follow_up if follow_up is not None else tool_result_note
            text = "\n\n".join(pending)
            if note:
                text += "\n\n" + note
            wire.append({"role": "user", "content": text})
            pending.clear()

    names: dict[str, str] = {}
    for message in messages:
        if message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "", "tool")
            label = f"{name} ({message.tool_call_id})" if message.tool_call_id else name
            pending.append(f"Result of {label}:\n{message.content or ''}")
            continue
        if message.role == "user" and pending:
            flush_results(follow_up=message.content or "")
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


def source_markers(
    answer: str, sources: object, source_labels: Mapping[str, str] | None = None
) -> str:
    """`` [^id]`` markers for the listed sources the answer does not already cite (a label
    of ``source_labels`` stands for its chunk id)."""
    if not isinstance(sources, list):
        return ""
    labels = source_labels or {}
    markers = []
    for source in sources:
        if isinstance(source, str) and source.strip():
            marker = f"[^{labels.get(source.strip(), source.strip())}]"
            if marker not in answer and marker not in markers:
                markers.append(marker)
    return (" " + " ".join(markers)) if markers else ""


def _unlabel_markers(answer: str, source_labels: Mapping[str, str]) -> str:
    """Inline ``[^label]`` markers the model wrote itself, as ``[^chunk id]``."""
    for label, chunk_id in source_labels.items():
        answer = answer.replace(f"[^{label}]", f"[^{chunk_id}]")
    return answer


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def whole_sentences(answer: str, limit: int = FINAL_ANSWER_MAX_CHARS) -> str:
    """An answer the length cap cut off, back to its last whole sentence (or, with none in
    its second half, its last whole word and an ellipsis); a shorter answer as it is."""
    if len(answer) < limit:
        return answer
    ends = [m.end() for m in _SENTENCE_END.finditer(answer)]
    if ends and ends[-1] >= len(answer) // 2:
        return answer[: ends[-1]]
    return answer.rsplit(" ", 1)[0].rstrip(" ,;:") + " …"


def parse_step(
    content: str | None,
    tools: Sequence[ToolSpec],
    *,
    usage: Usage,
    model: str,
    finish_reason: str | None,
    call_number: int,
    source_labels: Mapping[str, str] | None = None,
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

    def result(kind: ReplyKind, text: str | None, calls: tuple[ToolCall, ...] = ()) -> ChatResult:
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
        answer = _unlabel_markers(whole_sentences(answer), source_labels or {})
        return result("text", answer + source_markers(answer, data.get("sources"), source_labels))
    if data[branch] is not True:
        raise MalformedReply(f'"{branch}" must be true')
    if branch == "decline":
        return result("refusal", None)
    return result("text", IDK_MARKER)  # idk: the sentence a native model would write


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


# --- the ModeAdapter -------------------------------------------------------------------------


class JsonSchemaMode(ModeAdapter):
    """This mode on the OpenAI wire (see the module docstring)."""

    name = "json_schema"

    def __init__(
        self, *, strict: bool = False, tool_result_note: str | None = DEFAULT_TOOL_RESULT_NOTE
    ) -> None:
        self._strict = strict
        self._tool_result_note = tool_result_note

    def wire_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        return to_wire_messages(messages, tool_result_note=self._tool_result_note)

    def request_fields(self, request: ChatRequest) -> dict[str, Any]:
        schema = response_format(
            request.tools,
            strict=self._strict,
            choices=request.choices,
            allow_refusal=request.allow_refusal,
            source_labels=request.source_labels,
        )
        return {"response_format": schema}

    def parse_reply(
        self, message: ChatCompletionMessage, request: ChatRequest, meta: ReplyMeta
    ) -> ChatResult:
        return self._parse(message.content, request, meta)

    async def stream_events(
        self, deltas: AsyncIterator[ChoiceDelta], request: ChatRequest, meta: ReplyMeta
    ) -> AsyncGenerator[StreamEvent, None]:
        extractor = FinalAnswerExtractor()
        content: list[str] = []
        streamed: list[str] = []  # the answer text already yielded
        async for delta in deltas:
            if delta.content:
                content.append(delta.content)
                text = extractor.feed(delta.content)
                if text:
                    streamed.append(text)
                    yield TextDelta(text)
        result = self._parse("".join(content), request, meta)
        for index, call in enumerate(result.tool_calls):
            yield ToolCallDelta(index=index, id=call.id, name=call.name, arguments=call.arguments)
        answered = "".join(streamed)
        if result.text and result.text.startswith(answered):
            # What the step's JSON string did not hold: the citation markers made from
            # "sources", or the whole IDK sentence of an idk step.
            suffix = result.text[len(answered) :]
            if suffix:
                yield TextDelta(suffix)
        yield Completed(result)

    @staticmethod
    def _parse(content: str | None, request: ChatRequest, meta: ReplyMeta) -> ChatResult:
        return parse_step(
            content,
            request.tools,
            usage=meta.usage,
            model=meta.model,
            finish_reason=meta.finish_reason,
            call_number=prior_tool_calls(request.messages) + 1,
            source_labels=request.source_labels,
        )
