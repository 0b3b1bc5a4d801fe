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

Modules: ``script`` (the script format), ``state`` (:class:`ScriptedLLM`: scripts, step choice,
request log), ``wire`` (OpenAI's errors, request checks, completion bodies), ``streaming`` (SSE
chunks), ``faults`` (delays, hangs, error replies), ``vectors`` (:func:`embed_text`), ``chat``
and ``embeddings`` (the two model routes), ``control`` (the loopback endpoints), ``app``
(:func:`create_llm_app`).
"""

from __future__ import annotations

from local_world.scripted_llm.app import create_llm_app
from local_world.scripted_llm.embeddings import MAX_EMBEDDING_DIM
from local_world.scripted_llm.script import (
    HANG_MS,
    Fault,
    FaultKind,
    Script,
    ScriptError,
    Step,
    ToolCallSpec,
    parse_script,
    parse_step,
)
from local_world.scripted_llm.state import (
    DEFAULT_MODELS,
    RecordedRequest,
    ScriptedLLM,
    first_user_message,
)
from local_world.scripted_llm.vectors import DEFAULT_EMBEDDING_DIM, embed_text
from local_world.scripted_llm.wire import SYSTEM_FINGERPRINT, openai_error

__all__ = [
    "DEFAULT_EMBEDDING_DIM",
    "DEFAULT_MODELS",
    "HANG_MS",
    "MAX_EMBEDDING_DIM",
    "SYSTEM_FINGERPRINT",
    "Fault",
    "FaultKind",
    "RecordedRequest",
    "Script",
    "ScriptError",
    "ScriptedLLM",
    "Step",
    "ToolCallSpec",
    "create_llm_app",
    "embed_text",
    "first_user_message",
    "openai_error",
    "parse_script",
    "parse_step",
]
