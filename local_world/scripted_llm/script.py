"""The script model: steps, faults and scripts, parsed from their JSON form (typos fail at load)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

HANG_MS = 600_000
FaultKind = Literal["rate_limit", "server_error", "hang", "malformed"]


class ScriptError(ValueError):
    """A script that does not follow the format (typos fail loudly, at load time)."""


@dataclass(frozen=True)
class ToolCallSpec:
    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    status: int = 500
    retry_after: float | None = None
    retry_after_ms: int | None = None
    message: str | None = None
    retry: bool | None = None


@dataclass(frozen=True)
class Step:
    text: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    json_content: str | None = None
    fault: Fault | None = None
    delay_ms: int = 0
    usage: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    chunk_chars: int = 12
    stream_delay_ms: int = 0


@dataclass(frozen=True)
class Script:
    steps: tuple[Step, ...]
    key: str | None = None
    mode: Literal["once", "loop"] = "once"
    delay_ms: int = 0


_STEP_KEYS = frozenset(
    {
        "text",
        "tool_calls",
        "json",
        "fault",
        "delay_ms",
        "usage",
        "finish_reason",
        "chunk_chars",
        "stream_delay_ms",
        # fault options
        "status",
        "retry_after",
        "retry_after_ms",
        "message",
        "retry",
    }
)
_FAULT_OPTIONS = frozenset({"status", "retry_after", "retry_after_ms", "message", "retry"})
_FAULT_KINDS: tuple[FaultKind, ...] = ("rate_limit", "server_error", "hang", "malformed")


def _int(data: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ScriptError(f"{key!r} must be an integer in [{low}, {high}], got {value!r}")
    return value


def parse_fault(data: Mapping[str, Any]) -> Fault:
    kind = data["fault"]
    if kind not in _FAULT_KINDS:
        raise ScriptError(f"unknown fault {kind!r}; expected one of {list(_FAULT_KINDS)}")
    default_status = {"rate_limit": 429, "server_error": 500, "hang": 504, "malformed": 200}[kind]
    status = _int(data, "status", default_status, 200, 599)
    retry_after = data.get("retry_after")
    if retry_after is not None and (
        not isinstance(retry_after, int | float) or isinstance(retry_after, bool) or retry_after < 0
    ):
        raise ScriptError("'retry_after' must be a non-negative number of seconds")
    retry_after_ms = data.get("retry_after_ms")
    if retry_after_ms is not None:
        retry_after_ms = _int(data, "retry_after_ms", 0, 0, 3_600_000)
    message = data.get("message")
    if message is not None and not isinstance(message, str):
        raise ScriptError("'message' must be a string")
    retry = data.get("retry")
    if retry is not None and not isinstance(retry, bool):
        raise ScriptError("'retry' must be a boolean")
    return Fault(
        kind=kind,
        status=status,
        retry_after=float(retry_after) if retry_after is not None else None,
        retry_after_ms=retry_after_ms,
        message=message,
        retry=retry,
    )


def _parse_tool_call(item: object) -> ToolCallSpec:
    if not isinstance(item, Mapping):
        raise ScriptError("each tool call must be an object with 'name' and 'arguments'")
    unknown = set(item) - {"name", "arguments", "id"}
    if unknown:
        raise ScriptError(f"unknown tool-call keys {sorted(unknown)}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ScriptError("a tool call needs a non-empty 'name'")
    arguments = item.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = item.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ScriptError("a tool call 'id' must be a string")
    return ToolCallSpec(name=name, arguments=arguments, id=call_id)


def parse_step(data: object) -> Step:
    if isinstance(data, Step):
        return data
    if not isinstance(data, Mapping):
        raise ScriptError(f"a step must be an object, got {type(data).__name__}")
    unknown = set(data) - _STEP_KEYS
    if unknown:
        raise ScriptError(f"unknown step keys {sorted(unknown)}")
    kinds = [k for k in ("fault", "json", "tool_calls") if k in data]
    if len(kinds) > 1:
        raise ScriptError(f"a step is one of text, tool_calls, json or fault, not {kinds}")
    if not kinds and "text" not in data:
        raise ScriptError("a step needs 'text', 'tool_calls', 'json' or 'fault'")
    if "fault" not in data and set(data) & _FAULT_OPTIONS:
        raise ScriptError(f"{sorted(set(data) & _FAULT_OPTIONS)} only apply to fault steps")
    if ("fault" in data or "json" in data) and "text" in data:
        raise ScriptError("'text' only combines with 'tool_calls', not with 'json' or 'fault'")
    text = data.get("text")
    if text is not None and not isinstance(text, str):
        raise ScriptError("'text' must be a string")
    usage = data.get("usage")
    if usage is not None and not isinstance(usage, Mapping):
        raise ScriptError("'usage' must be an object")
    finish_reason = data.get("finish_reason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise ScriptError("'finish_reason' must be a string")
    tool_calls: tuple[ToolCallSpec, ...] = ()
    if "tool_calls" in data:
        raw_calls = data["tool_calls"]
        if not isinstance(raw_calls, list) or not raw_calls:
            raise ScriptError("'tool_calls' must be a non-empty list")
        tool_calls = tuple(_parse_tool_call(item) for item in raw_calls)
    return Step(
        text=text,
        tool_calls=tool_calls,
        json_content=json.dumps(data["json"]) if "json" in data else None,
        fault=parse_fault(data) if "fault" in data else None,
        delay_ms=_int(data, "delay_ms", 0, 0, HANG_MS),
        usage=dict(usage) if usage is not None else None,
        finish_reason=finish_reason,
        chunk_chars=_int(data, "chunk_chars", 12, 1, 1_000_000),
        stream_delay_ms=_int(data, "stream_delay_ms", 0, 0, 60_000),
    )


def parse_script(data: object) -> Script:
    """A :class:`Script` from its JSON form (see the module docstring)."""
    if isinstance(data, Script):
        return data
    if isinstance(data, list):
        data = {"steps": data}
    if not isinstance(data, Mapping):
        raise ScriptError("a script must be an object with 'steps' (or a list of steps)")
    unknown = set(data) - {"key", "mode", "delay_ms", "steps"}
    if unknown:
        raise ScriptError(f"unknown script keys {sorted(unknown)}")
    key = data.get("key")
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise ScriptError("'key' must be a non-empty string")
    mode = data.get("mode", "once")
    if mode not in ("once", "loop"):
        raise ScriptError("'mode' must be 'once' or 'loop'")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ScriptError("'steps' must be a non-empty list")
    return Script(
        steps=tuple(parse_step(step) for step in steps),
        key=key.strip() if key is not None else None,
        mode=mode,
        delay_ms=_int(data, "delay_ms", 0, 0, HANG_MS),
    )
