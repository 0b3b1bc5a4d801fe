"""The span tree of one /ask run, as an exporter sees it: the real loop, the real tool
registry (twin simulator over HTTP), the real ``HybridRetriever`` (over a small in-memory
store, so the test needs no database), the scripted model server over HTTP, and an in-memory
span exporter. Checked with payloads off (no request text anywhere) and on, and once more as
``local_world``'s OTLP/HTTP collector on 127.0.0.1 decodes it from the wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from agent_helpers import NORTHWIND_STAFF, Call, Calls, Say, script_steps
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import StatusCode

from agent.loop import Agent
from foundation.observability.setup import build_exporter
from foundation.settings import Settings
from local_world.otlp_collector import OtlpCollector, span_tree
from local_world.scripted_llm import ScriptedLLM
from retrieval.embedders import Vectors
from retrieval.rerankers import NoopReranker
from retrieval.search import HybridRetriever, RetrievalConfig
from retrieval.store import Candidate

# the real adapter over the HTTP scripted model server (its usage and model on the generation
# spans) and an OTLP/HTTP collector on 127.0.0.1
pytestmark = pytest.mark.allow_sockets

QUESTION = "What is the zebra-cooldown of Harbor Warehouse alerts?"
SEARCH_QUERY = "zebra-cooldown alerts"
CHUNK_TEXT = "The quokka-secret cooldown is 15 minutes for occupancy alerts."
BUILDING = "bld-northwind-harbor"
ANSWER = "The cooldown is 15 minutes [^c1]."

EXPECTED_TREE = (
    "agent.answer",
    (
        (
            "agent.hop.1",
            (
                ("gen_ai.chat local/scripted", ()),
                ("tool.get_building", ()),
                (
                    "tool.search_docs",
                    (
                        ("retrieve.embed", ()),
                        ("retrieve.keyword", ()),
                        ("retrieve.rerank", ()),
                        ("retrieve.vector", ()),
                    ),
                ),
            ),
        ),
        ("agent.hop.2", (("gen_ai.chat local/scripted", ()),)),
    ),
)


class _Store:
    """Stands in for the database side of ``HybridRetriever``: fixed candidates."""

    async def hybrid_candidates(self, *args: Any, **kwargs: Any) -> list[Candidate]:
        return [
            Candidate("c1", "user/alerts.md", "Alerts", "Cooldown", "text", CHUNK_TEXT, 1, 1, 0.1),
            Candidate("c2", "user/faq.md", "FAQ", "Alerts", "text", "Other text.", 2, None, 0.2),
        ]


class _Embedder:
    name = "fake-embedder"
    dim = 4
    max_tokens = 128

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def encode(self, texts: Sequence[str]) -> Vectors:
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        return self.encode(texts)


def _retriever(payloads: bool) -> HybridRetriever:
    return HybridRetriever(
        _Store(),  # type: ignore[arg-type]
        _Embedder(),
        NoopReranker(),
        RetrievalConfig(observe_payloads=payloads),
    )


def tree(spans: Sequence[ReadableSpan]) -> tuple[Any, ...]:
    """(name, children) from the root, children sorted by name (tools run concurrently)."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans if s.context}
    for span in spans:
        parent = span.parent.span_id if span.parent and span.parent.span_id in ids else None
        by_parent.setdefault(parent, []).append(span)

    def node(span: ReadableSpan) -> tuple[Any, ...]:
        assert span.context is not None
        children = sorted(by_parent.get(span.context.span_id, []), key=lambda s: s.name)
        return (span.name, tuple(node(c) for c in children))

    roots = by_parent.get(None, [])
    assert len(roots) == 1, [s.name for s in roots]
    return node(roots[0])


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def everything_recorded(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute value and event attribute of every span, as one string."""
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(str(v) for v in (span.attributes or {}).values())
        parts.append(span.status.description or "")
        for event in span.events:
            parts.append(event.name)
            parts.extend(str(v) for v in (event.attributes or {}).values())
    return "\n".join(parts)


def _run_script(llm: ScriptedLLM) -> None:
    llm.script(
        *script_steps(
            "native",
            Calls(
                (
                    Call("search_docs", {"query": SEARCH_QUERY}),
                    Call("get_building", {"building_id": BUILDING}),
                )
            ),
            Say(ANSWER),
        ),
        key=QUESTION,
    )


@pytest.fixture
def agent_for(make_agent: Callable[..., Agent]) -> Callable[[bool], Agent]:
    def make(payloads: bool) -> Agent:
        agent = make_agent("native", observe_payloads=payloads)
        agent.tools.retriever = _retriever(payloads)  # type: ignore[attr-defined]
        return agent

    return make


async def test_two_tool_request_tree_and_attributes_without_payloads(
    agent_for: Callable[[bool], Agent], llm: ScriptedLLM, spans: Any
) -> None:
    _run_script(llm)
    answer = await agent_for(False).answer(QUESTION, NORTHWIND_STAFF)
    assert answer.decision == "answered" and [c.chunk_id for c in answer.citations] == ["c1"]
    finished = spans.get_finished_spans()

    assert tree(finished) == EXPECTED_TREE
    assert {s.context.trace_id for s in finished} == {int(answer.trace_id or "0", 16)}
    for span in finished:  # the request's identity is on every span
        assert span.attributes is not None
        assert span.attributes["user.id"] == NORTHWIND_STAFF.sub
        assert span.attributes["session.id"] == answer.trace_id
        assert "langfuse.observation.type" in span.attributes
        assert span.status.status_code is not StatusCode.ERROR

    root = one(finished, "agent.answer")
    assert root.attributes == {
        **dict(root.attributes or {}),
        "langfuse.observation.type": "agent",
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.request.model": "local/scripted",
        "gen_ai.response.model": "local/scripted",
        "agent.decision": "answered",
        "agent.hops": 2,
        "agent.tool_calls": 2,
        "agent.citations": 1,
        "agent.ungrounded_claims": 0,
        "gen_ai.usage.input_tokens": answer.usage.input_tokens,
        "gen_ai.usage.output_tokens": answer.usage.output_tokens,
        "gen_ai.usage.cost": 0.0,
    }
    generations = [s for s in finished if s.name.startswith("gen_ai.chat")]
    for generation, hop in zip(
        sorted(generations, key=lambda s: s.start_time or 0), answer.usage.hops, strict=True
    ):
        attributes = dict(generation.attributes or {})
        assert attributes["langfuse.observation.type"] == "generation"
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "local"
        assert attributes["gen_ai.request.model"] == "local/scripted"
        assert attributes["gen_ai.response.model"] == "local/scripted"
        assert attributes["gen_ai.usage.input_tokens"] == hop.input_tokens
        assert attributes["gen_ai.usage.output_tokens"] == hop.output_tokens
        assert json.loads(str(attributes["langfuse.observation.cost_details"])) == {"total": 0.0}
    search = dict(one(finished, "tool.search_docs").attributes or {})
    assert search["langfuse.observation.type"] == "tool"
    assert search["gen_ai.tool.name"] == "search_docs"
    assert search["gen_ai.operation.name"] == "execute_tool"
    assert str(search["gen_ai.tool.call.id"]).startswith("call_")
    assert search["tool.ok"] is True
    vector = dict(one(finished, "retrieve.vector").attributes or {})
    keyword = dict(one(finished, "retrieve.keyword").attributes or {})
    assert (
        vector["gen_ai.retrieval.documents.count"],
        keyword["gen_ai.retrieval.documents.count"],
    ) == (2, 1)
    assert (
        vector["langfuse.observation.type"] == keyword["langfuse.observation.type"] == "retriever"
    )
    embed = dict(one(finished, "retrieve.embed").attributes or {})
    assert (embed["langfuse.observation.type"], embed["gen_ai.request.model"]) == (
        "embedding",
        "fake-embedder",
    )
    assert dict(one(finished, "retrieve.rerank").attributes or {})["retrieve.reranker"] == "noop"

    # payloads off: no question, query, document, argument or answer text anywhere
    recorded = everything_recorded(finished)
    for secret in ("zebra", "quokka", BUILDING, "15 minutes", "Harbor"):
        assert secret.lower() not in recorded.lower(), secret
    assert not any(
        k.startswith(
            (
                "langfuse.observation.input",
                "langfuse.observation.output",
                "gen_ai.input",
                "gen_ai.output",
                "gen_ai.tool.call.arg",
                "gen_ai.tool.call.result",
                "gen_ai.retrieval.query",
                "gen_ai.retrieval.documents\x00",
            )
        )
        for s in finished
        for k in (s.attributes or {})
    )


async def test_payloads_on_records_the_content(
    agent_for: Callable[[bool], Agent], llm: ScriptedLLM, spans: Any
) -> None:
    _run_script(llm)
    answer = await agent_for(True).answer(QUESTION, NORTHWIND_STAFF)
    finished = spans.get_finished_spans()
    assert tree(finished) == EXPECTED_TREE

    root = dict(one(finished, "agent.answer").attributes or {})
    assert root["langfuse.observation.input"] == root["langfuse.trace.input"] == QUESTION
    assert root["langfuse.observation.output"] == answer.answer
    first_chat = min(
        (s for s in finished if s.name.startswith("gen_ai.chat")), key=lambda s: s.start_time or 0
    )
    messages = json.loads(str((first_chat.attributes or {})["gen_ai.input.messages"]))
    assert messages[-1] == {"role": "user", "parts": [{"type": "text", "content": QUESTION}]}
    output = json.loads(str((first_chat.attributes or {})["gen_ai.output.messages"]))
    assert [p["name"] for p in output[0]["parts"]] == ["search_docs", "get_building"]
    building = dict(one(finished, "tool.get_building").attributes or {})
    assert json.loads(str(building["gen_ai.tool.call.arguments"])) == {"building_id": BUILDING}
    assert BUILDING in str(building["gen_ai.tool.call.result"])
    rerank = dict(one(finished, "retrieve.rerank").attributes or {})
    assert rerank["gen_ai.retrieval.query.text"] == SEARCH_QUERY
    documents = json.loads(str(rerank["gen_ai.retrieval.documents"]))
    assert [d["id"] for d in documents] == ["c1", "c2"] and documents[0]["text"] == CHUNK_TEXT


async def test_a_failed_tool_gets_error_status_and_an_exception_event(
    agent_for: Callable[[bool], Agent], llm: ScriptedLLM, spans: Any
) -> None:
    question = "How busy is bld-nowhere?"
    llm.script(
        *script_steps(
            "native",
            Call("get_building", {"building_id": "bld-nowhere"}),
            Call("no_such_tool", {"x": 1}),
            Say("I could not find that building."),
        ),
        key=question,
    )
    answer = await agent_for(False).answer(question, NORTHWIND_STAFF)
    assert [c.ok for c in answer.tool_calls] == [False, False]
    finished = spans.get_finished_spans()

    failed = one(finished, "tool.get_building")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "tool_error"
    assert (failed.attributes or {})["tool.error.kind"] == "tool_error"
    (event,) = failed.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "ToolError"
    unknown = one(finished, "tool.unknown")  # the model's made-up name is not a span name
    assert unknown.status.status_code is StatusCode.ERROR
    assert "gen_ai.tool.name" not in (unknown.attributes or {})
    assert "no_such_tool" not in everything_recorded(finished)
    assert "bld-nowhere" not in everything_recorded(finished)
    # the run itself succeeded: the model read the errors and answered
    assert one(finished, "agent.answer").status.status_code is not StatusCode.ERROR


async def test_a_failed_tool_keeps_its_message_with_payloads_on(
    agent_for: Callable[[bool], Agent], llm: ScriptedLLM, spans: Any
) -> None:
    question = "Where is bld-nowhere?"
    llm.script(
        *script_steps(
            "native", Call("get_building", {"building_id": "bld-nowhere"}), Say("Not found.")
        ),
        key=question,
    )
    answer = await agent_for(True).answer(question, NORTHWIND_STAFF)
    failed = one(spans.get_finished_spans(), "tool.get_building")
    assert failed.status.description == answer.tool_calls[0].error
    assert (failed.events[0].attributes or {})["exception.message"] == answer.tool_calls[0].error


async def test_a_caller_trace_is_continued_and_streaming_has_the_same_tree(
    agent_for: Callable[[bool], Agent], llm: ScriptedLLM, spans: Any
) -> None:
    from foundation.tracing import carrier_from_headers, use_context

    _run_script(llm)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    carrier = carrier_from_headers({"traceparent": parent}, user_id="spoofed", session_id="s-42")
    with use_context(carrier):
        events = [e async for e in agent_for(False).stream(QUESTION, NORTHWIND_STAFF)]
    assert events[-1].type == "done"
    finished = spans.get_finished_spans()
    assert tree(finished) == EXPECTED_TREE
    root = one(finished, "agent.answer")
    assert root.parent is not None and root.parent.span_id == 0x00F067AA0BA902B7
    for span in finished:
        assert span.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
        attributes = span.attributes or {}
        # the authenticated caller wins over whatever an upstream hop put in baggage
        assert (attributes["user.id"], attributes["session.id"]) == (NORTHWIND_STAFF.sub, "s-42")


# --- the same run over real OTLP/HTTP ----------------------------------------------------------

OTLP_HEADERS = "Authorization=Basic%20cGstbGYtMTpzay1sZi0x,x-langfuse-ingestion-version=4"


class _Tap(SpanProcessor):
    """Forwards finished spans to ``target`` while one is set: the session's global provider
    (the ``spans`` fixture's) has no way to remove a processor once added."""

    def __init__(self) -> None:
        self.target: SpanProcessor | None = None

    def on_end(self, span: ReadableSpan) -> None:
        target = self.target
        if target is not None:
            target.on_end(span)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        target = self.target
        return target.force_flush(timeout_millis) if target is not None else True


@pytest.fixture(scope="module")
def _tap(_span_memory: Any) -> _Tap:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    tap = _Tap()
    provider.add_span_processor(tap)
    return tap


@pytest.fixture
def otlp_export(
    _tap: _Tap, otlp_collector: tuple[str, OtlpCollector]
) -> Iterator[BatchSpanProcessor]:
    """For one test, the global provider also exports through the batch processor and OTLP
    exporter the settings build (as with OTEL_EXPORTER_OTLP_ENDPOINT/_HEADERS set)."""
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        otel_exporter_otlp_endpoint=otlp_collector[0],
        otel_exporter_otlp_headers=OTLP_HEADERS,  # type: ignore[arg-type]
    )
    batch = BatchSpanProcessor(build_exporter(settings))
    _tap.target = batch
    try:
        yield batch
    finally:
        _tap.target = None
        batch.shutdown()


async def test_a_real_run_arrives_at_an_otlp_collector(
    agent_for: Callable[[bool], Agent],
    llm: ScriptedLLM,
    spans: Any,
    otlp_export: BatchSpanProcessor,
    otlp_collector: tuple[str, OtlpCollector],
) -> None:
    _run_script(llm)
    answer = await agent_for(False).answer(QUESTION, NORTHWIND_STAFF)
    assert await asyncio.to_thread(otlp_export.force_flush, 10_000)

    collector = otlp_collector[1]
    received = collector.snapshot()
    assert span_tree(received) == EXPECTED_TREE
    # exactly the spans the in-memory exporter saw, in one trace: the id /ask returns
    assert sorted(s.span_id for s in received) == sorted(
        format(s.context.span_id, "016x") for s in spans.get_finished_spans()
    )
    assert {s.trace_id for s in received} == {answer.trace_id}
    assert {s.name: s.attributes["langfuse.observation.type"] for s in received} == {
        "agent.answer": "agent",
        "agent.hop.1": "chain",
        "agent.hop.2": "chain",
        "gen_ai.chat local/scripted": "generation",
        "tool.get_building": "tool",
        "tool.search_docs": "tool",
        "retrieve.embed": "embedding",
        "retrieve.vector": "retriever",
        "retrieve.keyword": "retriever",
        "retrieve.rerank": "retriever",
    }
    for span in received:
        assert span.resource["service.name"] == "agent-service"
        assert (span.attributes["user.id"], span.attributes["session.id"]) == (
            NORTHWIND_STAFF.sub,
            answer.trace_id,
        )
        assert span.status_code != 2  # not STATUS_CODE_ERROR

    by_name = {s.name: s for s in received}
    root = by_name["agent.answer"]
    assert root.parent_span_id == ""  # a true root, not the child of an invented span
    assert root.attributes == {
        **root.attributes,
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "crowdvision-assistant",
        "langfuse.trace.name": "agent.answer",
        "agent.decision": "answered",
        "agent.hops": 2,
        "gen_ai.usage.input_tokens": answer.usage.input_tokens,
        "gen_ai.usage.output_tokens": answer.usage.output_tokens,
    }
    generations = sorted(
        (s for s in received if s.name.startswith("gen_ai.chat")), key=lambda s: s.start_ns
    )
    for generation, hop in zip(generations, answer.usage.hops, strict=True):
        assert generation.attributes["gen_ai.operation.name"] == "chat"
        assert generation.attributes["gen_ai.provider.name"] == "local"
        assert generation.attributes["gen_ai.request.model"] == "local/scripted"
        assert generation.attributes["gen_ai.usage.input_tokens"] == hop.input_tokens
        assert generation.attributes["gen_ai.usage.output_tokens"] == hop.output_tokens
        assert json.loads(generation.attributes["langfuse.observation.cost_details"]) == {
            "total": 0.0
        }
    search = by_name["tool.search_docs"].attributes
    assert (search["gen_ai.tool.name"], search["tool.ok"]) == ("search_docs", True)
    assert by_name["retrieve.vector"].attributes["gen_ai.retrieval.documents.count"] == 2

    # at <OTEL_EXPORTER_OTLP_ENDPOINT>/v1/traces (the only path the collector answers), with
    # the configured headers
    assert collector.requests
    for headers in collector.requests:
        assert headers["authorization"] == "Basic cGstbGYtMTpzay1sZi0x"
        assert headers["x-langfuse-ingestion-version"] == "4"
    arrived = repr(received).lower()
    for secret in ("zebra", "quokka", BUILDING, "15 minutes", "harbor"):
        assert secret.lower() not in arrived, secret  # payloads off
