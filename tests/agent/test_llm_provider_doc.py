"""docs/adding-an-llm-provider.md stays true: its worked example (a client over two clients)
is a working ``LLMClient``: with the first provider unavailable the second answers, through a
real ``Agent``, in ``answer`` and in ``stream``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from agent_helpers import NORTHWIND_STAFF

from agent.answer import DoneEvent
from agent.llm.base import (
    ChatRequest,
    ChatResult,
    LLMClient,
    ProviderRejected,
    ProviderUnavailable,
    StreamEvent,
)
from agent.loop import Agent
from agent.testing import ScriptedModel, text_reply

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-an-llm-provider.md"


def fallback_client(primary: LLMClient, fallback: LLMClient) -> LLMClient:
    [block] = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    namespace: dict[str, Any] = {
        "dataclasses": dataclasses,
        "AsyncIterator": AsyncIterator,
        "ChatRequest": ChatRequest,
        "ChatResult": ChatResult,
        "LLMClient": LLMClient,
        "ProviderUnavailable": ProviderUnavailable,
        "StreamEvent": StreamEvent,
    }
    exec(block, namespace)
    client: LLMClient = namespace["FallbackClient"](primary, fallback)
    return client


async def test_the_fallback_answers_when_the_primary_is_unavailable(
    make_local_agent: Callable[..., Agent],
) -> None:
    down = ProviderUnavailable("hosted: 503", status_code=503)
    hosted = ScriptedModel(down, down, model="hosted/big")
    local = ScriptedModel(text_reply("Hello from the local model."), model="local/small")
    local.script(text_reply("Hello again."))
    agent = make_local_agent(fallback_client(hosted, local))

    answer = await agent.answer("Hello!", NORTHWIND_STAFF)
    assert (answer.answer, answer.model, answer.decision) == (
        "Hello from the local model.",
        "local/small",
        "answered",
    )
    events = [event async for event in agent.stream("Hello!", NORTHWIND_STAFF)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.response.answer == "Hello again."
    assert local.requests[0].model is None  # the hosted model's name is not sent to it
    hosted.assert_exhausted()
    local.assert_exhausted()


async def test_a_rejection_is_not_sent_elsewhere(make_local_agent: Callable[..., Agent]) -> None:
    hosted = ScriptedModel(ProviderRejected("bad key", status_code=401))
    local = ScriptedModel()  # any call fails the test (ScriptExhausted)
    answer = await make_local_agent(fallback_client(hosted, local)).answer(
        "Hello!", NORTHWIND_STAFF
    )
    assert answer.decision == "provider_error" and answer.error is not None
    assert answer.error.code == "provider_rejected" and local.requests == []


def test_the_example_keeps_the_port() -> None:
    wrapped = fallback_client(ScriptedModel(model="a"), ScriptedModel(model="b"))
    assert isinstance(wrapped, LLMClient) and wrapped.default_model == "a"
