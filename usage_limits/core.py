"""The window arithmetic and the decision of the rate limits and budgets, without I/O.

Two kinds of fixed window, aligned in UTC: requests are counted per minute (``:00`` to
``:59``), tokens and estimated cost per budget period (an hour, a UTC day, an ISO week from
Monday, a calendar month). A *subject* is what a counter belongs to: a user (``user:<sub>``)
or a domain (``domain:<name>``, the name already folded by ``foundation.acl``); a request
counts against its caller and each of the caller's domains.

The decision (``decide``), given the counts of every subject *including this request* in the
minute window and the tokens and cost already recorded in the period:

* a request is refused when a subject's requests this minute exceed its requests-per-minute
  limit (the request itself included: limit 10 lets the 10th through and refuses the 11th),
  or when a subject's tokens or cost in the period have reached their budget (a budget is
  checked before the model is called; what a run spends is only known after it, so runs
  admitted while the budget was still open can take it past its limit);
* ``Retry-After`` is the time until the latest of the exceeded windows ends (waiting less
  would be refused again);
* the remaining allowance is the tightest over the subjects, per metric.

Tiers (``Tier``) come from the caller's role through Cedar (``serve_app.authz``): ``exempt``
callers are neither checked nor counted; ``elevated`` callers get ``elevated_factor`` times
the per-user limits (domain limits are the domain's, the same for every member).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

Scope = Literal["user", "domain"]
Metric = Literal["requests", "tokens", "cost_usd"]
Period = Literal["hour", "day", "week", "month"]
WindowKind = Literal["minute", "hour", "day", "week", "month"]
Tier = Literal["exempt", "elevated", "standard"]

PERIODS: tuple[Period, ...] = ("hour", "day", "week", "month")
METRICS: tuple[Metric, ...] = ("requests", "tokens", "cost_usd")


# --- windows ---------------------------------------------------------------------------------


def _utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise ValueError("a naive datetime has no place in a window: give it a time zone")
    return now.astimezone(UTC)


def window_start(now: datetime, kind: WindowKind) -> datetime:
    """The start of the fixed UTC window of ``kind`` that holds ``now``."""
    now = _utc(now)
    if kind == "minute":
        return now.replace(second=0, microsecond=0)
    if kind == "hour":
        return now.replace(minute=0, second=0, microsecond=0)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "day":
        return day
    if kind == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def window_end(start: datetime, kind: WindowKind) -> datetime:
    """The end (exclusive) of the window of ``kind`` that starts at ``start``."""
    if kind == "minute":
        return start + timedelta(minutes=1)
    if kind == "hour":
        return start + timedelta(hours=1)
    if kind == "day":
        return start + timedelta(days=1)
    if kind == "week":
        return start + timedelta(weeks=1)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


def seconds_left(now: datetime, kind: WindowKind) -> int:
    """Whole seconds until the window holding ``now`` ends (at least 1: a ``Retry-After``
    of 0 would invite an immediate retry into the same window)."""
    end = window_end(window_start(now, kind), kind)
    return max(1, math.ceil((end - _utc(now)).total_seconds()))


# --- what is limited -------------------------------------------------------------------------


@dataclass(frozen=True)
class SubjectLimits:
    """One subject's limits; None = not limited on that metric."""

    scope: Scope
    name: str
    requests_per_minute: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None

    @property
    def key(self) -> str:
        return f"{self.scope}:{self.name}"

    @property
    def counts_requests(self) -> bool:
        return self.requests_per_minute is not None

    @property
    def has_budget(self) -> bool:
        return self.tokens is not None or self.cost_usd is not None


@dataclass(frozen=True)
class LimitPolicy:
    """The configured limits (``RATE_LIMIT_*``, ``BUDGET_*``); 0 or None = off."""

    user_requests_per_minute: int = 0
    domain_requests_per_minute: int = 0
    user_tokens: int = 0
    domain_tokens: int = 0
    user_cost_usd: float = 0.0
    domain_cost_usd: float = 0.0
    period: Period = "day"
    elevated_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.period not in PERIODS:
            raise ValueError(f"period must be one of {PERIODS}, got {self.period!r}")
        for name in (
            "user_requests_per_minute",
            "domain_requests_per_minute",
            "user_tokens",
            "domain_tokens",
            "user_cost_usd",
            "domain_cost_usd",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not math.isfinite(self.elevated_factor) or self.elevated_factor < 1:
            raise ValueError(f"elevated_factor must be >= 1, got {self.elevated_factor!r}")

    @property
    def enabled(self) -> bool:
        return any(
            (
                self.user_requests_per_minute,
                self.domain_requests_per_minute,
                self.user_tokens,
                self.domain_tokens,
                self.user_cost_usd,
                self.domain_cost_usd,
            )
        )

    def subjects(self, sub: str, domains: Sequence[str], tier: Tier) -> list[SubjectLimits]:
        """The limited subjects of one request by ``sub`` (a member of ``domains``), sorted
        by key (the order the store locks their rows in). Exempt: none."""
        if tier == "exempt" or not self.enabled:
            return []
        factor = self.elevated_factor if tier == "elevated" else 1.0
        out: list[SubjectLimits] = []
        user = SubjectLimits(
            "user",
            sub,
            requests_per_minute=_scaled_int(self.user_requests_per_minute, factor),
            tokens=_scaled_int(self.user_tokens, factor),
            cost_usd=self.user_cost_usd * factor if self.user_cost_usd else None,
        )
        if user.counts_requests or user.has_budget:
            out.append(user)
        for domain in dict.fromkeys(domains):
            subject = SubjectLimits(
                "domain",
                domain,
                requests_per_minute=self.domain_requests_per_minute or None,
                tokens=self.domain_tokens or None,
                cost_usd=self.domain_cost_usd or None,
            )
            if subject.counts_requests or subject.has_budget:
                out.append(subject)
        return sorted(out, key=lambda s: s.key)


def _scaled_int(limit: int, factor: float) -> int | None:
    return math.floor(limit * factor) if limit else None


# --- counts and the decision ------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """A subject's counts: requests in the current minute, tokens and cost in the period."""

    requests: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class Exceeded:
    """One limit a request went over."""

    scope: Scope
    name: str
    metric: Metric
    limit: float
    used: float
    retry_after_s: int
    window: WindowKind

    def as_dict(self) -> dict[str, object]:
        return {
            "scope": self.scope,
            "subject": self.name,
            "limit": self.metric,
            "allowed": self.limit,
            "used": self.used,
            "window": self.window,
            "retry_after_s": self.retry_after_s,
        }


@dataclass(frozen=True)
class Remaining:
    """What is left of one metric, the tightest over the request's subjects."""

    metric: Metric
    limit: float
    remaining: float
    reset_s: int  # seconds until its window ends


@dataclass(frozen=True)
class Decision:
    allowed: bool
    exceeded: tuple[Exceeded, ...] = ()
    remaining: tuple[Remaining, ...] = ()

    @property
    def retry_after_s(self) -> int | None:
        """Seconds until every exceeded window has ended (None when allowed)."""
        return max((e.retry_after_s for e in self.exceeded), default=None)

    def left(self, metric: Metric) -> Remaining | None:
        return next((r for r in self.remaining if r.metric == metric), None)


ALLOW_ALL = Decision(allowed=True)


def decide(
    subjects: Sequence[SubjectLimits],
    counts: Mapping[str, Counts],
    now: datetime,
    period: Period,
) -> Decision:
    """The decision for one request (see the module docstring). ``counts`` by subject key;
    a subject missing from it has counted nothing yet (its requests: this one)."""
    exceeded: list[Exceeded] = []
    tightest: dict[Metric, Remaining] = {}
    minute_left = seconds_left(now, "minute")
    period_left = seconds_left(now, period)

    def note(metric: Metric, limit: float, used: float, reset_s: int) -> None:
        remaining = max(0.0, limit - used)
        if metric != "cost_usd":
            remaining = float(math.floor(remaining))
        current = tightest.get(metric)
        if current is None or remaining < current.remaining:
            tightest[metric] = Remaining(metric, limit, remaining, reset_s)

    for subject in subjects:
        count = counts.get(subject.key, Counts(requests=1))
        checks: list[tuple[Metric, float | None, float, bool, WindowKind, int]] = [
            (
                "requests",
                subject.requests_per_minute,
                count.requests,
                count.requests > (subject.requests_per_minute or 0),
                "minute",
                minute_left,
            ),
            (
                "tokens",
                subject.tokens,
                count.tokens,
                count.tokens >= (subject.tokens or 0),
                period,
                period_left,
            ),
            (
                "cost_usd",
                subject.cost_usd,
                count.cost_usd,
                count.cost_usd >= (subject.cost_usd or 0.0),
                period,
                period_left,
            ),
        ]
        for metric, limit, used, over, window, reset_s in checks:
            if limit is None:
                continue
            note(metric, limit, used, reset_s)
            if over:
                exceeded.append(
                    Exceeded(subject.scope, subject.name, metric, limit, used, reset_s, window)
                )
    ordered = tuple(tightest[m] for m in METRICS if m in tightest)
    return Decision(allowed=not exceeded, exceeded=tuple(exceeded), remaining=ordered)


def spent_cost(estimated_usd: float | None, provider_usd: float | None) -> float:
    """The cost a run is charged: the provider's figure when it sent one, else the estimate
    from the price table; a model the table does not know costs 0 (it cannot be priced)."""
    value = provider_usd if provider_usd is not None else estimated_usd
    return max(0.0, value) if value is not None and math.isfinite(value) else 0.0
