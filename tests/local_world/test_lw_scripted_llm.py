"""The scripted OpenAI-compatible server, driven by the real ``openai`` SDK over HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from local_world.scripted_llm import ScriptedLLM, ScriptError, embed_text, parse_script

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_room_occupancy",
            "description": "Live occupancy of a room.",
            "parameters": {
                "type": "object",
                "properties": {"room_id": {"type": "string"}},
                "required": ["room_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "list_sensors",
            "parameters": {
                "type": "object",
                "properties": {"building_id": {"type": "string"}, "room_id": {"type": "string"}},
                "required": ["building_id"],
            },
        },
    },
]


def client(url: str, **kwargs: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="test", **kwargs)


def user(text: str) -> list[Any]:
    return [
        {"role": "system", "content": "You are CrowdVision."},
        {"role": "user", "content": text},
    ]


async def test_text_reply_with_usage_and_cost(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script({"text": "Hello from CrowdVision.", "usage": {"prompt_tokens": 11, "cost": 0.00042}})
    reply = await client(llm_url).chat.completions.create(
        model="openai/gpt-4o-mini", messages=user("hi")
    )
    assert reply.object == "chat.completion"
    assert reply.model == "openai/gpt-4o-mini"
    assert reply.choices[0].message.content == "Hello from CrowdVision."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == 11
    assert reply.usage.total_tokens == 11 + reply.usage.completion_tokens
    assert (reply.usage.model_extra or {})["cost"] == 0.00042
    assert llm.remaining() == 0
    assert llm.unscripted() == []


async def test_json_content_for_json_schema_mode(llm: ScriptedLLM, llm_url: str) -> None:
    decision = {
        "reason": "needs live data",
        "tool": "get_room_occupancy",
        "arguments": {"room_id": "r"},
    }
    llm.script({"json": decision})
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "step", "schema": {"type": "object"}, "strict": True},
    }
    reply = await client(llm_url).chat.completions.create(
        model="local/qwen", messages=user("how full is r?"), response_format=response_format
    )
    assert json.loads(reply.choices[0].message.content or "") == decision
    assert reply.choices[0].message.tool_calls is None
    (recorded,) = llm.chat_requests()
    assert recorded.body["response_format"] == response_format


async def test_tool_calls_then_final_answer(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script(
        {
            "tool_calls": [
                {"name": "get_room_occupancy", "arguments": {"room_id": "room-nwhq-lobby"}}
            ]
        },
        {"text": "The lobby holds 12 people.", "usage": {"cost": 0.001}},
    )
    sdk = client(llm_url)
    messages = user("How busy is the Northwind lobby?")
    first = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_room_occupancy"
    assert json.loads(call.function.arguments) == {"room_id": "room-nwhq-lobby"}

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"occupancy": 12}'},
    ]
    second = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "The lobby holds 12 people."
    bodies = [r.body for r in llm.chat_requests()]
    assert bodies[1]["messages"][-1]["tool_call_id"] == call.id
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == [
        "get_room_occupancy",
        "list_sensors",
    ]


async def test_a_missing_tool_result_is_a_400_like_the_real_api(
    llm: ScriptedLLM, llm_url: str
) -> None:
    llm.script({"text": "unused"})
    messages: list[Any] = [
        *user("q"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            ],
        },
    ]
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        await client(llm_url).chat.completions.create(model="m", messages=messages)
    assert llm.remaining() == 1  # a rejected request consumes no step


async def test_streaming_text(llm: ScriptedLLM, llm_url: str) -> None:
    text = "Room 12A currently has 9 people, about 64% of its capacity."
    llm.script({"text": text, "chunk_chars": 5, "usage": {"cost": 0.0002}})
    stream = await client(llm_url).chat.completions.create(
        model="m", messages=user("12A?"), stream=True, stream_options={"include_usage": True}
    )
    pieces: list[str] = []
    finishes: list[str | None] = []
    usage = None
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        pieces.append(chunk.choices[0].delta.content or "")
        finishes.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == text
    assert len([p for p in pieces if p]) == math.ceil(len(text) / 5)
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert usage is not None and (usage.model_extra or {})["cost"] == 0.0002


async def test_streaming_tool_call_deltas(llm: ScriptedLLM, llm_url: str) -> None:
    arguments = {"building_id": "bld-acme-labs", "room_id": "room-acme-labs-wet-lab"}
    llm.script(
        {
            "tool_calls": [
                {"name": "list_sensors", "arguments": arguments, "id": "call_inv"},
                {"name": "get_room_occupancy", "arguments": {"room_id": "room-acme-labs-wet-lab"}},
            ],
            "chunk_chars": 7,
        }
    )
    stream = await client(llm_url).chat.completions.create(
        model="m", messages=user("what sensors does the wet lab have?"), tools=TOOLS, stream=True
    )
    calls: dict[int, dict[str, Any]] = {}
    argument_deltas: dict[int, int] = {}
    finish = None
    async for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            if delta.id:
                entry["id"] = delta.id
            if delta.function and delta.function.name:
                entry["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                entry["arguments"] += delta.function.arguments
                argument_deltas[delta.index] = argument_deltas.get(delta.index, 0) + 1
    assert finish == "tool_calls"
    assert calls[0]["id"] == "call_inv"
    assert calls[0]["name"] == "list_sensors"
    assert json.loads(calls[0]["arguments"]) == arguments
    assert argument_deltas[0] > 3  # really split across chunks
    assert calls[1]["name"] == "get_room_occupancy"
    assert calls[1]["id"] and calls[1]["id"] != "call_inv"


async def test_raw_sse_framing_ends_with_done(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script({"text": "ok"})
    async with (
        httpx.AsyncClient() as http,
        http.stream(
            "POST",
            f"{llm_url}/v1/chat/completions",
            headers={"authorization": "Bearer test"},
            json={"model": "m", "messages": user("x"), "stream": True},
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = (await response.aread()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


async def test_429_then_success_is_retried_by_the_sdk(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script({"fault": "rate_limit", "retry_after_ms": 20, "retry_after": 5}, {"text": "after"})
    started = time.monotonic()
    reply = await client(llm_url, max_retries=2).chat.completions.create(
        model="m", messages=user("x")
    )
    assert reply.choices[0].message.content == "after"
    assert time.monotonic() - started < 3.0  # retry-after-ms wins over retry-after
    assert [r.status for r in llm.chat_requests()] == [429, 200]


async def test_429_headers_on_the_wire(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script({"fault": "rate_limit", "retry_after": 7})
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{llm_url}/v1/chat/completions",
            headers={"authorization": "Bearer test"},
            json={"model": "m", "messages": user("x")},
        )
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["type"] == "rate_limit_error"


async def test_500_surfaces_without_retries_and_is_retried_with_them(
    llm: ScriptedLLM, llm_url: str
) -> None:
    llm.script({"fault": "server_error", "message": "upstream exploded"})
    with pytest.raises(openai.InternalServerError, match="upstream exploded"):
        await client(llm_url, max_retries=0).chat.completions.create(model="m", messages=user("x"))

    llm.script({"fault": "server_error", "status": 503}, {"text": "recovered"})
    reply = await client(llm_url, max_retries=1).chat.completions.create(
        model="m", messages=user("x")
    )
    assert reply.choices[0].message.content == "recovered"
    assert [r.status for r in llm.chat_requests()] == [500, 503, 200]


async def test_unscripted_request_fails_loudly(llm: ScriptedLLM, llm_url: str) -> None:
    with pytest.raises(openai.InternalServerError, match="unscripted request") as caught:
        await client(llm_url).chat.completions.create(
            model="m", messages=user("nobody scripted me")
        )
    assert caught.value.status_code == 500
    assert caught.value.code == "unscripted"
    (recorded,) = llm.requests  # x-should-retry: false, so the SDK did not retry
    assert recorded.unscripted
    assert "nobody scripted me" in (recorded.error or "")
    async with httpx.AsyncClient() as http:
        log = (await http.get(f"{llm_url}/_requests")).json()
    assert log["unscripted"] == 1

    # running past the end of a script is just as loud
    llm.script({"text": "only one"})
    sdk = client(llm_url)
    await sdk.chat.completions.create(model="m", messages=user("x"))
    with pytest.raises(openai.InternalServerError, match="exhausted"):
        await sdk.chat.completions.create(model="m", messages=user("x"))
    assert len(llm.unscripted()) == 2


async def test_tool_calls_without_declared_tools_is_a_script_mismatch(
    llm: ScriptedLLM, llm_url: str
) -> None:
    llm.script({"tool_calls": [{"name": "list_sensors", "arguments": {}}]})
    with pytest.raises(openai.InternalServerError, match="declared no tools"):
        await client(llm_url).chat.completions.create(model="m", messages=user("x"))
    assert llm.unscripted()


async def test_keyed_scripts_keep_concurrent_conversations_apart(
    llm: ScriptedLLM, llm_url: str
) -> None:
    async with httpx.AsyncClient() as http:
        for name in ("alpha", "beta", "gamma"):
            loaded = await http.post(
                f"{llm_url}/_script",
                json={
                    "key": f"question {name}",
                    "steps": [{"text": f"answer {name}", "delay_ms": 50}],
                },
            )
            assert loaded.status_code == 201
    sdk = client(llm_url)
    replies = await asyncio.gather(
        *(
            sdk.chat.completions.create(model="m", messages=user(f"question {name}"))
            for name in ("gamma", "alpha", "beta")
        )
    )
    assert [r.choices[0].message.content for r in replies] == [
        "answer gamma",
        "answer alpha",
        "answer beta",
    ]
    # a header names the script explicitly, whatever the messages say
    llm.script({"text": "by header"}, key="k-123")
    reply = await sdk.chat.completions.create(
        model="m", messages=user("anything"), extra_headers={"x-script-key": "k-123"}
    )
    assert reply.choices[0].message.content == "by header"
    # a key contained in a longer first user message also selects the script
    llm.script({"text": "by substring"}, key="Northwind lobby")
    reply = await sdk.chat.completions.create(
        model="m", messages=user("Context: ... How busy is the Northwind lobby right now?")
    )
    assert reply.choices[0].message.content == "by substring"
    assert llm.unscripted() == []


async def test_loop_mode_replays_per_conversation_with_a_fixed_delay(
    llm: ScriptedLLM, llm_url: str
) -> None:
    llm.load(
        {
            "mode": "loop",
            "delay_ms": 150,
            "steps": [
                {"tool_calls": [{"name": "get_room_occupancy", "arguments": {"room_id": "r"}}]},
                {"text": "done"},
            ],
        }
    )
    sdk = client(llm_url)

    async def conversation(i: int) -> str | None:
        messages = user(f"bench question {i}")
        first = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        message = first.choices[0].message
        (call,) = message.tool_calls or []
        messages += [
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "{}"},
        ]
        second = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return second.choices[0].message.content

    started = time.monotonic()
    results = await asyncio.gather(*(conversation(i) for i in range(8)))
    elapsed = time.monotonic() - started
    assert results == ["done"] * 8
    assert 0.3 <= elapsed < 2.0  # two hops of 150 ms each, conversations in parallel
    assert [p["served"] for p in llm.progress()] == [16]


async def test_hang_outlasts_the_client_timeout(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script({"fault": "hang"})
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await client(llm_url, max_retries=0, timeout=0.3).chat.completions.create(
            model="m", messages=user("x")
        )
    assert time.monotonic() - started < 2.0


async def test_slow_step_delays_the_reply(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script({"text": "slow", "delay_ms": 200})
    started = time.monotonic()
    reply = await client(llm_url).chat.completions.create(model="m", messages=user("x"))
    assert reply.choices[0].message.content == "slow"
    assert time.monotonic() - started >= 0.2


async def test_malformed_bodies_break_the_client(llm: ScriptedLLM, llm_url: str) -> None:
    llm.script({"fault": "malformed"}, {"fault": "malformed"})
    sdk = client(llm_url, max_retries=0)
    with pytest.raises(json.JSONDecodeError):
        await sdk.chat.completions.create(model="m", messages=user("x"))
    stream = await sdk.chat.completions.create(model="m", messages=user("x"), stream=True)
    with pytest.raises(json.JSONDecodeError):
        async for _ in stream:
            pass


async def test_bad_scripts_are_rejected_loudly(llm_url: str) -> None:
    bad_scripts: list[dict[str, Any]] = [
        {"steps": []},
        {"steps": [{"txt": "typo"}]},
        {"steps": [{"text": "a", "json": {}}]},
        {"steps": [{"fault": "meteor"}]},
        {"steps": [{"text": "a", "status": 500}]},
        {"mode": "forever", "steps": [{"text": "a"}]},
    ]
    for bad in bad_scripts:
        with pytest.raises(ScriptError):
            parse_script(bad)
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{llm_url}/_script", json={"steps": [{"txt": "typo"}]})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_script"


async def test_auth_header_is_required(llm: ScriptedLLM, llm_url: str) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{llm_url}/v1/chat/completions", json={"model": "m", "messages": user("x")}
        )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"


async def test_models(llm_url: str) -> None:
    models = await client(llm_url).models.list()
    ids = [m.id for m in models.data]
    assert "openai/gpt-4o-mini" in ids and "openai/text-embedding-3-small" in ids


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_embeddings_are_deterministic_normalised_and_similar(
    llm: ScriptedLLM, llm_url: str
) -> None:
    sdk = client(llm_url)
    texts = [
        "How many people are in the Harbor Warehouse loading dock?",
        "how many people are in the harbor warehouse loading dock right now",
        "Reset your password from the account settings page.",
    ]
    first = await sdk.embeddings.create(model="openai/text-embedding-3-small", input=texts)
    again = await sdk.embeddings.create(model="openai/text-embedding-3-small", input=texts)
    vectors = [d.embedding for d in first.data]
    assert [d.index for d in first.data] == [0, 1, 2]
    assert all(len(v) == 384 for v in vectors)
    assert [d.embedding for d in again.data] == vectors
    assert all(abs(math.sqrt(_cosine(v, v)) - 1.0) < 1e-5 for v in vectors)
    assert _cosine(vectors[0], vectors[1]) > 0.8
    assert _cosine(vectors[0], vectors[2]) < 0.3
    # the SDK asked for base64; float over plain HTTP gives the same numbers
    async with httpx.AsyncClient() as http:
        raw = await http.post(
            f"{llm_url}/v1/embeddings",
            headers={"authorization": "Bearer test"},
            json={"model": "e", "input": texts[0], "encoding_format": "float", "dimensions": 64},
        )
    floats = raw.json()["data"][0]["embedding"]
    assert len(floats) == 64
    assert floats == pytest.approx(embed_text(texts[0], 64))
    assert vectors[0] == pytest.approx(embed_text(texts[0]), abs=1e-6)
    assert raw.json()["usage"]["prompt_tokens"] > 0


async def test_embedding_dimensions_and_faults(llm: ScriptedLLM, llm_url: str) -> None:
    sdk = client(llm_url, max_retries=0)
    reply = await sdk.embeddings.create(model="e", input="occupancy", dimensions=768)
    assert len(reply.data[0].embedding) == 768
    llm.queue_embedding_faults({"fault": "server_error", "status": 503})
    with pytest.raises(openai.InternalServerError):
        await sdk.embeddings.create(model="e", input="occupancy")
    assert (await sdk.embeddings.create(model="e", input="occupancy")).data
    with pytest.raises(openai.BadRequestError):
        await sdk.embeddings.create(model="e", input="")
