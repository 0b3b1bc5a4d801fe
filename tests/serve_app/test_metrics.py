"""What a finished /ask adds to the metrics (``answer_measurements``), summed by
``InMemoryMetrics``; and the Ray backend (``deployments.metrics.RayServeMetrics``), which
records without a running Ray or Serve (no replica context: no deployment/replica tags)."""

from __future__ import annotations

import pytest

from agent.answer import (
    AgentAnswer,
    CostOut,
    HopUsageOut,
    RetrievalOut,
    ToolCallTrace,
    UsageOut,
)
from serve_app.metrics import (
    ALL_METRICS,
    COST,
    HALLUCINATED,
    HOPS,
    REQUESTS,
    RETRIEVAL_LATENCY,
    TOKENS,
    TOOL_CALLS,
    InMemoryMetrics,
    Measurement,
    answer_measurements,
    feedback_measurement,
    limit_measurement,
    retrieval_measurement,
)


def _call(name: str, ok: bool) -> ToolCallTrace:
    return ToolCallTrace(
        name=name, arguments={}, ok=ok, error=None if ok else "failed", duration_ms=1.0
    )


def _answer(
    *,
    decision: str = "answered",
    model: str = "openai/gpt-4o-mini",
    hops: tuple[tuple[int, int], ...] = ((100, 20), (150, 30), (200, 40)),
    calls: tuple[ToolCallTrace, ...] = (),
    cost: CostOut | None = None,
    hallucinated: tuple[str, ...] = (),
) -> AgentAnswer:
    return AgentAnswer.model_validate(
        {
            "answer": "text",
            "decision": decision,
            "answered_by": "model",
            "model": model,
            "tool_calls": list(calls),
            "usage": UsageOut(
                input_tokens=sum(i for i, _ in hops),
                output_tokens=sum(o for _, o in hops),
                hops=[
                    HopUsageOut(hop=n, input_tokens=i, output_tokens=o)
                    for n, (i, o) in enumerate(hops, 1)
                ],
            ),
            "cost": cost or CostOut(),
            "retrieval": RetrievalOut(hallucinated_citations=list(hallucinated)),
        }
    )


def _as_dict(
    measurements: list[Measurement],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for m in measurements:
        key = (m.spec.name, m.tags)
        assert key not in out or m.spec.kind == "counter", key
        out[key] = out.get(key, 0.0) + m.value
    return out


def test_a_full_answer() -> None:
    answer = _answer(
        calls=(
            _call("search_docs", True),
            _call("get_building", False),
            _call("search_docs", True),
        ),
        cost=CostOut(estimated_usd=0.002, provider_usd=0.0031),
        hallucinated=("c9", "c10"),
    )
    assert _as_dict(answer_measurements(answer)) == {
        ("agent_requests", (("decision", "answered"),)): 1,
        ("agent_hops", ()): 3,
        ("agent_tool_calls", (("tool", "search_docs"), ("outcome", "ok"))): 2,
        ("agent_tool_calls", (("tool", "get_building"), ("outcome", "error"))): 1,
        ("agent_tokens", (("model", "openai/gpt-4o-mini"), ("direction", "in"))): 450,
        ("agent_tokens", (("model", "openai/gpt-4o-mini"), ("direction", "out"))): 90,
        # the provider's reported cost wins over our estimate
        ("agent_cost_usd", (("model", "openai/gpt-4o-mini"),)): 0.0031,
        ("agent_hallucinated_citations", ()): 2,
    }


def test_a_tool_name_the_model_made_up_is_counted_as_unknown() -> None:
    answer = _answer(
        calls=(
            _call("no_such_tool", False),
            _call("drop_tables", False),
            _call("list_sensors", True),
        )
    )
    tool_tags = sorted(m.tags for m in answer_measurements(answer) if m.spec is TOOL_CALLS)
    assert tool_tags == [
        (("tool", "list_sensors"), ("outcome", "ok")),
        (("tool", "unknown"), ("outcome", "error")),
        (("tool", "unknown"), ("outcome", "error")),
    ]


def test_the_estimate_stands_in_when_the_provider_reports_no_cost() -> None:
    measurements = answer_measurements(_answer(cost=CostOut(estimated_usd=0.002)))
    assert [m.value for m in measurements if m.spec is COST] == [0.002]


@pytest.mark.parametrize(
    "cost",
    [CostOut(), CostOut(estimated_usd=0.0), CostOut(estimated_usd=0.5, provider_usd=0.0)],
    ids=["unknown", "free-model", "provider-says-free"],
)
def test_no_cost_point_for_an_unknown_or_zero_cost(cost: CostOut) -> None:
    assert not [m for m in answer_measurements(_answer(cost=cost)) if m.spec is COST]


def test_a_provider_error_before_any_reply() -> None:
    answer = _answer(decision="provider_error", model="", hops=())
    assert _as_dict(answer_measurements(answer)) == {
        ("agent_requests", (("decision", "provider_error"),)): 1,
        ("agent_hops", ()): 0,  # observed: the histogram shows runs that never got a reply
    }


def test_every_measurement_carries_exactly_its_metrics_tags() -> None:
    """``ray.util.metrics`` refuses a point without one of the declared tag keys."""
    answer = _answer(
        calls=(_call("search_docs", False),),
        cost=CostOut(estimated_usd=0.01),
        hallucinated=("x",),
    )
    measurements = [
        *answer_measurements(answer),
        retrieval_measurement(12.5),
        limit_measurement("rate_limited"),
        feedback_measurement("down"),
    ]
    assert {m.spec for m in measurements} == set(ALL_METRICS)
    for m in measurements:
        assert tuple(key for key, _ in m.tags) == m.spec.tag_keys, m
        assert all(isinstance(value, str) and value for _, value in m.tags), m


def test_specs_are_unique_and_histograms_have_sorted_boundaries() -> None:
    assert len({spec.name for spec in ALL_METRICS}) == len(ALL_METRICS)
    for spec in ALL_METRICS:
        assert spec.name.startswith("agent_") and spec.description
        if spec.kind == "histogram":
            assert list(spec.boundaries) == sorted(set(spec.boundaries)) and spec.boundaries
        else:
            assert spec.boundaries == ()
    assert {s.name for s in ALL_METRICS if s.kind == "histogram"} == {
        HOPS.name,
        RETRIEVAL_LATENCY.name,
    }


def test_in_memory_metrics_sum_counters_and_keep_observations() -> None:
    sink = InMemoryMetrics()
    sink.record(
        answer_measurements(
            _answer(calls=(_call("search_docs", True),), cost=CostOut(provider_usd=0.25))
        )
    )
    sink.record(
        answer_measurements(
            _answer(
                decision="idk",
                hops=((10, 5),),
                calls=(_call("search_docs", True), _call("search_docs", False)),
                cost=CostOut(provider_usd=0.5),
                hallucinated=("c1",),
            )
        )
    )
    sink.record([retrieval_measurement(3.5), retrieval_measurement(40.0)])

    model = "openai/gpt-4o-mini"
    assert dict(sink.counters) == {
        (REQUESTS.name, (("decision", "answered"),)): 1,
        (REQUESTS.name, (("decision", "idk"),)): 1,
        (TOOL_CALLS.name, (("tool", "search_docs"), ("outcome", "ok"))): 2,
        (TOOL_CALLS.name, (("tool", "search_docs"), ("outcome", "error"))): 1,
        (TOKENS.name, (("model", model), ("direction", "in"))): 450 + 10,
        (TOKENS.name, (("model", model), ("direction", "out"))): 90 + 5,
        (COST.name, (("model", model),)): 0.75,
        (HALLUCINATED.name, ()): 1,
    }
    assert dict(sink.observations) == {
        HOPS.name: [3.0, 1.0],
        RETRIEVAL_LATENCY.name: [3.5, 40.0],
    }


def test_ray_serve_metrics_record_outside_a_replica() -> None:
    """Constructing and recording needs no Ray cluster (outside a replica Serve adds no
    deployment/replica tags); the replica constructors build one the same way."""
    import ray

    from deployments.metrics import RayServeMetrics

    was_initialized = ray.is_initialized()
    sink = RayServeMetrics()
    sink.record(
        answer_measurements(
            _answer(
                calls=(_call("search_docs", True), _call("get_building", False)),
                cost=CostOut(estimated_usd=0.01),
                hallucinated=("c3",),
            )
        )
    )
    sink.record([retrieval_measurement(8.0)])
    assert ray.is_initialized() is was_initialized  # recording did not start Ray
    with pytest.raises(ValueError, match="decision"):  # a point without its tags is refused
        sink.record([Measurement(REQUESTS, 1)])
