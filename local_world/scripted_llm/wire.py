"""OpenAI's wire format: error bodies, the request checks a real provider makes, token usage,
and the completion a scripted step turns into (as one JSON body or as stream chunks)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from local_world.scripted_llm.script import Step

SYSTEM_FINGERPRINT = "fp_local_scripted"
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def openai_error(
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


async def read_json(request: Request) -> Any:
    """The body as JSON, or None when it is not JSON (the route decides what that means)."""
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


# --- request checks ---------------------------------------------------------------------------


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def validate_chat(body: Mapping[str, Any]) -> None:
    """The checks a real provider makes that a buggy client would trip over."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BadRequest("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    _validate_messages(messages)
    tools = body.get("tools")
    if tools is not None:
        _validate_tools(tools)


def _missing_tool_replies(pending: Mapping[str, str], param: str) -> BadRequest:
    return BadRequest(
        "An assistant message with 'tool_calls' must be followed by tool messages "
        f"responding to each 'tool_call_id'. Missing: {sorted(pending)}",
        param,
    )


def _validate_messages(messages: list[Any]) -> None:
    # tool_call_id -> function name, for calls not yet answered by a tool message
    pending: dict[str, str] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise BadRequest(f"messages[{i}]: invalid role", f"messages.[{i}].role")
        role = message["role"]
        if role != "tool" and pending:
            raise _missing_tool_replies(pending, f"messages.[{i}].role")
        if role == "assistant":
            _collect_tool_calls(i, message, pending)
        elif role == "tool":
            _answer_tool_call(i, message, pending)
    if pending:
        raise _missing_tool_replies(pending, "messages")


def _collect_tool_calls(i: int, message: Mapping[str, Any], pending: dict[str, str]) -> None:
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
            raise BadRequest(
                f"messages[{i}].tool_calls: each call needs an id",
                f"messages.[{i}].tool_calls",
            )
        function = call.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
            raise BadRequest(
                f"messages[{i}].tool_calls: function.arguments must be a string",
                f"messages.[{i}].tool_calls",
            )
        pending[call["id"]] = str(function.get("name"))


def _answer_tool_call(i: int, message: Mapping[str, Any], pending: dict[str, str]) -> None:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or call_id not in pending:
        raise BadRequest(
            "Invalid parameter: messages with role 'tool' must be a response to a "
            "preceding message with 'tool_calls'.",
            f"messages.[{i}].tool_call_id",
        )
    pending.pop(call_id)
    if not isinstance(message.get("content"), str | list):
        raise BadRequest(f"messages[{i}]: tool content must be a string")


def _validate_tools(tools: object) -> None:
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be an array", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(function, Mapping)
            or not isinstance(function.get("name"), str)
            or not _TOOL_NAME.match(function["name"])
        ):
            raise BadRequest(
                f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}} "
                "with a name matching ^[a-zA-Z0-9_-]{1,64}$",
                f"tools.[{i}]",
            )


# --- the reply --------------------------------------------------------------------------------


def _approx_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def usage_for(body: Mapping[str, Any], output: str, step: Step) -> dict[str, Any]:
    """Approximate counts (4 characters a token), with the step's ``usage`` merged over them."""
    prompt = _approx_tokens(
        json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))
    )
    completion = _approx_tokens(output)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if step.usage:
        usage.update(step.usage)
    usage.setdefault("total_tokens", int(usage["prompt_tokens"]) + int(usage["completion_tokens"]))
    return usage


@dataclass(frozen=True)
class Completion:
    """One scripted reply, before it is sent as a JSON body or as a chunk stream."""

    id: str
    created: int
    model: str
    content: str | None
    calls: list[dict[str, Any]]
    finish: str
    usage: dict[str, Any]

    def payload(self) -> dict[str, Any]:
        """The ``chat.completion`` body."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content, "refusal": None}
        if self.calls:
            message["tool_calls"] = self.calls
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [
                {"index": 0, "message": message, "finish_reason": self.finish, "logprobs": None}
            ],
            "usage": self.usage,
        }

    def chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, *, include_usage: bool
    ) -> dict[str, Any]:
        """One ``chat.completion.chunk``; with ``include_usage`` it carries ``usage: null``."""
        payload: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if include_usage:
            payload["usage"] = None
        return payload
