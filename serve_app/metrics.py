"""What the service counts, as plain data: the Serve deployments hand these measurements to
``ray.serve.metrics`` (``deployments/metrics.py``), tests to ``InMemoryMetrics``.

Everything a finished ``/ask`` contributes is derived from its ``AgentAnswer``, so the agent
core records nothing itself and the counts are the same whichever backend served it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Literal, Protocol

from agent.answer import AgentAnswer

MetricKind = Literal["counter", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: MetricKind
    description: str
    tag_keys: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()


REQUESTS = MetricSpec("agent_requests", "counter", "Finished /ask runs by decision.", ("decision",))
TOOL_CALLS = MetricSpec(
    "agent_tool_calls", "counter", "Tool calls by tool and outcome (ok/error).", ("tool", "outcome")
)
TOKENS = MetricSpec(
    "agent_tokens",
    "counter",
    "Model tokens by model and direction (in/out).",
    ("model", "direction"),
)
COST = MetricSpec("agent_cost_usd", "counter", "Estimated model cost in USD by model.", ("model",))
HOPS = MetricSpec(
    "agent_hops", "histogram", "Model calls per /ask run.", (), (1, 2, 3, 4, 5, 6, 8, 10, 20)
)
RETRIEVAL_LATENCY = MetricSpec(
    "agent_retrieval_latency_ms",
    "histogram",
    "Hybrid search latency (embed + SQL + fuse + rerank) in milliseconds.",
    (),
    (2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
HALLUCINATED = MetricSpec(
    "agent_hallucinated_citations",
    "counter",
    "Citation markers the model invented (stripped from answers).",
)
LIMIT_DECISIONS = MetricSpec(
    "agent_limit_decisions",
    "counter",
    "Usage-limit decisions of /ask by outcome: allowed, exempt, rate_limited, budget_exceeded, "
    "stream_cut, unavailable_open, unavailable_closed (serve_app.limits).",
    ("outcome",),
)
FEEDBACK = MetricSpec(
    "agent_feedback",
    "counter",
    "Ratings of turns by POST /feedback, by rating (up/down); a re-rating counts again.",
    ("rating",),
)
ALL_METRICS = (
    REQUESTS,
    TOOL_CALLS,
    TOKENS,
    COST,
    HOPS,
    RETRIEVAL_LATENCY,
    HALLUCINATED,
    LIMIT_DECISIONS,
    FEEDBACK,
)


@dataclass(frozen=True)
class Measurement:
    spec: MetricSpec
    value: float
    tags: tuple[tuple[str, str], ...] = ()


@cache
def _known_tools() -> frozenset[str]:
    from agent.tools import build_default_registry

    return frozenset(build_default_registry().names)


def _tool_tag(name: str) -> str:
    """The tool's name, or ``unknown`` for a name the model made up: model text is neither a
    metric label (one new time series per invention) nor a span name (``tool.unknown``)."""
    return name if name in _known_tools() else "unknown"


def answer_measurements(answer: AgentAnswer) -> list[Measurement]:
    """What one finished /ask adds to the metrics."""
    model = answer.model or "unknown"
    out = [
        Measurement(REQUESTS, 1, (("decision", answer.decision),)),
        Measurement(HOPS, float(len(answer.usage.hops))),
    ]
    for call in answer.tool_calls:
        out.append(
            Measurement(
                TOOL_CALLS,
                1,
                (("tool", _tool_tag(call.name)), ("outcome", "ok" if call.ok else "error")),
            )
        )
    if answer.usage.input_tokens:
        tags = (("model", model), ("direction", "in"))
        out.append(Measurement(TOKENS, float(answer.usage.input_tokens), tags))
    if answer.usage.output_tokens:
        tags = (("model", model), ("direction", "out"))
        out.append(Measurement(TOKENS, float(answer.usage.output_tokens), tags))
    cost = (
        answer.cost.provider_usd
        if answer.cost.provider_usd is not None
        else answer.cost.estimated_usd
    )
    if cost:
        out.append(Measurement(COST, cost, (("model", model),)))
    hallucinated = len(answer.retrieval.hallucinated_citations)
    if hallucinated:
        out.append(Measurement(HALLUCINATED, float(hallucinated)))
    return out


def retrieval_measurement(milliseconds: float) -> Measurement:
    return Measurement(RETRIEVAL_LATENCY, milliseconds)


def limit_measurement(outcome: str) -> Measurement:
    """One usage-limit decision (``serve_app.limits``)."""
    return Measurement(LIMIT_DECISIONS, 1, (("outcome", outcome),))


def feedback_measurement(rating: str) -> Measurement:
    """One rating of a turn (``POST /feedback``)."""
    return Measurement(FEEDBACK, 1, (("rating", rating),))


class MetricsSink(Protocol):
    def record(self, measurements: Iterable[Measurement]) -> None: ...


@dataclass
class InMemoryMetrics:
    """Sums counters and keeps histogram observations, keyed by (metric, tags)."""

    counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(
        default_factory=lambda: defaultdict(float)
    )
    observations: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def record(self, measurements: Iterable[Measurement]) -> None:
        for m in measurements:
            if m.spec.kind == "counter":
                self.counters[(m.spec.name, m.tags)] += m.value
            else:
                self.observations[m.spec.name].append(m.value)
