"""``POST /v1/embeddings``: checked like a real provider, answered with :func:`embed_text`."""

from __future__ import annotations

import base64
import struct
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from local_world.scripted_llm.context import ServerContext
from local_world.scripted_llm.faults import fault_reply
from local_world.scripted_llm.vectors import WORD, embed_text
from local_world.scripted_llm.wire import openai_error, read_json

MAX_EMBEDDING_DIM = 8192
ENDPOINT = "embeddings"


async def create_embeddings(ctx: ServerContext, request: Request) -> Response:
    body = await read_json(request)
    denied = ctx.check_auth(request)
    if denied is not None:
        ctx.record(ENDPOINT, request, body, 401, error="unauthenticated")
        return denied
    problem = embedding_problem(body)
    if problem is not None:
        ctx.record(ENDPOINT, request, body, 400, error=problem)
        return openai_error(400, problem)
    assert isinstance(body, dict)
    fault = ctx.state._pop_embedding_fault()
    if fault is not None:
        ctx.record(ENDPOINT, request, body, fault.status, error=f"fault: {fault.kind}")
        if fault.kind == "malformed":
            return Response(b'{"object": "list", "data": [{"embed', media_type="application/json")
        return await fault_reply(request, fault)
    ctx.record(ENDPOINT, request, body, 200)
    return JSONResponse(embeddings_payload(body, ctx.state.embedding_dim))


def embeddings_payload(body: dict[str, Any], default_dim: int) -> dict[str, Any]:
    """The ``list`` body for a valid request (vectors as floats or base64 little-endian f32)."""
    inputs = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
    dims = int(body.get("dimensions") or default_dim)
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
    tokens = sum(len(WORD.findall(text.lower())) or 1 for text in inputs)
    return {
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def embedding_problem(body: Any) -> str | None:
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
