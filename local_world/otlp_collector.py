"""A minimal OTLP/HTTP trace collector: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` (what the OpenTelemetry OTLP/HTTP exporter and Langfuse's
endpoint speak), decoded with ``opentelemetry-proto`` into flat ``CollectedSpan`` records.

Stands in for Langfuse or an OpenTelemetry Collector in tests and benchmarks::

    collector = OtlpCollector()
    with run_in_thread(create_otlp_app(collector)) as url:
        ...  # OTEL_EXPORTER_OTLP_ENDPOINT=url
        collector.wait_for(lambda spans: any(s.name == "agent.answer" for s in spans))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from local_world._service import FASTAPI_TELEMETRY_OFF

PROTOBUF = "application/x-protobuf"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class CollectedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    start_ns: int
    end_ns: int


@dataclass
class OtlpCollector:
    spans: list[CollectedSpan] = field(default_factory=list)
    requests: list[dict[str, str]] = field(default_factory=list)  # headers of each export
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ingest(self, body: bytes, headers: dict[str, str]) -> int:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found: list[CollectedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        CollectedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            resource=resource,
                            status_code=int(span.status.code),
                            status_message=span.status.message,
                            events=[
                                (e.name, {kv.key: _value(kv.value) for kv in e.attributes})
                                for e in span.events
                            ],
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.spans.extend(found)
            self.requests.append(headers)
        return len(found)

    def snapshot(self) -> list[CollectedSpan]:
        with self._lock:
            return list(self.spans)

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()
            self.requests.clear()

    def wait_for(
        self, done: Callable[[list[CollectedSpan]], bool], timeout: float = 30.0
    ) -> list[CollectedSpan]:
        """The spans once ``done(spans)`` holds; raises TimeoutError with what arrived."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise TimeoutError(f"{len(spans)} spans arrived ({names}); condition not met")
            time.sleep(0.05)


def span_tree(spans: Sequence[CollectedSpan]) -> tuple[Any, ...]:
    """``(name, children)`` from the single root, children sorted by name (siblings such as
    concurrent tool calls have no stable order). A parent outside ``spans`` counts as none."""
    ids = {s.span_id for s in spans}
    by_parent: dict[str, list[CollectedSpan]] = {}
    for span in spans:
        parent = span.parent_span_id if span.parent_span_id in ids else ""
        by_parent.setdefault(parent, []).append(span)

    def node(span: CollectedSpan) -> tuple[Any, ...]:
        children = sorted(by_parent.get(span.span_id, []), key=lambda s: s.name)
        return (span.name, tuple(node(c) for c in children))

    roots = by_parent.get("", [])
    assert len(roots) == 1, [s.name for s in roots]
    return node(roots[0])


def create_otlp_app(collector: OtlpCollector) -> FastAPI:
    app = FastAPI(
        title="local OTLP collector",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        telemetry=FASTAPI_TELEMETRY_OFF,
    )

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != PROTOBUF:
            return Response(status_code=415, content=b"expected application/x-protobuf")
        collector.ingest(await request.body(), dict(request.headers))
        return Response(
            content=ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF
        )

    return app
