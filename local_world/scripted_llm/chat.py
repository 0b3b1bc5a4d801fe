"""``POST /v1/chat/completions``: pick the scripted step, then reply as JSON or as a stream."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from local_world.scripted_llm.context import ServerContext
from local_world.scripted_llm.faults import fault_reply, wait
from local_world.scripted_llm.script import Step
from local_world.scripted_llm.state import Choice
from local_world.scripted_llm.streaming import stream
from local_world.scripted_llm.wire import (
    BadRequest,
    Completion,
    openai_error,
    read_json,
    usage_for,
    validate_chat,
)

ENDPOINT = "chat.completions"


async def chat_completion(ctx: ServerContext, request: Request) -> Response:
    body = await read_json(request)
    rejected = _reject(ctx, request, body)
    if rejected is not None:
        return rejected
    choice = ctx.state._select(request.headers.get("x-script-key"), body["messages"])
    reason = _unscripted_reason(choice, body)
    if reason is not None or choice.step is None:
        return _unscripted(ctx, request, body, choice, reason or "no script")
    step = choice.step
    fault = step.fault
    status = fault.status if fault is not None and fault.kind != "malformed" else 200
    ctx.record(
        ENDPOINT,
        request,
        body,
        status,
        key=choice.key,
        step_index=choice.index,
        error=f"fault: {fault.kind}" if fault else None,
    )
    if not await wait(request, choice.delay_ms + step.delay_ms):
        return Response(status_code=499)
    if fault is not None and fault.kind != "malformed":
        return await fault_reply(request, fault)
    return _reply(_completion(ctx, body, step), body, malformed=fault is not None, step=step)


def _reject(ctx: ServerContext, request: Request, body: Any) -> Response | None:
    """The 401 or 400 a real provider would send, recorded; None for a valid request."""
    denied = ctx.check_auth(request)
    if denied is not None:
        ctx.record(ENDPOINT, request, body, 401, error="unauthenticated")
        return denied
    if not isinstance(body, dict):
        ctx.record(ENDPOINT, request, body, 400, error="body is not a JSON object")
        return openai_error(400, "We could not parse the JSON body of your request.")
    try:
        validate_chat(body)
    except BadRequest as exc:
        ctx.record(ENDPOINT, request, body, 400, error=exc.message)
        return openai_error(400, exc.message, param=exc.param)
    return None


def _unscripted_reason(choice: Choice, body: dict[str, Any]) -> str | None:
    step = choice.step
    if step is None:
        return choice.reason or "no script"
    if step.tool_calls and not body.get("tools"):
        return (
            f"script mismatch: step {choice.index} of {choice.key!r} returns tool calls "
            "but the request declared no tools"
        )
    return None


def _unscripted(
    ctx: ServerContext, request: Request, body: Any, choice: Choice, reason: str
) -> JSONResponse:
    """Fail loudly (500, never to be retried), so a test sees the gap in its script."""
    ctx.record(
        ENDPOINT,
        request,
        body,
        500,
        key=choice.key,
        step_index=choice.index,
        unscripted=True,
        error=reason,
    )
    return openai_error(
        500,
        f"unscripted request: {reason}",
        type_="scripted_llm_error",
        code="unscripted",
        headers={"x-should-retry": "false"},
    )


def _completion(ctx: ServerContext, body: dict[str, Any], step: Step) -> Completion:
    completion_id = f"chatcmpl-local-{ctx.next_id()}"
    content = step.json_content if step.json_content is not None else step.text
    calls = [
        {
            "id": spec.id or f"call_{completion_id.rsplit('-', 1)[-1]}_{i}",
            "type": "function",
            "function": {"name": spec.name, "arguments": spec.arguments},
        }
        for i, spec in enumerate(step.tool_calls)
    ]
    output = (content or "") + "".join(spec.name + spec.arguments for spec in step.tool_calls)
    return Completion(
        id=completion_id,
        created=int(time.time()),
        model=str(body["model"]),
        content=content,
        calls=calls,
        finish=step.finish_reason or ("tool_calls" if calls else "stop"),
        usage=usage_for(body, output, step),
    )


def _reply(
    completion: Completion, body: dict[str, Any], *, malformed: bool, step: Step
) -> Response:
    if body.get("stream") is True:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) or bool(
            (body.get("usage") or {}).get("include")
        )
        return StreamingResponse(
            stream(completion, step, include_usage=include_usage, malformed=malformed),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    if malformed:  # a truncated JSON body with a 200
        text = json.dumps(completion.payload())
        return Response(text[: len(text) // 2], status_code=200, media_type="application/json")
    return JSONResponse(completion.payload())
