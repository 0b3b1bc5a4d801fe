"""Token usage and cost: a per-model price table, and per-hop/total aggregation.

``cost.estimated_usd`` comes from ``pricing.json`` (list prices per million tokens);
``cost.provider_usd`` is what the provider itself reported (OpenRouter's ``usage.cost``).
Both end up in the ``/ask`` response::

    "usage": {"input_tokens": 900, "output_tokens": 60,
              "hops": [{"hop": 1, "input_tokens": 400, "output_tokens": 20}, ...]},
    "cost": {"estimated_usd": 0.000171, "provider_usd": 0.00018}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TypedDict

from agent.llm.base import Usage

PRICING_FILE = Path(__file__).with_name("pricing.json")
_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|\d{4})$")
_COST_DIGITS = 10  # round away float noise (1e-10 USD)


@dataclass(frozen=True)
class ModelPrice:
    input_per_million: float
    output_per_million: float

    def cost(self, usage: Usage) -> float:
        return (
            usage.input_tokens * self.input_per_million
            + usage.output_tokens * self.output_per_million
        ) / 1_000_000


FREE = ModelPrice(0.0, 0.0)


class PriceTable:
    """Model id -> price. Lookup is forgiving about spelling a provider may answer with:
    case, a date suffix (``gpt-4o-mini-2024-07-18``), a missing vendor prefix
    (``deepseek-chat``) and OpenRouter variants (``:nitro``; ``:free`` costs 0). Models under
    ``local/`` cost 0. Anything else is unknown (None)."""

    def __init__(self, prices: Mapping[str, ModelPrice]) -> None:
        self._prices = {name.lower(): price for name, price in prices.items()}
        by_bare: dict[str, list[ModelPrice]] = {}
        for name, price in self._prices.items():
            by_bare.setdefault(name.rsplit("/", 1)[-1], []).append(price)
        # a bare name is only usable when it is unambiguous
        self._bare = {name: prices[0] for name, prices in by_bare.items() if len(prices) == 1}

    @classmethod
    def load(cls, path: Path = PRICING_FILE) -> PriceTable:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        prices: dict[str, ModelPrice] = {}
        for name, entry in data["models"].items():
            prices[name] = ModelPrice(
                float(entry["input_per_million"]), float(entry["output_per_million"])
            )
        return cls(prices)

    @property
    def models(self) -> list[str]:
        return sorted(self._prices)

    def lookup(self, model: str) -> ModelPrice | None:
        name = model.strip().lower()
        if not name:
            return None
        name, _, variant = name.partition(":")
        if variant == "free" or name.startswith("local/"):
            return FREE
        for candidate in (name, _DATE_SUFFIX.sub("", name)):
            price = self._prices.get(candidate)
            if price is None and "/" not in candidate:
                price = self._bare.get(candidate)
            if price is not None:
                return price
        return None

    def estimate(self, model: str, usage: Usage) -> float | None:
        price = self.lookup(model)
        return None if price is None else round(price.cost(usage), _COST_DIGITS)


@cache
def default_price_table() -> PriceTable:
    return PriceTable.load()


def estimate_cost(model: str, usage: Usage, *, table: PriceTable | None = None) -> float | None:
    """Estimated USD for one reply by ``model``; None when the model is not in the table."""
    return (table or default_price_table()).estimate(model, usage)


# --- aggregation -------------------------------------------------------------------------------


class HopUsageDict(TypedDict):
    hop: int
    input_tokens: int
    output_tokens: int


class UsageDict(TypedDict):
    input_tokens: int
    output_tokens: int
    hops: list[HopUsageDict]


class CostDict(TypedDict):
    estimated_usd: float | None
    provider_usd: float | None


@dataclass(frozen=True)
class HopUsage:
    """One model call of the loop (numbered from 1; by default one more than the last)."""

    hop: int
    model: str
    input_tokens: int
    output_tokens: int
    estimated_usd: float | None
    provider_usd: float | None

    def to_dict(self) -> HopUsageDict:
        return {
            "hop": self.hop,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }


@dataclass
class RunUsage:
    """Usage of a whole ``/ask`` run: ``record`` each model reply, then serialise.

    ``estimated_usd`` is None as soon as one hop's model is unknown to the price table (a
    partial sum would understate the cost); ``provider_usd`` sums the hops that reported a cost
    and is None when none did (the same rule as ``Usage.__add__``)."""

    prices: PriceTable = field(default_factory=default_price_table)
    hops: list[HopUsage] = field(default_factory=list)

    def record(self, usage: Usage, model: str, *, hop: int | None = None) -> HopUsage:
        entry = HopUsage(
            hop=hop if hop is not None else (self.hops[-1].hop + 1 if self.hops else 1),
            model=model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            estimated_usd=self.prices.estimate(model, usage),
            provider_usd=usage.provider_cost_usd,
        )
        self.hops.append(entry)
        return entry

    @property
    def input_tokens(self) -> int:
        return sum(h.input_tokens for h in self.hops)

    @property
    def output_tokens(self) -> int:
        return sum(h.output_tokens for h in self.hops)

    @property
    def total(self) -> Usage:
        total = Usage()
        for h in self.hops:
            total = total + Usage(h.input_tokens, h.output_tokens, h.provider_usd)
        return total

    @property
    def estimated_usd(self) -> float | None:
        estimates = [h.estimated_usd for h in self.hops]
        if any(e is None for e in estimates):
            return None
        return round(sum(e for e in estimates if e is not None), _COST_DIGITS)

    @property
    def provider_usd(self) -> float | None:
        reported = [h.provider_usd for h in self.hops if h.provider_usd is not None]
        return round(sum(reported), _COST_DIGITS) if reported else None

    def usage_dict(self) -> UsageDict:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "hops": [h.to_dict() for h in self.hops],
        }

    def cost_dict(self) -> CostDict:
        return {"estimated_usd": self.estimated_usd, "provider_usd": self.provider_usd}
