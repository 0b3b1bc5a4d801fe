"""Per-process setup: OTLP settings parsing, the compact span log line used without a collector,
structured logs that carry the trace id, and that secrets never show. Providers here are built
with ``build_provider`` and never installed globally."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from foundation.observability import attributes as attr
from foundation.observability import setup
from foundation.observability.setup import (
    SPAN_LOGGER,
    CompactLogSpanExporter,
    JsonFormatter,
    TraceContextFilter,
    build_exporter,
    build_provider,
    configure_observability,
    log_handler,
    parse_otlp_headers,
    span_line,
    traces_endpoint,
)
from foundation.settings import Settings
from foundation.tracing import PresetTraceIdGenerator, carrier_from_headers, use_context

TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


def _settings(**overrides: object) -> Settings:
    return Settings(_env_file=None, **overrides)  # type: ignore[arg-type,call-arg]


# --- OTEL_EXPORTER_OTLP_HEADERS / _ENDPOINT --------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, {}),
        ("", {}),
        ("  ", {}),
        (
            "Authorization=Basic%20cGstbGY6c2stbGY=,x-langfuse-ingestion-version=4",
            {"authorization": "Basic cGstbGY6c2stbGY=", "x-langfuse-ingestion-version": "4"},
        ),
        # a literal space inside a value is kept; spaces around keys and values are not
        (
            " Authorization = Basic abc== , X-Other=1 ",
            {"authorization": "Basic abc==", "x-other": "1"},
        ),
        # base64 padding: only the first "=" separates key from value
        ("authorization=Basic YWI6Y2Q=", {"authorization": "Basic YWI6Y2Q="}),
        # a percent-encoded comma is part of the value, not a separator
        ("x-list=a%2Cb,x-two=2", {"x-list": "a,b", "x-two": "2"}),
        # items without "=" or without a key are dropped; an empty value is kept
        ("junk,=orphan,x-empty=,,x-ok=1", {"x-empty": "", "x-ok": "1"}),
    ],
)
def test_parse_otlp_headers(raw: str | None, expected: dict[str, str]) -> None:
    assert parse_otlp_headers(raw) == expected


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        (
            "http://localhost:3000/api/public/otel",
            "http://localhost:3000/api/public/otel/v1/traces",
        ),
        (
            "http://localhost:3000/api/public/otel/",
            "http://localhost:3000/api/public/otel/v1/traces",
        ),
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
        ("http://collector:4318/v1/traces/", "http://collector:4318/v1/traces"),
    ],
)
def test_traces_endpoint_appends_the_signal_path_once(base: str, expected: str) -> None:
    assert traces_endpoint(base) == expected


def test_without_an_endpoint_spans_go_to_the_log() -> None:
    assert isinstance(build_exporter(_settings()), CompactLogSpanExporter)


def test_the_provider_names_the_service_and_presets_trace_ids() -> None:
    provider = build_provider(
        _settings(otel_service_name="svc-x"), "Retriever", exporter=CompactLogSpanExporter()
    )
    try:
        assert provider.resource.attributes["service.name"] == "svc-x"
        assert provider.resource.attributes["service.component"] == "Retriever"
        assert isinstance(provider.id_generator, PresetTraceIdGenerator)
    finally:
        provider.shutdown()


# --- the compact span line -----------------------------------------------------------------------


SPAN_LOG = "tests.observability.spans"


@pytest.fixture
def span_log(caplog: pytest.LogCaptureFixture) -> Iterator[TracerProvider]:
    """A provider whose spans ``CompactLogSpanExporter`` logs (synchronously) to ``SPAN_LOG``."""
    caplog.set_level(logging.INFO, logger=SPAN_LOG)
    exporter = CompactLogSpanExporter(logging.getLogger(SPAN_LOG))
    provider = build_provider(_settings(), "tests", processor=SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SPAN_LOG]


def test_one_line_per_span_with_duration_trace_status_and_key_attributes(
    span_log: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    tracer = span_log.get_tracer("t")
    ctx = baggage.set_baggage("user.id", "u-1", otel_context.Context())
    span = tracer.start_span(
        "gen_ai.chat m-1",
        context=ctx,
        start_time=1_000_000_000,
        attributes={
            attr.LANGFUSE_TYPE: "generation",
            attr.GEN_AI_REQUEST_MODEL: "m-1",
            attr.GEN_AI_INPUT_TOKENS: 120,
            attr.GEN_AI_OUTPUT_TOKENS: 30,
            attr.GEN_AI_COST: 0.0015,
            # payload keys (set only with OBSERVE_PAYLOADS) never reach the line
            attr.GEN_AI_INPUT_MESSAGES: "the zebra question",
            attr.LANGFUSE_OUTPUT: "the zebra answer",
            attr.GEN_AI_TOOL_ARGUMENTS: '{"q": "zebra"}',
        },
    )
    span.set_status(Status(StatusCode.ERROR, "provider_error"))
    span.end(end_time=1_012_345_678)
    trace_id = format(span.get_span_context().trace_id, "032x")

    (line,) = _lines(caplog)
    assert line == (
        f"span gen_ai.chat m-1 12.3ms trace={trace_id} status=ERROR(provider_error) "
        "langfuse.observation.type=generation gen_ai.request.model=m-1 "
        "gen_ai.usage.input_tokens=120 gen_ai.usage.output_tokens=30 gen_ai.usage.cost=0.0015 "
        "user.id=u-1"
    )
    assert "zebra" not in line


def test_a_tree_logs_one_line_per_span_children_first(
    span_log: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    tracer = span_log.get_tracer("t")
    with tracer.start_as_current_span("agent.answer", attributes={attr.AGENT_DECISION: "idk"}):
        with tracer.start_as_current_span(
            "tool.search_docs", attributes={attr.GEN_AI_TOOL_NAME: "search_docs"}
        ):
            pass
        with tracer.start_as_current_span("retrieve.vector") as vector:
            vector.set_attribute(attr.GEN_AI_RETRIEVAL_COUNT, 7)
    lines = _lines(caplog)
    assert [line.split()[1] for line in lines] == [
        "tool.search_docs",
        "retrieve.vector",
        "agent.answer",
    ]
    assert len({line.split()[3] for line in lines}) == 1  # one trace=...
    assert lines[0].endswith(" gen_ai.tool.name=search_docs")
    assert lines[1].endswith(" gen_ai.retrieval.documents.count=7")
    assert lines[2].endswith(" agent.decision=idk")
    assert not any("status=" in line for line in lines)


def test_span_line_of_an_ok_span_without_attributes() -> None:
    provider = TracerProvider()
    span = provider.get_tracer("t").start_span("ingest.prune", start_time=0)
    span.end(end_time=2_500_000)
    assert span_line(span) == (  # type: ignore[arg-type]
        f"span ingest.prune 2.5ms trace={span.get_span_context().trace_id:032x}"
    )


def test_the_exporter_logs_to_the_span_logger_by_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=SPAN_LOGGER)
    provider = build_provider(
        _settings(), "tests", processor=SimpleSpanProcessor(CompactLogSpanExporter())
    )
    try:
        provider.get_tracer("t").start_span("x").end()
    finally:
        provider.shutdown()
    assert [r.name for r in caplog.records if r.getMessage().startswith("span x ")] == [SPAN_LOGGER]


# --- structured logs ---------------------------------------------------------------------------


def _logger_to(stream: io.StringIO, settings: Settings) -> logging.Logger:
    logger = logging.getLogger(f"tests.observability.logs.{settings.log_format}")
    logger.handlers[:] = [log_handler(settings, stream)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_json_lines_carry_the_trace_and_span_ids_inside_a_span() -> None:
    stream = io.StringIO()
    logger = _logger_to(stream, _settings(log_format="json"))
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("agent.answer") as span:
        logger.info('inside "quoted" é')
    logger.info("outside")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")

    inside, outside, failed = (json.loads(line) for line in stream.getvalue().splitlines())
    context = span.get_span_context()
    assert inside == {
        "ts": inside["ts"],
        "level": "INFO",
        "logger": logger.name,
        "message": 'inside "quoted" é',
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
    }
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", inside["ts"])
    assert "trace_id" not in outside and "span_id" not in outside
    assert failed["level"] == "ERROR" and "ValueError: boom" in failed["exception"]


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is five hours behind UTC (in January)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_json_timestamps_are_utc_whatever_the_local_time_zone(new_york: None) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    record.created, record.msecs = 1_767_225_600.25, 250.0  # 2026-01-01T00:00:00.250Z
    assert json.loads(JsonFormatter().format(record))["ts"] == "2026-01-01T00:00:00.250Z"


def test_a_request_has_its_trace_id_in_the_logs_before_its_first_span() -> None:
    stream = io.StringIO()
    logger = _logger_to(stream, _settings(log_format="json"))
    carrier = carrier_from_headers({})
    with use_context(carrier):
        logger.info("accepted")
    (entry,) = (json.loads(line) for line in stream.getvalue().splitlines())
    assert entry["trace_id"] == carrier["agent-root-trace-id"]
    assert "span_id" not in entry


def test_console_lines_show_the_trace_id() -> None:
    stream = io.StringIO()
    logger = _logger_to(stream, _settings(log_format="console"))
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        logger.warning("hello")
    logger.warning("no request")
    inside, outside = stream.getvalue().splitlines()
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert inside.endswith(f" WARNING {logger.name} [trace={trace_id}]: hello")
    assert outside.endswith(f" WARNING {logger.name}: no request")  # no empty trace tag


def test_the_filter_and_formatter_work_on_any_handler() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m %s", ("a",), None)
    assert TraceContextFilter().filter(record)
    assert (record.trace_id, record.span_id) == ("", "")  # type: ignore[attr-defined]
    assert json.loads(JsonFormatter().format(record))["message"] == "m a"


@contextmanager
def _bare_root_logger() -> Iterator[logging.Logger]:
    """The root logger with no handlers and ``configure_logging`` not run yet; restored on
    exit (inside the test, so pytest's own capture handlers come back before it removes them)."""
    root = logging.getLogger()
    noisy = ("httpx", "httpcore", "urllib3", "filelock", "sentence_transformers")
    levels = {name: logging.getLogger(name).level for name in noisy}
    handlers, level, configured = root.handlers[:], root.level, setup._logging_configured
    root.handlers.clear()
    setup._logging_configured = False
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        setup._logging_configured = configured
        for name, value in levels.items():
            logging.getLogger(name).setLevel(value)


def test_disabled_sdk_means_no_provider_but_structured_logs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = trace.get_tracer_provider()
    provider_before = setup._provider
    settings = _settings(otel_sdk_disabled=True, log_format="json", log_level="debug")
    with _bare_root_logger() as root:
        assert configure_observability(settings, "tests") is None
        assert trace.get_tracer_provider() is before  # nothing installed globally
        assert setup._provider is provider_before

        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        assert root.level == logging.DEBUG
        assert logging.getLogger("httpx").level == logging.WARNING
        with use_context(carrier_from_headers({})):
            logging.getLogger("tests.observability.root").info("via root")
        line = capsys.readouterr().err.strip().splitlines()[-1]
        entry = json.loads(line)
        assert entry["message"] == "via root" and TRACE_ID.match(entry["trace_id"])

        # idempotent: a second replica constructor in the same process adds nothing
        configure_observability(settings, "tests")
        assert root.handlers == [handler]


def test_a_host_owned_root_logger_only_gets_the_ids() -> None:
    stream = io.StringIO()
    owned = logging.StreamHandler(stream)
    owned.setFormatter(logging.Formatter("%(message)s trace=%(trace_id)s"))
    with _bare_root_logger() as root:
        root.addHandler(owned)
        setup.configure_logging(_settings(log_format="json"))
        assert root.handlers == [owned]  # the host's format is kept, the ids are added
        with use_context(carrier_from_headers({})):
            logging.getLogger("tests.observability.host").warning("hi")
    assert TRACE_ID.match(stream.getvalue().strip().split("trace=")[1])


# --- secrets -----------------------------------------------------------------------------------


def test_otlp_header_secrets_never_show_in_settings_or_setup_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "sk-lf-do-not-print"
    caplog.set_level(logging.DEBUG)
    settings = _settings(
        otel_exporter_otlp_endpoint="http://127.0.0.1:9/api/public/otel",
        otel_exporter_otlp_headers=f"Authorization=Basic%20{secret}",
    )
    assert settings.otel_exporter_otlp_headers is not None
    assert secret in settings.otel_exporter_otlp_headers.get_secret_value()
    for shown in (repr(settings), str(settings), settings.model_dump_json()):
        assert secret not in shown
    exporter = build_exporter(settings)
    provider = build_provider(settings, "tests", exporter=exporter)
    provider.shutdown()  # nothing was sent: no span was started
    assert secret not in caplog.text
