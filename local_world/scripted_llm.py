"""A scripted OpenAI-compatible model server, for tests, evals and benchmarks.

Endpoints (real protocol, so the ``openai`` SDK and any OpenAI-compatible client work):

* ``POST /v1/chat/completions``: JSON, or ``stream: true`` SSE in OpenAI's chunk format
  (``chat.completion.chunk`` objects, tool-call deltas split across chunks, a usage chunk when
  ``stream_options.include_usage`` is set, then ``data: [DONE]``).
* ``POST /v1/embeddings``: deterministic hashed bag-of-words vectors (words plus character
  trigrams, signed feature hashing, L2-normalised), ``dimensions`` or the default 384,
  ``encoding_format`` ``float`` or ``base64``.
* ``GET /v1/models``.

Control (loopback only): ``POST /_script`` loads a script, ``GET /_script`` shows progress,
``DELETE /_script[?key=]`` removes scripts, ``POST /_embedding_faults`` queues embedding
faults, ``GET /_requests`` / ``DELETE /_requests`` read and clear the request log.

Script format (JSON, also accepted by :meth:`ScriptedLLM.load`)::

    {"key": "optional conversation key", "mode": "once" | "loop", "delay_ms": 0,
     "steps": [
       {"text": "final answer"},
       {"tool_calls": [{"name": "get_room", "arguments": {"room_id": "r1"}, "id": "call_1"}],
        "text": "optional content alongside the calls"},
       {"json": {"tool": "get_room", "arguments": {}}},
       {"fault": "rate_limit", "retry_after": 1},       # 429 (+ "retry_after_ms")
       {"fault": "server_error", "status": 503},        # 5xx/4xx (default 500)
       {"fault": "hang"},                               # no reply until the client gives up
       {"fault": "malformed"}                           # truncated JSON body / SSE event
     ]}

Every step also takes ``delay_ms`` (wait before replying), ``usage`` (merged over the computed
counts, e.g. ``{"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.0012}``),
``finish_reason``, ``chunk_chars`` (text per stream chunk) and ``stream_delay_ms`` (pause
between chunks). Fault steps take ``message`` and ``retry`` (sent as ``x-should-retry``).
Tool-call ``arguments`` may be an object (serialised) or a string (sent verbatim, so malformed
arguments can be scripted).

Choosing the script for a request: the ``x-script-key`` header names one; otherwise the first
user message selects the script whose key equals it, else the longest key contained in it,
else the unkeyed default script. ``once`` scripts consume one step per request in order.
``loop`` scripts never run out: the step is ``(number of assistant messages in the request) %
len(steps)``, so every conversation replays the steps (for benchmarks, with ``delay_ms``).

A request with no script, or past the end of a ``once`` script, fails loudly: HTTP 500,
``{"error": {"message": "unscripted request: ...", "type": "scripted_llm_error", "code":
"unscripted"}}`` and ``x-should-retry: false``; it is recorded with ``unscripted: true``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import math
import re
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from local_world._service import FASTAPI_TELEMETRY_OFF, redact_headers, require_loopback
from local_world._service import ApiError as _ApiError

DEFAULT_EMBEDDING_DIM = 384
MAX_EMBEDDING_DIM = 8192
HANG_MS = 600_000
SYSTEM_FINGERPRINT = "fp_local_scripted"
DEFAULT_MODELS = (
    "openai/gpt-4o-mini",
    "google/gemini-2.5-flash",
    "openai/text-embedding-3-small",
    "local/scripted",
)
FaultKind = Literal["rate_limit", "server_error", "hang", "malformed"]
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class ScriptError(ValueError):
    """A script that does not follow the format (typos fail loudly, at load time)."""


# --- script model -------------------------------------------------------------------------------


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


def _parse_fault(data: Mapping[str, Any]) -> Fault:
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
        fault=_parse_fault(data) if "fault" in data else None,
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


# --- embeddings -----------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def _features(text: str) -> list[tuple[str, float]]:
    words = _WORD.findall(text.lower())
    features: list[tuple[str, float]] = []
    for word in words:
        features.append(("w:" + word, 1.0))
        padded = f"#{word}#"
        for i in range(len(padded) - 2):
            features.append(("c:" + padded[i : i + 3], 0.35))
    if not features:
        features.append(("raw:" + text, 1.0))
    return features


def embed_text(text: str, dimensions: int = DEFAULT_EMBEDDING_DIM) -> list[float]:
    """Deterministic, L2-normalised hashed bag of words (plus character trigrams).

    Texts sharing words or word fragments get a high cosine similarity; the same text always
    gets the same vector, whatever the process.
    """
    vector = [0.0] * dimensions
    for feature, weight in _features(text):
        digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
        number = int.from_bytes(digest, "big")
        sign = 1.0 if number & 1 else -1.0
        vector[(number >> 1) % dimensions] += sign * weight
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]


# --- recording ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    seq: int
    endpoint: str
    body: Any
    headers: dict[str, str]
    key: str | None
    step_index: int | None
    status: int
    unscripted: bool
    error: str | None
    received_at: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Loaded:
    script: Script
    cursor: int = 0
    served: int = 0


@dataclass(frozen=True)
class _Choice:
    """What to do for one chat request: a step, or the reason there is none."""

    step: Step | None
    key: str | None
    index: int | None
    delay_ms: int = 0
    reason: str | None = None


def _message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        ]
        return "".join(parts)
    return ""


def first_user_message(messages: Sequence[Any]) -> str | None:
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _message_text(message.get("content")).strip()
    return None


@dataclass
class ScriptedLLM:
    """The server's state, usable in-process: load scripts, read what was asked."""

    embedding_dim: int = DEFAULT_EMBEDDING_DIM
    models: tuple[str, ...] = DEFAULT_MODELS
    api_key: str | None = None
    _scripts: dict[str | None, _Loaded] = field(default_factory=dict, init=False, repr=False)
    _log: list[RecordedRequest] = field(default_factory=list, init=False, repr=False)
    _embedding_faults: deque[Fault] = field(default_factory=deque, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    # --- scripts ------------------------------------------------------------------------------

    def load(
        self,
        script: Script | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        key: str | None = None,
    ) -> Script:
        """Load (or replace) a script; ``key`` overrides the script's own key."""
        parsed = parse_script(script)
        if key is not None:
            parsed = dataclasses.replace(parsed, key=key.strip())
        with self._lock:
            self._scripts[parsed.key] = _Loaded(parsed)
        return parsed

    def script(
        self,
        *steps: Mapping[str, Any],
        key: str | None = None,
        mode: Literal["once", "loop"] = "once",
        delay_ms: int = 0,
    ) -> Script:
        """Shorthand: ``llm.script({"text": "hi"}, key="hello")``."""
        return self.load({"steps": list(steps), "mode": mode, "delay_ms": delay_ms}, key=key)

    def remove_script(self, key: str | None) -> None:
        """Drop one script (``None``: the unkeyed default script)."""
        with self._lock:
            self._scripts.pop(key, None)

    def clear_scripts(self) -> None:
        with self._lock:
            self._scripts.clear()

    def progress(self) -> list[dict[str, Any]]:
        """Per script: key, mode, steps, served (requests answered) and remaining."""
        with self._lock:
            return [
                {
                    "key": loaded.script.key,
                    "mode": loaded.script.mode,
                    "steps": len(loaded.script.steps),
                    "served": loaded.served,
                    "remaining": (
                        len(loaded.script.steps) - loaded.cursor
                        if loaded.script.mode == "once"
                        else None
                    ),
                }
                for loaded in self._scripts.values()
            ]

    def remaining(self, key: str | None = None) -> int:
        """Steps not yet consumed by a ``once`` script (0 when it is gone)."""
        with self._lock:
            loaded = self._scripts.get(key)
            if loaded is None or loaded.script.mode == "loop":
                return 0
            return len(loaded.script.steps) - loaded.cursor

    def queue_embedding_faults(self, *faults: Mapping[str, Any] | Fault) -> None:
        """Each embeddings request pops one fault (same keys as a chat fault step)."""
        parsed = [f if isinstance(f, Fault) else _parse_fault(f) for f in faults]
        with self._lock:
            self._embedding_faults.extend(parsed)

    def _select(self, key_header: str | None, messages: Sequence[Any]) -> _Choice:
        with self._lock:
            loaded: _Loaded | None
            if key_header is not None:
                loaded = self._scripts.get(key_header.strip())
                if loaded is None:
                    return _Choice(
                        None, key_header, None, reason=f"no script for key {key_header!r}"
                    )
            else:
                first = first_user_message(messages) or ""
                loaded = self._scripts.get(first) if first else None
                if loaded is None:
                    contained = [k for k in self._scripts if k is not None and k in first]
                    if contained:
                        loaded = self._scripts[max(contained, key=len)]
                if loaded is None:
                    loaded = self._scripts.get(None)
                if loaded is None:
                    preview = first[:120]
                    return _Choice(None, None, None, reason=f"no script matches {preview!r}")
            script = loaded.script
            if script.mode == "loop":
                hops = sum(
                    1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"
                )
                index = hops % len(script.steps)
            else:
                index = loaded.cursor
                if index >= len(script.steps):
                    return _Choice(
                        None,
                        script.key,
                        index,
                        reason=f"script {script.key!r} exhausted after {len(script.steps)} steps",
                    )
                loaded.cursor += 1
            loaded.served += 1
            return _Choice(script.steps[index], script.key, index, delay_ms=script.delay_ms)

    def _pop_embedding_fault(self) -> Fault | None:
        with self._lock:
            return self._embedding_faults.popleft() if self._embedding_faults else None

    # --- request log ------------------------------------------------------------------------

    def _record(self, **fields: Any) -> RecordedRequest:
        with self._lock:
            entry = RecordedRequest(seq=len(self._log), received_at=time.time(), **fields)
            self._log.append(entry)
            return entry

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._log)

    def chat_requests(self, key: str | None = None) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if r.endpoint == "chat.completions" and (key is None or r.key == key)
        ]

    def unscripted(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.unscripted]

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def reset(self) -> None:
        """Forget scripts, queued faults and the request log."""
        with self._lock:
            self._scripts.clear()
            self._embedding_faults.clear()
            self._log.clear()


# --- OpenAI wire format -----------------------------------------------------------------------


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


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _validate_chat(body: Mapping[str, Any]) -> None:
    """The checks a real provider makes that a buggy client would trip over."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _BadRequest("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty array", "messages")
    pending: dict[str, str] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise _BadRequest(f"messages[{i}]: invalid role", f"messages.[{i}].role")
        role = message["role"]
        if role != "tool" and pending:
            raise _BadRequest(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'. Missing: {sorted(pending)}",
                f"messages.[{i}].role",
            )
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
                    raise _BadRequest(
                        f"messages[{i}].tool_calls: each call needs an id",
                        f"messages.[{i}].tool_calls",
                    )
                function = call.get("function")
                if not isinstance(function, Mapping) or not isinstance(
                    function.get("arguments"), str
                ):
                    raise _BadRequest(
                        f"messages[{i}].tool_calls: function.arguments must be a string",
                        f"messages.[{i}].tool_calls",
                    )
                pending[call["id"]] = str(function.get("name"))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in pending:
                raise _BadRequest(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'.",
                    f"messages.[{i}].tool_call_id",
                )
            pending.pop(call_id)
            if not isinstance(message.get("content"), str | list):
                raise _BadRequest(f"messages[{i}]: tool content must be a string")
    if pending:
        raise _BadRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            f"responding to each 'tool_call_id'. Missing: {sorted(pending)}",
            "messages",
        )
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _BadRequest("'tools' must be an array", "tools")
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if (
                not isinstance(tool, Mapping)
                or tool.get("type") != "function"
                or not isinstance(function, Mapping)
                or not isinstance(function.get("name"), str)
                or not _TOOL_NAME.match(function["name"])
            ):
                raise _BadRequest(
                    f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}} "
                    "with a name matching ^[a-zA-Z0-9_-]{1,64}$",
                    f"tools.[{i}]",
                )


def _approx_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _usage(body: Mapping[str, Any], output: str, step: Step) -> dict[str, Any]:
    prompt = _approx_tokens(
        json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))
    )
    completion = _approx_tokens(output)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if step.usage:
        usage.update(step.usage)
    usage.setdefault("total_tokens", int(usage["prompt_tokens"]) + int(usage["completion_tokens"]))
    return usage


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


async def _wait(request: Request, delay_ms: int) -> bool:
    """Sleep up to ``delay_ms``; return False as soon as the client has gone away."""
    deadline = time.monotonic() + delay_ms / 1000.0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return True
        await asyncio.sleep(min(0.05, remaining))
        if await request.is_disconnected():
            return False


def _fault_headers(fault: Fault) -> dict[str, str]:
    headers: dict[str, str] = {}
    if fault.retry_after is not None:
        headers["retry-after"] = (
            str(int(fault.retry_after))
            if float(fault.retry_after).is_integer()
            else str(fault.retry_after)
        )
    if fault.retry_after_ms is not None:
        headers["retry-after-ms"] = str(fault.retry_after_ms)
    if fault.retry is not None:
        headers["x-should-retry"] = "true" if fault.retry else "false"
    return headers


def _fault_response(fault: Fault) -> JSONResponse:
    if fault.kind == "rate_limit":
        return openai_error(
            fault.status,
            fault.message or "Rate limit reached (scripted)",
            type_="rate_limit_error" if fault.status == 429 else "api_error",
            code="rate_limit_exceeded" if fault.status == 429 else None,
            headers=_fault_headers(fault),
        )
    return openai_error(
        fault.status,
        fault.message or f"scripted {fault.kind} ({fault.status})",
        type_="server_error" if fault.status >= 500 else "invalid_request_error",
        code=fault.kind,
        headers=_fault_headers(fault),
    )


def create_llm_app(llm: ScriptedLLM | None = None) -> FastAPI:
    """The scripted model server. Pass a :class:`ScriptedLLM` to drive it in-process."""
    state = llm if llm is not None else ScriptedLLM()
    app = FastAPI(
        title="local scripted LLM", docs_url=None, redoc_url=None, telemetry=FASTAPI_TELEMETRY_OFF
    )
    app.state.llm = state
    counter = {"n": 0}

    def next_id() -> int:
        counter["n"] += 1
        return counter["n"]

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, _ApiError)
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, exc.status)

    app.add_exception_handler(_ApiError, api_error)

    def check_auth(request: Request) -> JSONResponse | None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return openai_error(
                401,
                "Missing bearer authentication in header",
                code="missing_api_key",
                headers={"x-should-retry": "false"},
            )
        if state.api_key is not None and token.strip() != state.api_key:
            return openai_error(
                401,
                "Incorrect API key provided",
                code="invalid_api_key",
                headers={"x-should-retry": "false"},
            )
        return None

    async def read_json(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    def record(
        endpoint: str,
        request: Request,
        body: Any,
        status: int,
        *,
        key: str | None = None,
        step_index: int | None = None,
        unscripted: bool = False,
        error: str | None = None,
    ) -> None:
        state._record(
            endpoint=endpoint,
            body=body,
            headers=redact_headers(request.headers),
            key=key,
            step_index=step_index,
            status=status,
            unscripted=unscripted,
            error=error,
        )

    def unscripted_response(reason: str) -> JSONResponse:
        return openai_error(
            500,
            f"unscripted request: {reason}",
            type_="scripted_llm_error",
            code="unscripted",
            headers={"x-should-retry": "false"},
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_json(request)
        denied = check_auth(request)
        if denied is not None:
            record("chat.completions", request, body, 401, error="unauthenticated")
            return denied
        if not isinstance(body, dict):
            record("chat.completions", request, body, 400, error="body is not a JSON object")
            return openai_error(400, "We could not parse the JSON body of your request.")
        try:
            _validate_chat(body)
        except _BadRequest as exc:
            record("chat.completions", request, body, 400, error=exc.message)
            return openai_error(400, exc.message, param=exc.param)

        choice = state._select(request.headers.get("x-script-key"), body["messages"])
        step = choice.step
        if step is None:
            reason = choice.reason or "no script"
            record(
                "chat.completions",
                request,
                body,
                500,
                key=choice.key,
                step_index=choice.index,
                unscripted=True,
                error=reason,
            )
            return unscripted_response(reason)
        if step.tool_calls and not body.get("tools"):
            reason = (
                f"script mismatch: step {choice.index} of {choice.key!r} returns tool calls "
                "but the request declared no tools"
            )
            record(
                "chat.completions",
                request,
                body,
                500,
                key=choice.key,
                step_index=choice.index,
                unscripted=True,
                error=reason,
            )
            return unscripted_response(reason)

        fault = step.fault
        status = fault.status if fault is not None and fault.kind != "malformed" else 200
        record(
            "chat.completions",
            request,
            body,
            status,
            key=choice.key,
            step_index=choice.index,
            error=f"fault: {fault.kind}" if fault else None,
        )

        if not await _wait(request, choice.delay_ms + step.delay_ms):
            return Response(status_code=499)
        if fault is not None:
            if fault.kind == "hang":
                await _wait(request, HANG_MS)
                return openai_error(504, "scripted hang ended", type_="server_error")
            if fault.kind != "malformed":
                return _fault_response(fault)

        completion_id = f"chatcmpl-local-{next_id()}"
        created = int(time.time())
        model = str(body["model"])
        content = step.json_content if step.json_content is not None else step.text
        calls = [
            {
                "id": spec.id or f"call_{completion_id.rsplit('-', 1)[-1]}_{i}",
                "type": "function",
                "function": {"name": spec.name, "arguments": spec.arguments},
            }
            for i, spec in enumerate(step.tool_calls)
        ]
        finish = step.finish_reason or ("tool_calls" if calls else "stop")
        output = (content or "") + "".join(spec.name + spec.arguments for spec in step.tool_calls)
        usage = _usage(body, output, step)

        if body.get("stream") is True:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage")) or bool(
                (body.get("usage") or {}).get("include")
            )
            return StreamingResponse(
                _stream(
                    completion_id,
                    created,
                    model,
                    content,
                    calls,
                    finish,
                    usage,
                    step,
                    include_usage,
                    malformed=fault is not None,
                ),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )

        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        payload = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": usage,
        }
        if fault is not None:  # malformed: a truncated JSON body with a 200
            text = json.dumps(payload)
            return Response(text[: len(text) // 2], status_code=200, media_type="application/json")
        return JSONResponse(payload)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await read_json(request)
        denied = check_auth(request)
        if denied is not None:
            record("embeddings", request, body, 401, error="unauthenticated")
            return denied
        problem = _embedding_problem(body)
        if problem is not None:
            record("embeddings", request, body, 400, error=problem)
            return openai_error(400, problem)
        assert isinstance(body, dict)
        fault = state._pop_embedding_fault()
        if fault is not None:
            record("embeddings", request, body, fault.status, error=f"fault: {fault.kind}")
            if fault.kind == "hang":
                await _wait(request, HANG_MS)
                return openai_error(504, "scripted hang ended", type_="server_error")
            if fault.kind == "malformed":
                return Response(
                    b'{"object": "list", "data": [{"embed', media_type="application/json"
                )
            return _fault_response(fault)
        record("embeddings", request, body, 200)
        inputs = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
        dims = int(body.get("dimensions") or state.embedding_dim)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector = embed_text(text, dims)
            encoded: Any = (
                base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode("ascii")
                if as_base64
                else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(len(_WORD.findall(text.lower())) or 1 for text in inputs)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        denied = check_auth(request)
        if denied is not None:
            return denied
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "local-world"}
                    for m in state.models
                ],
            }
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": "scripted-llm"}

    @app.post("/_script")
    async def load_script(request: Request) -> Response:
        require_loopback(request)
        body = await read_json(request)
        try:
            script = state.load(body)
        except ScriptError as exc:
            return JSONResponse({"error": {"code": "invalid_script", "message": str(exc)}}, 400)
        return JSONResponse(
            {"key": script.key, "mode": script.mode, "steps": len(script.steps)}, 201
        )

    @app.get("/_script")
    async def script_progress(request: Request) -> dict[str, Any]:
        require_loopback(request)
        return {"scripts": state.progress()}

    @app.delete("/_script", status_code=204)
    async def delete_script(request: Request) -> Response:
        require_loopback(request)
        if "key" in request.query_params:
            state.remove_script(request.query_params["key"].strip() or None)
        else:
            state.clear_scripts()
        return Response(status_code=204)

    @app.post("/_embedding_faults", status_code=204)
    async def embedding_faults(request: Request) -> Response:
        require_loopback(request)
        body = await read_json(request)
        faults = body.get("faults") if isinstance(body, dict) else None
        if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
            return JSONResponse(
                {"error": {"code": "invalid_script", "message": "expected {'faults': [...]}"}},
                400,
            )
        try:
            state.queue_embedding_faults(*faults)
        except (ScriptError, KeyError) as exc:
            return JSONResponse({"error": {"code": "invalid_script", "message": str(exc)}}, 400)
        return Response(status_code=204)

    @app.get("/_requests")
    async def read_requests(request: Request) -> dict[str, Any]:
        require_loopback(request)
        log = state.requests
        return {
            "requests": [entry.to_json() for entry in log],
            "unscripted": sum(1 for entry in log if entry.unscripted),
        }

    @app.delete("/_requests", status_code=204)
    async def clear_requests(request: Request) -> Response:
        require_loopback(request)
        state.clear_requests()
        return Response(status_code=204)

    return app


def _embedding_problem(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    raw = body.get("input")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        return "'input' must be a non-empty string or array of strings"
    if not all(isinstance(item, str) for item in items):
        return "'input' as token arrays is not supported by the scripted server"
    if any(item == "" for item in items):
        return "'input' must not contain empty strings"
    if len(items) > 2048:
        return "'input' must have at most 2048 items"
    dims = body.get("dimensions")
    if dims is not None and (
        not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= MAX_EMBEDDING_DIM
    ):
        return f"'dimensions' must be an integer in [1, {MAX_EMBEDDING_DIM}]"
    if body.get("encoding_format") not in (None, "float", "base64"):
        return "'encoding_format' must be 'float' or 'base64'"
    return None


def _sse(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


async def _stream(
    completion_id: str,
    created: int,
    model: str,
    content: str | None,
    calls: list[dict[str, Any]],
    finish: str,
    usage: dict[str, Any],
    step: Step,
    include_usage: bool,
    *,
    malformed: bool,
) -> AsyncIterator[bytes]:
    """OpenAI's ``chat.completion.chunk`` sequence for one scripted reply."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if include_usage:
            payload["usage"] = None
        return payload

    async def pause() -> None:
        # A client that goes away cancels this generator (Starlette), ending the stream.
        if step.stream_delay_ms:
            await asyncio.sleep(step.stream_delay_ms / 1000.0)

    yield _sse(chunk({"role": "assistant", "content": "", "refusal": None}))
    if malformed:
        text = json.dumps(chunk({"content": content or "partial"}))
        yield f"data: {text[: len(text) // 2]}\n\n".encode()
        return
    for piece in _chunks(content, step.chunk_chars) if content else []:
        await pause()
        yield _sse(chunk({"content": piece}))
    for index, call in enumerate(calls):
        await pause()
        function = call["function"]
        yield _sse(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": function["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        for piece in _chunks(function["arguments"], step.chunk_chars):
            await pause()
            yield _sse(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    yield _sse(chunk({}, finish))
    if include_usage:
        final = chunk({})
        final["choices"] = []
        final["usage"] = usage
        yield _sse(final)
    yield _sse("[DONE]")
