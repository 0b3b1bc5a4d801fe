"""Conversations behind the Serve ``Ingress``: ``ServeBackend`` (fake ``AgentLoop`` handles,
no Ray) with the conversation store the Ingress builds for itself (``LazyConversationStore``
on the real embedded PostgreSQL), under the real FastAPI app over ASGI. A thread started by
a JSON ``/ask`` continues over SSE, each turn stored once and read back whole; the Ingress's
pool is closed with the backend. A stored citation is re-checked through the Ingress's own
knowledge-base pool: one whose chunk is gone is left out on read and its answer withheld,
also in the history the next ``AgentLoop`` call gets."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.answer import AgentAnswer, AgentEvent, CitationOut, DoneEvent, TokenEvent
from agent.request import AgentRequest
from agent.turns import PriorTurn, history_messages
from conversations.recheck import WITHHELD_ANSWER
from deployments.ingress import ServeBackend
from foundation.settings import Settings
from local_world.claims import encode_claims
from serve_app.api.app import create_app
from serve_app.authz import load_authorizer
from serve_app.threads import LazyConversationStore

pytestmark = pytest.mark.integration

NINA = {"x-gateway-claims": encode_claims("nina", [("northwind", "business_staff")])}


def _answer(text: str) -> AgentAnswer:
    return AgentAnswer(
        answer=text,
        decision="answered",
        answered_by="model",
        model="local/scripted",
        trace_id="t1",
    )


class _Answer:
    def __init__(self, **fields: Any) -> None:
        self.questions: list[str] = []
        self.calls: list[tuple[Any, ...]] = []
        self.fields = fields

    def remote(self, request: AgentRequest) -> Any:
        question = request.question
        self.questions.append(question)
        # What the handle carries besides the question: user, model, top_k, trace, history, earlier.
        self.calls.append(
            (
                request.user,
                request.model,
                request.top_k,
                request.trace_context,
                history_messages(request.earlier, max_tokens=None),  # what the agent derives
                request.earlier,
            )
        )

        async def respond() -> AgentAnswer:
            return _answer(f"answer to {question}").model_copy(update=self.fields)

        return respond()


class _Events:
    def __init__(self, events: list[AgentEvent]) -> None:
        self._events = iter(events)
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[AgentEvent]:
        return self

    async def __anext__(self) -> AgentEvent:
        try:
            return next(self._events)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.cancelled = True


class _Stream:
    def remote(self, request: AgentRequest) -> _Events:
        text = f"answer to {request.question}"
        return _Events([TokenEvent(text=text), DoneEvent(response=_answer(text))])


class _Handle:
    def __init__(self, **fields: Any) -> None:
        self.answer = _Answer(**fields)
        self.stream = _Stream()

    def options(self, **_: Any) -> _Handle:
        return self


def _settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path,
        database_url=db_url,
        llm_api_key="unused",
    )


async def test_a_thread_through_the_serve_ingress(db_url: str, tmp_path: Path) -> None:
    settings = _settings(db_url, tmp_path)
    handle: Any = _Handle()
    backend = ServeBackend(handle, settings)
    assert isinstance(backend.conversations, LazyConversationStore)  # its own, opened lazily
    app = create_app(backend, settings, load_authorizer())
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as http:
            first = await http.post("/ask", json={"question": "one"}, headers=NINA)
            assert first.status_code == 200, first.text
            ident = first.json()["conversation_id"]
            assert uuid.UUID(ident) and first.json()["turn"] == 1
            second = await http.post(
                "/ask",
                json={"question": "two", "conversation_id": ident, "stream": True},
                headers=NINA,
            )
            assert '"turn":2' in second.text and f'"conversation_id":"{ident}"' in second.text
            thread = (await http.get(f"/conversations/{ident}", headers=NINA)).json()
            assert [(t["turn"], t["question"], t["answer"]) for t in thread["turns"]] == [
                (1, "one", "answer to one"),
                (2, "two", "answer to two"),
            ]
            assert (await http.delete(f"/conversations/{ident}", headers=NINA)).status_code == 204
    finally:
        await backend.close()
    assert handle.answer.questions == ["one"]


async def test_the_ingress_rechecks_a_stored_citation_on_read_and_in_history(
    db_url: str, tmp_path: Path
) -> None:
    gone = CitationOut(chunk_id="gone00000001", source="a.md", section="A", snippet="secret")
    handle: Any = _Handle(citations=[gone])
    settings = _settings(db_url, tmp_path)
    backend = ServeBackend(handle, settings)
    app = create_app(backend, settings, load_authorizer())
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ingress"
        ) as http:
            ident = (await http.post("/ask", json={"question": "one"}, headers=NINA)).json()[
                "conversation_id"
            ]
            read = await http.get(f"/conversations/{ident}", headers=NINA)
            (turn,) = read.json()["turns"]
            assert (turn["answer"], turn["answer_withheld"], turn["citations"]) == (
                WITHHELD_ANSWER,
                True,
                [],
            )
            assert "secret" not in read.text and "answer to one" not in read.text
            follow = {"question": "two", "conversation_id": ident}
            assert (await http.post("/ask", json=follow, headers=NINA)).status_code == 200
    finally:
        await backend.close()
    # AgentLoop.answer(AgentRequest(question, user, model, top_k, history, earlier, ...))
    history, earlier = handle.answer.calls[1][4:6]  # calls: the arguments after question
    assert [(m.role, m.content) for m in history] == [
        ("user", "one"),
        ("assistant", WITHHELD_ANSWER),
    ]
    # The follow-up rewriter reads the same re-checked turn (agent.small_model.followups)
    assert earlier == (PriorTurn("one", WITHHELD_ANSWER),)
