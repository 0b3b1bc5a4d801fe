"""The window arithmetic and the decision of ``usage_limits.core``, and the in-memory store
that stands in for PostgreSQL in the route tests (the PostgreSQL adapter is tested through
HTTP on the real database: ``tests/serve_app/api/test_limits_http.py``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from usage_limits.core import (
    Counts,
    LimitPolicy,
    SubjectLimits,
    decide,
    seconds_left,
    window_end,
    window_start,
)
from usage_limits.memory import InMemoryUsageStore

NOW = datetime(2026, 12, 31, 23, 59, 20, 500_000, tzinfo=UTC)  # a Thursday


def test_windows_are_fixed_utc_windows() -> None:
    assert window_start(NOW, "minute") == datetime(2026, 12, 31, 23, 59, tzinfo=UTC)
    assert window_start(NOW, "hour") == datetime(2026, 12, 31, 23, tzinfo=UTC)
    assert window_start(NOW, "day") == datetime(2026, 12, 31, tzinfo=UTC)
    assert window_start(NOW, "week") == datetime(2026, 12, 28, tzinfo=UTC)  # Monday
    assert window_start(NOW, "month") == datetime(2026, 12, 1, tzinfo=UTC)
    assert window_end(window_start(NOW, "month"), "month") == datetime(2027, 1, 1, tzinfo=UTC)
    assert window_end(datetime(2027, 2, 1, tzinfo=UTC), "month") == datetime(2027, 3, 1, tzinfo=UTC)
    # another zone is the same instant
    plus_two = NOW.astimezone(ZoneInfo("Europe/Helsinki"))
    assert window_start(plus_two, "day") == datetime(2026, 12, 31, tzinfo=UTC)
    # 39.5 s left in the minute: 40 (rounded up); at the boundary a whole window
    assert seconds_left(NOW, "minute") == 40
    assert seconds_left(window_start(NOW, "minute"), "minute") == 60
    assert seconds_left(NOW - timedelta(microseconds=1) + timedelta(seconds=39.5), "minute") == 1
    with pytest.raises(ValueError, match="naive"):
        window_start(datetime(2026, 1, 1), "day")


def test_a_request_limit_lets_the_limit_through_and_refuses_the_next() -> None:
    user = SubjectLimits("user", "nina", requests_per_minute=3)
    allowed = decide([user], {user.key: Counts(requests=3)}, NOW, "day")
    left = allowed.left("requests")
    assert allowed.allowed and left is not None and left.remaining == 0
    refused = decide([user], {user.key: Counts(requests=4)}, NOW, "day")
    assert not refused.allowed
    (what,) = refused.exceeded
    assert (what.scope, what.name, what.metric, what.limit, what.used) == (
        "user",
        "nina",
        "requests",
        3,
        4,
    )
    assert refused.retry_after_s == 40 and what.window == "minute"


def test_a_budget_refuses_once_spent_and_retry_after_waits_for_every_window() -> None:
    user = SubjectLimits("user", "nina", requests_per_minute=5, tokens=1000)
    domain = SubjectLimits("domain", "acme", cost_usd=0.5)
    counts = {
        user.key: Counts(requests=6, tokens=1000),
        domain.key: Counts(requests=0, cost_usd=0.25),
    }
    decision = decide([user, domain], counts, NOW, "day")
    assert not decision.allowed
    assert {(e.metric, e.window) for e in decision.exceeded} == {
        ("requests", "minute"),
        ("tokens", "day"),
    }
    assert decision.retry_after_s == seconds_left(NOW, "day") == 40  # the day ends too
    cost = decision.left("cost_usd")
    assert cost is not None and cost.remaining == pytest.approx(0.25)
    # under the budget by one token: admitted, one token left
    counts[user.key] = Counts(requests=1, tokens=999)
    ok = decide([user, domain], counts, NOW, "day")
    tokens = ok.left("tokens")
    assert ok.allowed and tokens is not None and tokens.remaining == 1


def test_the_remaining_allowance_is_the_tightest_of_the_subjects() -> None:
    user = SubjectLimits("user", "nina", requests_per_minute=10)
    domain = SubjectLimits("domain", "acme", requests_per_minute=100)
    counts = {user.key: Counts(requests=2), domain.key: Counts(requests=95)}
    left = decide([user, domain], counts, NOW, "day").left("requests")
    assert left is not None and (left.limit, left.remaining) == (100, 5)


def test_tiers_and_policy() -> None:
    policy = LimitPolicy(
        user_requests_per_minute=10, domain_tokens=5000, user_cost_usd=1.0, elevated_factor=2.5
    )
    standard = policy.subjects("nina", ("northwind", "acme"), "standard")
    assert [s.key for s in standard] == ["domain:acme", "domain:northwind", "user:nina"]
    assert standard[-1] == SubjectLimits("user", "nina", 10, None, 1.0)
    assert standard[0] == SubjectLimits("domain", "acme", None, 5000, None)
    elevated = policy.subjects("nora", ("northwind",), "elevated")
    assert elevated[-1] == SubjectLimits("user", "nora", 25, None, 2.5)
    assert elevated[0].tokens == 5000  # a domain's limit is the domain's
    assert policy.subjects("root", ("acme",), "exempt") == []
    assert not LimitPolicy().enabled and LimitPolicy().subjects("a", ("b",), "standard") == []
    with pytest.raises(ValueError, match="elevated_factor"):
        LimitPolicy(elevated_factor=0.5)
    with pytest.raises(ValueError, match="user_cost_usd"):
        LimitPolicy(user_cost_usd=float("nan"))


async def test_the_fake_store_counts_a_refused_request_nowhere() -> None:
    """A caller over its own limit does not spend its domain's allowance; concurrent
    requests get exactly the limit through."""
    store = InMemoryUsageStore()
    nina = LimitPolicy(user_requests_per_minute=2, domain_requests_per_minute=3)
    subjects = nina.subjects("nina", ("acme",), "standard")
    results = await asyncio.gather(*(store.admit(subjects, NOW, "day") for _ in range(5)))
    assert [d.allowed for d in results].count(True) == 2
    assert (await store.counts("domain:acme", NOW, "day")).requests == 2
    carl = nina.subjects("carl", ("acme",), "standard")
    assert (await store.admit(carl, NOW, "day")).allowed  # the domain's third
    assert not (await store.admit(carl, NOW, "day")).allowed  # the domain's limit
    assert (await store.admit(subjects, NOW + timedelta(minutes=1), "day")).allowed
    await store.record(["user:nina", "domain:acme"], 120, 0.01, NOW, "day")
    assert await store.counts("user:nina", NOW, "day") == Counts(2, 120, 0.01)
