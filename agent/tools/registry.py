"""``ToolRegistry``: the tools the model may call, and the one place that runs them.

``dispatch`` (and ``run``, which also says why a call failed) never raises (except for
cancellation): unknown tools, unparseable or invalid arguments, ``ToolError``, downstream HTTP
failures and timeouts all become a ``ToolOutcome`` whose ``result_json`` is an
``{"error": ...}`` object the model reads as the tool result and can recover from.

A tool's result model travels as its JSON only (``ToolOutcome`` crosses a process boundary
when the tools run in their own deployment): ``result_of`` reads it back as that model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from agent.llm.base import ToolCall, ToolSpec
from agent.tools.base import (
    ChunkSink,
    ResultT,
    Tool,
    ToolContext,
    ToolError,
    entity_arguments,
)
from retrieval.search import SearchHit

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_RESULT_CHARS = 24_000
MAX_ERROR_CHARS = 500

Failure = tuple[str, BaseException | None]  # why a call failed: its kind, and the exception


@dataclass(frozen=True)
class ToolOutcome:
    """One tool call, as run: what the model asked, what it got back, how long it took."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    ok: bool
    error: str | None
    result_json: str  # what the model reads (an {"error": ...} object when not ok)
    duration_ms: float
    chunks: tuple[SearchHit, ...] = ()  # documentation chunks this call showed the model
    # The entity ids among the valid arguments, as (kind, id): the kinds the tool's schema
    # declares (``EntityRef``), so a conversation keeps what each turn was about, typed.
    entities: tuple[tuple[str, str], ...] = ()


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def result_text(result: BaseModel) -> str:
    """What the model reads of a tool's result: its fields in declaration order, those with a
    default only when the tool set them (``Tool``), compact. Dumped in python mode and then
    through ``_json``, so every value is written exactly as ``json.dumps`` writes it."""
    return _json(result.model_dump(mode="python", by_alias=True, exclude_unset=True))


def result_of(outcome: ToolOutcome, tool: type[Tool[Any, ResultT]]) -> ResultT | None:
    """The result of a successful call of ``tool``, as its result model; None when the
    outcome is another tool's, a failure, or (never from this registry) does not parse."""
    if not outcome.ok or outcome.name != tool.name:
        return None
    try:
        return tool.result_model.model_validate_json(outcome.result_json)
    except ValidationError:
        log.warning("tool %s: its result does not parse as %s", tool.name, tool.result_model)
        return None


def entities_of(args: BaseModel) -> tuple[tuple[str, str], ...]:
    """The (kind, id) pairs of an args model's ``EntityRef`` fields, in argument order."""
    found: list[tuple[str, str]] = []
    for argument, kind in entity_arguments(type(args)).items():
        value = getattr(args, argument, None)
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str) and item:
                found.append((kind, item))
    return tuple(dict.fromkeys(found))


def validation_message(tool: str, exc: ValidationError) -> str:
    """A compact, model-readable summary of pydantic errors."""
    parts = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return f"invalid arguments for {tool}: " + "; ".join(parts)


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """The arguments object, or ``({"_raw": raw}, problem)`` when it is not a JSON object."""
    text = raw.strip()
    if not text:
        return {}, None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return {"_raw": raw[:1000]}, f"arguments are not valid JSON ({exc.msg})"
    if not isinstance(value, dict):
        return {"_raw": raw[:1000]}, "arguments must be a JSON object"
    return value, None


class ToolRegistry:
    def __init__(
        self,
        tools: Iterable[Tool[Any, Any]] = (),
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self._tools: dict[str, Tool[Any, Any]] = {}
        self.timeout_seconds = timeout_seconds
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool[Any, Any]) -> Tool[Any, Any]:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        for model in ("args_model", "result_model"):
            if not isinstance(getattr(tool, model, None), type):
                raise TypeError(
                    f"tool {tool.name!r} has no {model.replace('_', ' ')}"
                    " (subclass Tool[ArgsModel, ResultModel])"
                )
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool[Any, Any] | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [tool.spec() for tool in self._tools.values()]

    async def dispatch(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        """Run one call (untraced: ``agent.tools.instrumented`` wraps ``run`` in its span)."""
        outcome, _ = await self.run(call, ctx)
        return outcome

    async def run(self, call: ToolCall, ctx: ToolContext) -> tuple[ToolOutcome, Failure | None]:
        """The outcome, and (kind, exception) when the call failed."""
        started = time.perf_counter()
        arguments, problem = parse_arguments(call.arguments)
        # A sink of its own, so the outcome carries exactly this call's chunks (also across a
        # process boundary); they are merged into the request's sink as well.
        call_ctx = dataclasses.replace(ctx, seen_chunks=ChunkSink())

        entities: tuple[tuple[str, str], ...] = ()

        def outcome(
            text: str | None,
            error: str | None,
            kind: str = "",
            exc: BaseException | None = None,
        ) -> tuple[ToolOutcome, Failure | None]:
            if text is not None and len(text) > MAX_RESULT_CHARS:
                error = "the result is too large; ask for less (a narrower request)"
                kind = "result_too_large"
            if error is not None or text is None:  # text: the result, when there is one
                error = (error or f"{call.name} failed")[:MAX_ERROR_CHARS]
                text = _json({"error": error})
            chunks = tuple(call_ctx.seen_chunks) if error is None else ()
            ctx.seen_chunks.add(chunks)
            done = ToolOutcome(
                call_id=call.id,
                name=call.name,
                arguments=arguments,
                ok=error is None,
                error=error,
                result_json=text,
                duration_ms=round((time.perf_counter() - started) * 1000.0, 2),
                chunks=chunks,
                entities=entities,
            )
            return done, (None if error is None else (kind or "tool_error", exc))

        tool = self._tools.get(call.name)
        if tool is None:
            return outcome(
                None,
                f"unknown tool {call.name!r}; available: {', '.join(self.names)}",
                "unknown_tool",
            )
        if problem is not None:
            return outcome(
                None, f"{problem}; call {call.name} again with a JSON object", "invalid_arguments"
            )
        try:
            args: BaseModel = tool.args_model.model_validate(arguments)
        except ValidationError as exc:
            return outcome(None, validation_message(call.name, exc), "invalid_arguments", exc)
        entities = entities_of(args)
        timeout = tool.timeout_seconds or self.timeout_seconds
        try:
            result = await asyncio.wait_for(tool.run(args, call_ctx), timeout)
        except ToolError as exc:
            return outcome(None, str(exc) or f"{call.name} failed", "tool_error", exc)
        except (TimeoutError, httpx.TimeoutException) as exc:
            return outcome(
                None, f"{call.name} timed out after {timeout:g} s; try again later", "timeout", exc
            )
        except httpx.HTTPError as exc:
            log.warning("tool %s: HTTP error: %s", call.name, exc)
            return outcome(
                None, f"{call.name} could not reach a live-data service", "downstream_error", exc
            )
        except Exception as exc:
            log.exception("tool %s crashed", call.name)
            return outcome(
                None, f"{call.name} failed with an internal error", "internal_error", exc
            )
        if not isinstance(result, tool.result_model):
            log.error("tool %s returned %s, not a %s", call.name, type(result), tool.result_model)
            return outcome(None, f"{call.name} failed with an internal error", "internal_error")
        return outcome(result_text(result), None)
