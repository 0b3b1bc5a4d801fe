"""Export over real OTLP/HTTP: a provider built by ``build_provider`` with the exporter
``build_exporter`` makes from the settings (OTEL_EXPORTER_OTLP_ENDPOINT/_HEADERS) sends an
agent-shaped span tree to ``local_world``'s collector on 127.0.0.1, which decodes the protobuf
and answers only at ``<base>/v1/traces`` (the ``otlp_collector`` fixture mounts it under
Langfuse's ``/api/public/otel``). The provider is not installed globally (the session's global
one belongs to the ``spans`` fixture); a real ``Agent`` run through the global provider is
exported the same way in ``tests/agent/test_loop_tracing.py``."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import context as otel_context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from agent.tools.base import ToolError
from foundation.observability import attributes as attr
from foundation.observability.setup import build_exporter, build_provider
from foundation.observability.spans import Observer, in_span, to_json
from foundation.settings import Settings
from foundation.tracing import ROOT_TRACE_KEY, carrier_from_headers, request_context, use_context
from local_world.otlp_collector import CollectedSpan, OtlpCollector, span_tree

SECRET = "s3cr3t-t0ken"
HEADERS = f"Authorization=Basic%20{SECRET},x-langfuse-ingestion-version=4"
SERVICE = "agent-service-otlp-test"
QUESTION = "What is the zebra-cooldown?"
ERROR = 2  # Status.STATUS_CODE_ERROR


def _settings(endpoint: str) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        otel_exporter_otlp_endpoint=endpoint,
        otel_exporter_otlp_headers=HEADERS,  # type: ignore[arg-type]
        otel_service_name=SERVICE,
    )


@pytest.fixture
def provider(otlp_collector: tuple[str, OtlpCollector]) -> Iterator[TracerProvider]:
    settings = _settings(otlp_collector[0])
    provider = build_provider(settings, "otlp-test", exporter=build_exporter(settings))
    yield provider
    provider.shutdown()


def _emit_agent_tree(provider: TracerProvider, *, payloads: bool) -> str:
    """agent.answer > agent.hop.1 > (gen_ai.chat, a failed tool.get_building), opened the way
    the loop opens them: against explicit parent contexts under the request's context.
    Returns the trace id the ingress picked."""
    tracer = provider.get_tracer("agent-service")
    observer = Observer(payloads=payloads)
    carrier = carrier_from_headers({}, user_id="mallory", session_id="conv-1")
    with use_context(carrier):
        parent = request_context("user-7")  # the authenticated caller wins over baggage
        token = otel_context.attach(parent)  # the preset trace id is read from here
        try:
            root = tracer.start_span(
                "agent.answer",
                context=parent,
                attributes={
                    attr.LANGFUSE_TYPE: "agent",
                    attr.GEN_AI_OPERATION: "invoke_agent",
                    attr.GEN_AI_AGENT_NAME: attr.AGENT_NAME,
                    attr.LANGFUSE_TRACE_NAME: "agent.answer",
                },
            )
        finally:
            otel_context.detach(token)
        observer.payload(root, attr.LANGFUSE_INPUT, QUESTION)
        hop = tracer.start_span(
            "agent.hop.1",
            context=in_span(root, parent),
            attributes={attr.LANGFUSE_TYPE: "chain", attr.AGENT_HOP: 1},
        )
        hop_ctx = in_span(hop, parent)
        generation = tracer.start_span(
            "gen_ai.chat m-1",
            context=hop_ctx,
            attributes={
                attr.LANGFUSE_TYPE: "generation",
                attr.GEN_AI_OPERATION: "chat",
                attr.GEN_AI_PROVIDER: "openrouter",
                attr.GEN_AI_REQUEST_MODEL: "m-1",
            },
        )
        generation.set_attribute(attr.GEN_AI_INPUT_TOKENS, 120)
        generation.set_attribute(attr.GEN_AI_OUTPUT_TOKENS, 30)
        generation.set_attribute(attr.GEN_AI_COST, 0.0015)
        generation.set_attribute(attr.LANGFUSE_COST_DETAILS, to_json({"total": 0.0015}))
        generation.set_attribute(attr.GEN_AI_FINISH_REASONS, ["tool_calls"])
        generation.end()
        tool = tracer.start_span(
            "tool.get_building",
            context=hop_ctx,
            attributes={
                attr.LANGFUSE_TYPE: "tool",
                attr.GEN_AI_OPERATION: "execute_tool",
                attr.GEN_AI_TOOL_NAME: "get_building",
                attr.GEN_AI_TOOL_CALL_ID: "call_1",
            },
        )
        observer.payload(tool, attr.GEN_AI_TOOL_ARGUMENTS, {"building_id": "bld-zebra"})
        tool.set_attribute(attr.TOOL_OK, False)
        tool.set_attribute(attr.TOOL_ERROR_KIND, "tool_error")
        error = ToolError("no building bld-zebra")
        observer.fail(tool, "tool_error", message=str(error), exception=error)
        tool.end()
        hop.end()
        root.end()
        return carrier[ROOT_TRACE_KEY]


def _by_name(spans: list[CollectedSpan]) -> dict[str, CollectedSpan]:
    named = {s.name: s for s in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def test_the_tree_arrives_with_langfuse_and_genai_attributes(
    provider: TracerProvider, otlp_collector: tuple[str, OtlpCollector]
) -> None:
    trace_id = _emit_agent_tree(provider, payloads=False)
    assert provider.force_flush(10_000)

    received = otlp_collector[1].snapshot()
    assert span_tree(received) == (
        "agent.answer",
        (("agent.hop.1", (("gen_ai.chat m-1", ()), ("tool.get_building", ()))),),
    )
    spans = _by_name(received)
    root, hop = spans["agent.answer"], spans["agent.hop.1"]
    generation, tool = spans["gen_ai.chat m-1"], spans["tool.get_building"]

    # one trace, the id the ingress picked, and agent.answer is a true root (no invented parent)
    assert {s.trace_id for s in received} == {trace_id}
    assert root.parent_span_id == ""
    assert hop.parent_span_id == root.span_id
    assert generation.parent_span_id == tool.parent_span_id == hop.span_id

    for span in received:
        assert span.resource["service.name"] == SERVICE
        assert span.resource["service.component"] == "otlp-test"
        # from the request's baggage, on every span (RequestAttributesProcessor)
        assert span.attributes["user.id"] == "user-7"
        assert span.attributes["session.id"] == "conv-1"
    assert {s.name: s.attributes["langfuse.observation.type"] for s in received} == {
        "agent.answer": "agent",
        "agent.hop.1": "chain",
        "gen_ai.chat m-1": "generation",
        "tool.get_building": "tool",
    }
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["langfuse.trace.name"] == "agent.answer"
    assert generation.attributes == {
        **generation.attributes,
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openrouter",
        "gen_ai.request.model": "m-1",
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.usage.cost": 0.0015,
        "gen_ai.response.finish_reasons": ["tool_calls"],
    }
    assert json.loads(generation.attributes["langfuse.observation.cost_details"]) == {
        "total": 0.0015
    }
    assert (tool.attributes["gen_ai.tool.name"], tool.attributes["gen_ai.tool.call.id"]) == (
        "get_building",
        "call_1",
    )

    # the failed tool: error status, Langfuse level, and the exception event (kind only)
    assert (tool.status_code, tool.status_message) == (ERROR, "tool_error")
    assert tool.attributes["langfuse.observation.level"] == "ERROR"
    assert tool.attributes["tool.error.kind"] == "tool_error"
    assert [(name, event["exception.type"]) for name, event in tool.events] == [
        ("exception", "ToolError")
    ]
    assert [s.name for s in received if s.status_code == ERROR] == ["tool.get_building"]

    # payloads off: no question, argument or error text in anything that arrived
    assert "zebra" not in repr(received)


def test_payloads_on_send_the_content(
    provider: TracerProvider, otlp_collector: tuple[str, OtlpCollector]
) -> None:
    _emit_agent_tree(provider, payloads=True)
    assert provider.force_flush(10_000)
    spans = _by_name(otlp_collector[1].snapshot())
    assert spans["agent.answer"].attributes["langfuse.observation.input"] == QUESTION
    tool = spans["tool.get_building"]
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"building_id": "bld-zebra"}
    assert tool.status_message == "no building bld-zebra"
    assert tool.events[0][1]["exception.message"] == "no building bld-zebra"


def test_the_headers_reach_the_collector(
    provider: TracerProvider, otlp_collector: tuple[str, OtlpCollector]
) -> None:
    _emit_agent_tree(provider, payloads=False)
    assert provider.force_flush(10_000)
    collector = otlp_collector[1]
    assert collector.requests and collector.snapshot()
    for headers in collector.requests:
        assert headers["content-type"] == "application/x-protobuf"
        # OTEL_EXPORTER_OTLP_HEADERS, percent-decoded
        assert headers["authorization"] == f"Basic {SECRET}"
        assert headers["x-langfuse-ingestion-version"] == "4"


@pytest.mark.parametrize("suffix", ["", "/", "/v1/traces", "/v1/traces/"])
def test_the_signal_path_is_appended_to_the_base_url_once(
    otlp_collector: tuple[str, OtlpCollector], suffix: str
) -> None:
    """The collector answers only at ``/api/public/otel/v1/traces``: a missing or doubled
    ``/v1/traces`` would be a 404 and a failed export."""
    url, collector = otlp_collector
    exporter = build_exporter(_settings(url + suffix))
    assert isinstance(exporter, OTLPSpanExporter)
    source = TracerProvider()
    span = source.get_tracer("t").start_span("one")
    span.end()
    try:
        assert exporter.export([span]) is SpanExportResult.SUCCESS  # type: ignore[list-item]
    finally:
        exporter.shutdown()
    assert [s.name for s in collector.snapshot()] == ["one"]


def test_the_header_secret_is_never_printed_or_logged(
    otlp_collector: tuple[str, OtlpCollector], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # configure_logging (run by earlier tests in the same process) quiets urllib3 to WARNING
    caplog.set_level(logging.DEBUG, logger="urllib3")
    url, collector = otlp_collector
    settings = _settings(url)
    for shown in (repr(settings), str(settings), settings.model_dump_json()):
        assert SECRET not in shown
    provider = build_provider(settings, "otlp-test", exporter=build_exporter(settings))
    try:
        _emit_agent_tree(provider, payloads=True)  # even with payloads on
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()
    assert collector.requests[0]["authorization"] == f"Basic {SECRET}"
    assert caplog.records  # the exporter's HTTP client did log at DEBUG
    assert SECRET not in caplog.text
    assert SECRET not in repr(collector.snapshot())
