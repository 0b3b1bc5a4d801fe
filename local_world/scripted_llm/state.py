"""The server's state: loaded scripts, which step answers a request, queued embedding faults
and the request log."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from local_world.scripted_llm.script import Fault, Script, Step, parse_fault, parse_script
from local_world.scripted_llm.vectors import DEFAULT_EMBEDDING_DIM

DEFAULT_MODELS = (
    "openai/gpt-4o-mini",
    "google/gemini-2.5-flash",
    "openai/text-embedding-3-small",
    "local/scripted",
)


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
class Choice:
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
        parsed = [f if isinstance(f, Fault) else parse_fault(f) for f in faults]
        with self._lock:
            self._embedding_faults.extend(parsed)

    def _select(self, key_header: str | None, messages: Sequence[Any]) -> Choice:
        with self._lock:
            loaded: _Loaded | None
            if key_header is not None:
                loaded = self._scripts.get(key_header.strip())
                if loaded is None:
                    return Choice(
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
                    return Choice(None, None, None, reason=f"no script matches {preview!r}")
            script = loaded.script
            if script.mode == "loop":
                hops = sum(
                    1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"
                )
                index = hops % len(script.steps)
            else:
                index = loaded.cursor
                if index >= len(script.steps):
                    return Choice(
                        None,
                        script.key,
                        index,
                        reason=f"script {script.key!r} exhausted after {len(script.steps)} steps",
                    )
                loaded.cursor += 1
            loaded.served += 1
            return Choice(script.steps[index], script.key, index, delay_ms=script.delay_ms)

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
