"""``/ask``'s rate limits and budgets at the route, over a ``FakeBackend`` and the in-memory
limit store (``usage_limits.memory``), with the real Cedar policies: the 429 envelope and
its headers, no run for a refused request, the remaining allowance on answers, the charge
after an answer, a stream cut when it crosses the budget, the store being down (fail-closed
and fail-open), metrics per outcome, and the settings. The same on the real database, over
real HTTP and two app instances: ``test_limits_http.py``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from api_helpers import (
    ADMIN,
    CUSTOMER,
    NORTHWIND_ADMIN,
    NORTHWIND_STAFF,
    FakeBackend,
    answer,
    is_envelope,
    parse_sse_text,
)

from agent.answer import CostOut, DoneEvent, TokenEvent, UsageOut
from foundation.identity import AuthUser
from foundation.settings import Settings, SettingsError, load_settings
from serve_app.api.app import create_app
from serve_app.api.errors import LimitErrorEnvelope
from serve_app.authz import CedarAuthorizer
from serve_app.limits import build_request_limits
from serve_app.metrics import InMemoryMetrics
from serve_app.wiring import limit_policy
from usage_limits.memory import InMemoryUsageStore

NOW = datetime(2026, 12, 4, 14, 0, 15, tzinfo=UTC)  # 45 s left in the minute


class Setup:
    def __init__(
        self,
        make_settings: Callable[..., Settings],
        authorizer: CedarAuthorizer,
        asgi_client: Callable[..., httpx.AsyncClient],
        backend: FakeBackend | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = make_settings(**overrides)
        self.store = InMemoryUsageStore()
        self.metrics = InMemoryMetrics()
        self.backend = backend or FakeBackend()
        self.limits = build_request_limits(
            self.settings,
            limit_policy(self.settings),
            store=self.store,
            metrics=self.metrics,
            clock=lambda: NOW,
        )
        self.backend.limits = self.limits  # the app takes them from its backend
        app = create_app(self.backend, self.settings, authorizer)
        self.http = asgi_client(app)

    def outcomes(self) -> dict[str, float]:
        return {
            dict(tags)["outcome"]: value
            for (name, tags), value in self.metrics.counters.items()
            if name == "agent_limit_decisions"
        }


@pytest.fixture
def setup(
    make_settings: Callable[..., Settings],
    authorizer: CedarAuthorizer,
    asgi_client: Callable[..., httpx.AsyncClient],
) -> Callable[..., Setup]:
    return lambda backend=None, **overrides: Setup(
        make_settings, authorizer, asgi_client, backend, **overrides
    )


async def test_over_the_rate_limit_is_a_429_envelope_before_any_run(
    setup: Callable[..., Setup],
) -> None:
    s = setup(rate_limit_user_per_minute=2)
    ok = [await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)]
    assert ok[0].status_code == 200
    assert (ok[0].headers["x-ratelimit-limit"], ok[0].headers["x-ratelimit-remaining"]) == (
        "2",
        "1",
    )
    assert ok[0].headers["x-ratelimit-reset"] == "45"
    ok.append(await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF))
    assert ok[1].headers["x-ratelimit-remaining"] == "0"
    refused = await s.http.post(
        "/ask", json={"question": "hi", "stream": True}, headers=NORTHWIND_STAFF
    )
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "45"
    assert refused.headers["x-ratelimit-remaining"] == "0"
    body = refused.json()
    assert is_envelope(body, "rate_limited")
    assert "2 requests per minute" in body["error"]["message"]
    assert body["error"]["exceeded"] == [
        {
            "scope": "user",
            "subject": "nina",
            "limit": "requests",
            "allowed": 2,
            "used": 3,
            "window": "minute",
            "retry_after_s": 45,
        }
    ]
    LimitErrorEnvelope.model_validate(body)  # the documented 429 schema
    assert len(s.backend.asks) == 2  # the refused request ran nothing
    # another user is not limited by nina's count
    other = await s.http.post("/ask", json={"question": "hi"}, headers=CUSTOMER)
    assert other.status_code == 200
    assert s.outcomes() == {"allowed": 3, "rate_limited": 1}


async def test_cedar_decides_the_tier_admins_exempt_business_admins_elevated(
    setup: Callable[..., Setup], authorizer: CedarAuthorizer
) -> None:
    assert authorizer.limit_tier(AuthUser("root", ("admin",), ("acme",))) == "exempt"
    assert authorizer.limit_tier(AuthUser("nora", ("business_admin",))) == "elevated"
    assert authorizer.limit_tier(AuthUser("nina", ("business_staff",))) == "standard"
    assert authorizer.limit_tier(AuthUser("anon", anonymous=True)) == "standard"
    s = setup(rate_limit_user_per_minute=1, limits_elevated_factor=3)
    admin = [
        (await s.http.post("/ask", json={"question": "hi"}, headers=ADMIN)).status_code
        for _ in range(5)
    ]
    assert admin == [200] * 5
    nora = [
        (await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_ADMIN)).status_code
        for _ in range(4)
    ]
    assert nora == [200, 200, 200, 429]
    assert s.outcomes() == {"exempt": 5, "allowed": 3, "rate_limited": 1}
    assert [key for key, _, _ in s.store.requests] == ["user:nora"]  # root: not counted


async def test_a_finished_answer_is_charged_and_a_spent_budget_is_a_429(
    setup: Callable[..., Setup],
) -> None:
    backend = FakeBackend(
        ask_result=answer(
            usage=UsageOut(input_tokens=700, output_tokens=100),
            cost=CostOut(estimated_usd=0.002, provider_usd=0.003),
        )
    )
    s = setup(backend, budget_user_tokens=1000, budget_domain_cost_usd=0.01)
    first = await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert first.status_code == 200
    # what was left at admission, less this answer
    assert first.headers["x-budget-tokens-remaining"] == "200"
    assert first.headers["x-budget-cost-remaining"] == "0.007000"
    assert first.headers["x-budget-reset"] == str(10 * 3600 - 15)  # the UTC day's end
    counts = await s.store.counts("user:nina", NOW, "day")
    assert counts.tokens == 800
    assert (await s.store.counts("domain:northwind", NOW, "day")).cost_usd == pytest.approx(0.003)
    second = await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert second.status_code == 200  # 800 < 1000: admitted, and takes it to 1600
    third = await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert third.status_code == 429
    assert is_envelope(third.json(), "budget_exceeded")
    assert third.headers["retry-after"] == str(10 * 3600 - 15)
    assert [e["limit"] for e in third.json()["error"]["exceeded"]] == ["tokens"]
    assert len(backend.asks) == 2


async def test_a_stream_that_crosses_the_token_budget_is_cut_and_charged(
    setup: Callable[..., Setup],
) -> None:
    words = [TokenEvent(text="word ") for _ in range(200)]
    backend = FakeBackend(stream_events=[*words, DoneEvent(response=answer())])
    s = setup(backend, budget_user_tokens=60)
    response = await s.http.post(
        "/ask", json={"question": "hi", "stream": True}, headers=NORTHWIND_STAFF
    )
    assert response.status_code == 200
    assert response.headers["x-budget-tokens-remaining"] == "60"
    events = parse_sse_text(response.text)
    names = [name for name, _ in events]
    assert names[-1] == "error" and "done" not in names
    assert is_envelope(events[-1][1], "budget_exceeded")
    assert events[-1][1]["error"]["retry_after_s"] == 10 * 3600 - 15  # the UTC day's end
    streamed = names.count("token")
    assert 0 < streamed < 60  # cut long before the 200 words
    assert backend.stream_closed  # the run was closed (cancelled)
    charged = (await s.store.counts("user:nina", NOW, "day")).tokens
    # the estimate: the question (1 + 5 per message) and 2 per "word " streamed, the one
    # that crossed included
    assert charged == events[-1][1]["error"]["used_tokens_estimate"] > 60
    assert charged == 1 + 5 + 2 * (streamed + 1)
    assert s.outcomes() == {"allowed": 1, "stream_cut": 1}
    again = await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert again.status_code == 429


async def test_a_store_that_is_down_fails_closed_by_default_and_open_when_set(
    setup: Callable[..., Setup],
) -> None:
    closed = setup(rate_limit_domain_per_minute=10)
    closed.store.fail = ConnectionRefusedError("no database")
    response = await closed.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert response.status_code == 503
    assert is_envelope(response.json(), "limits_unavailable")
    assert response.headers["retry-after"] == "5"
    assert "no database" not in response.text
    assert closed.backend.asks == []
    assert closed.outcomes() == {"unavailable_closed": 1}

    opened = setup(rate_limit_domain_per_minute=10, limits_fail_open=True)
    opened.store.fail = ConnectionRefusedError("no database")
    response = await opened.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200
    assert "x-ratelimit-remaining" not in response.headers  # nothing was counted
    assert opened.outcomes() == {"unavailable_open": 1}


async def test_off_by_default_no_headers_no_store() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    limits = build_request_limits(settings, limit_policy(settings))
    assert not limits.enabled and limits.store is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RATE_LIMIT_USER_PER_MINUTE", "-1"),
        ("RATE_LIMIT_DOMAIN_PER_MINUTE", "many"),
        ("BUDGET_PERIOD", "year"),
        ("BUDGET_USER_TOKENS", "1.5"),
        ("BUDGET_DOMAIN_COST_USD", "nan"),
        ("LIMITS_ELEVATED_FACTOR", "0.5"),
        ("LIMITS_FAIL_OPEN", "perhaps"),
    ],
)
def test_a_bad_limit_setting_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load_settings(_env_file=None)


async def test_large_limits_are_plain_numbers_in_the_headers(setup: Callable[..., Setup]) -> None:
    s = setup(
        rate_limit_domain_per_minute=1_000_000,
        budget_user_tokens=10**9,
        budget_user_cost_usd=1_000_000,
    )
    response = await s.http.post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200
    headers = response.headers
    assert (headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]) == (
        "1000000",
        "999999",
    )
    assert headers["x-budget-tokens-limit"] == "1000000000"
    assert headers["x-budget-cost-limit"] == "1000000"
