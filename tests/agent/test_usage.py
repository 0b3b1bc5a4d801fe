"""The price table, cost estimates and per-hop/total usage aggregation."""

from __future__ import annotations

import json

import pytest

from agent.llm.base import Usage
from agent.usage import (
    PRICING_FILE,
    ModelPrice,
    PriceTable,
    RunUsage,
    default_price_table,
    estimate_cost,
)

MILLION = Usage(input_tokens=1_000_000, output_tokens=1_000_000)


def test_pricing_file_covers_the_documented_models() -> None:
    data = json.loads(PRICING_FILE.read_text(encoding="utf-8"))
    for model in (
        "openai/gpt-4o-mini",
        "google/gemini-2.5-flash",
        "anthropic/claude-3.5-haiku",
        "deepseek/deepseek-chat",
        "local/scripted",
    ):
        assert model in data["models"], model
    for entry in data["models"].values():
        assert entry["input_per_million"] >= 0 and entry["output_per_million"] >= 0


def test_estimate_cost() -> None:
    usage = Usage(input_tokens=2_000, output_tokens=500)
    # gpt-4o-mini: $0.15 in, $0.60 out per million
    assert estimate_cost("openai/gpt-4o-mini", usage) == pytest.approx(0.0003 + 0.0003)
    assert estimate_cost("openai/gpt-4o-mini", MILLION) == pytest.approx(0.75)
    assert estimate_cost("google/gemini-2.5-flash", MILLION) == pytest.approx(2.80)
    assert estimate_cost("anthropic/claude-3.5-haiku", MILLION) == pytest.approx(4.80)
    assert estimate_cost("deepseek/deepseek-chat", Usage()) == 0.0


@pytest.mark.parametrize(
    ("model", "same_as"),
    [
        ("openai/gpt-4o-mini-2024-07-18", "openai/gpt-4o-mini"),  # dated snapshot
        ("OpenAI/GPT-4o-mini", "openai/gpt-4o-mini"),
        ("gpt-4o-mini", "openai/gpt-4o-mini"),  # no vendor prefix (direct APIs)
        ("deepseek-chat", "deepseek/deepseek-chat"),
        ("anthropic/claude-3.5-haiku-20241022", "anthropic/claude-3.5-haiku"),
        ("google/gemini-2.5-flash:nitro", "google/gemini-2.5-flash"),
    ],
)
def test_lookup_is_forgiving(model: str, same_as: str) -> None:
    table = default_price_table()
    assert table.lookup(model) == table.lookup(same_as) is not None


def test_local_and_free_models_cost_nothing_and_unknown_ones_are_none() -> None:
    assert estimate_cost("local/qwen2.5-coder-1.5b-instruct", MILLION) == 0.0
    assert estimate_cost("local/anything-else", MILLION) == 0.0
    assert estimate_cost("meta-llama/llama-3.3-70b-instruct:free", MILLION) == 0.0
    assert estimate_cost("mystery/model-9000", MILLION) is None
    assert estimate_cost("", MILLION) is None


def test_ambiguous_bare_names_are_unknown() -> None:
    table = PriceTable({"a/m": ModelPrice(1, 1), "b/m": ModelPrice(2, 2)})
    assert table.lookup("m") is None
    assert table.lookup("a/m") == ModelPrice(1, 1)
    assert estimate_cost("b/m", MILLION, table=table) == 4.0


def test_run_usage_serialises_to_the_response_shape() -> None:
    run = RunUsage()
    run.record(Usage(400, 20, 0.0001), "openai/gpt-4o-mini")
    run.record(Usage(500, 40, 0.00015), "openai/gpt-4o-mini-2024-07-18")
    assert run.usage_dict() == {
        "input_tokens": 900,
        "output_tokens": 60,
        "hops": [
            {"hop": 1, "input_tokens": 400, "output_tokens": 20},
            {"hop": 2, "input_tokens": 500, "output_tokens": 40},
        ],
    }
    cost = run.cost_dict()
    assert cost["estimated_usd"] == pytest.approx((900 * 0.15 + 60 * 0.60) / 1e6)
    assert cost["provider_usd"] == pytest.approx(0.00025)
    assert run.total == Usage(900, 60, pytest.approx(0.00025))  # type: ignore[arg-type]
    json.dumps({"usage": run.usage_dict(), "cost": run.cost_dict()})  # JSON-ready


def test_run_usage_costs_when_unknown_or_unreported() -> None:
    run = RunUsage()
    assert run.cost_dict() == {"estimated_usd": 0.0, "provider_usd": None}
    hop = run.record(Usage(10, 5), "openai/gpt-4o-mini", hop=3)
    assert hop.hop == 3 and hop.provider_usd is None and hop.estimated_usd is not None
    assert run.cost_dict()["provider_usd"] is None  # nothing reported
    run.record(Usage(10, 5, 0.002), "mystery/model")
    assert run.cost_dict() == {"estimated_usd": None, "provider_usd": 0.002}
    assert [h["hop"] for h in run.usage_dict()["hops"]] == [3, 4]
