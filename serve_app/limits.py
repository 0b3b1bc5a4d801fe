"""``POST /ask``'s usage limits: the caller's rate limits and budgets (``usage_limits``), checked
before the model is called and charged after it answered.

``RequestLimits.admit`` (the route calls it once the request is otherwise valid, right before
the run): Cedar picks the caller's tier (``CedarAuthorizer.limit_tier``: ``exempt`` callers
are neither checked nor counted); the ``UsageStore`` counts the request against the caller
and each of its domains and decides, atomically in PostgreSQL. Refused: ``LimitExceeded``
(429 ``rate_limited`` or ``budget_exceeded``, ``Retry-After``, and what was exceeded in the
envelope's ``exceeded``). Admitted: an ``Admission``, whose ``headers`` tell the remaining
allowance (``X-RateLimit-*``, ``X-Budget-*``).

After the run, ``Admission.record`` adds its tokens (input + output) and cost
(``cost.provider_usd``, else ``cost.estimated_usd``) to the budgets, provider errors
included (their tokens were spent). A stream is charged through ``Admission.metered``: its
``token`` events are counted as they pass (estimated with ``agent.turns``' estimate,
plus the question's and the history's), and a stream whose estimate crosses the token (or
cost) budget left at admission is cut: the run is cancelled and the stream ends with an
``error`` event (``budget_exceeded``). What a stream that did not finish spent (cut, or the
client went away) is charged as that estimate; a finished one is charged its real usage.

The limit store is opened on first use (``LazyUsageStore``), so a replica starts while
PostgreSQL is still coming up. When it cannot be reached within ``STORE_TIMEOUT_S``:
``LIMITS_FAIL_OPEN=false`` (the default) refuses the request with 503
``limits_unavailable``; ``true`` answers it uncounted. A failed charge after the answer is
logged and never fails the answer.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from agent.answer import AgentAnswer, AgentEvent, DoneEvent, ProgressEvent, TokenEvent
from agent.llm.base import Message, Usage
from agent.turns import MESSAGE_OVERHEAD_TOKENS, estimate_tokens
from agent.usage import estimate_cost
from foundation.database import resolve_database_url
from foundation.identity import AuthUser
from foundation.settings import Settings
from serve_app.backend_errors import BackendError
from serve_app.lazy import OpenedOnFirstUse
from serve_app.metrics import MetricsSink, limit_measurement
from usage_limits.core import (
    ALLOW_ALL,
    Counts,
    Decision,
    Exceeded,
    LimitPolicy,
    Period,
    SubjectLimits,
    Tier,
    spent_cost,
)
from usage_limits.store import PgUsageStore, UsageStore

log = logging.getLogger(__name__)

STORE_TIMEOUT_S = 5.0  # an admission that cannot reach the store in this long fails
RECORD_TIMEOUT_S = 10.0
UNAVAILABLE_RETRY_AFTER_S = 5.0

Clock = Callable[[], datetime]

LIMIT_HEADERS = (
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-budget-tokens-limit",
    "x-budget-tokens-remaining",
    "x-budget-cost-limit",
    "x-budget-cost-remaining",
    "x-budget-reset",
)


def utc_now() -> datetime:
    return datetime.now(UTC)


class TierAuthorizer(Protocol):
    def limit_tier(self, user: AuthUser) -> Tier: ...


# --- errors ----------------------------------------------------------------------------------

_WHAT = {
    "requests": "requests per minute",
    "tokens": "tokens per {period}",
    "cost_usd": "USD of estimated cost per {period}",
}


def _describe(exceeded: Exceeded, period: str) -> str:
    what = _WHAT[exceeded.metric].format(period=period)
    limit = _count(exceeded.limit) if exceeded.metric != "cost_usd" else _usd(exceeded.limit)
    return f"{exceeded.scope} {exceeded.name!r}: {limit} {what}"


def _count(value: float) -> str:
    """A whole count as digits (``1000000``, never ``1e+06``)."""
    return str(math.floor(value))


def _usd(value: float) -> str:
    """Dollars in plain decimal notation, to the millionth (``0.25``, ``1000000``)."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


class LimitExceeded(BackendError):
    """A request over its rate limit or budget -> 429 with ``Retry-After``; ``code`` is
    ``rate_limited`` when only per-minute request limits were exceeded, else
    ``budget_exceeded``."""

    status = 429

    def __init__(self, decision: Decision, period: str, headers: dict[str, str]) -> None:
        budget = any(e.metric != "requests" for e in decision.exceeded)
        retry = decision.retry_after_s or 1
        limits = "; ".join(_describe(e, period) for e in decision.exceeded)
        kind = "budget exhausted" if budget else "rate limit reached"
        super().__init__(
            f"{kind} ({limits}); retry in {retry} s",
            code="budget_exceeded" if budget else "rate_limited",
            retry_after=retry,
            details={"exceeded": [e.as_dict() for e in decision.exceeded]},
            headers=headers,
        )


class BudgetCrossed(BackendError):
    """A stream whose usage crossed the budget left at admission: the run is cancelled and
    the stream ends with this as its ``error`` event."""

    status = 429
    code = "budget_exceeded"


class LimitsUnavailable(BackendError):
    """The limit store cannot be reached and ``LIMITS_FAIL_OPEN`` is false -> 503."""

    code = "limits_unavailable"


# --- the store, opened on first use -------------------------------------------------------------


class LazyUsageStore:
    """``UsageStore`` over a ``PgUsageStore`` opened on first use (and again after a failed
    attempt)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._store = OpenedOnFirstUse(self._connect)

    async def _connect(self) -> PgUsageStore:
        settings = self._settings
        return await PgUsageStore.connect(
            await resolve_database_url(settings),
            min_size=min(1, settings.database.pool_min_size),
            max_size=settings.database.pool_max_size,
        )

    async def admit(
        self, subjects: Sequence[SubjectLimits], now: datetime, period: Period
    ) -> Decision:
        return await (await self._store.get()).admit(subjects, now, period)

    async def record(
        self, keys: Sequence[str], tokens: int, cost_usd: float, now: datetime, period: Period
    ) -> None:
        await (await self._store.get()).record(keys, tokens, cost_usd, now, period)

    async def counts(self, key: str, now: datetime, period: Period) -> Counts:
        return await (await self._store.get()).counts(key, now, period)

    async def close(self) -> None:
        await self._store.close()


# --- the limits of one request ----------------------------------------------------------------


class RequestLimits:
    """The rate limits and budgets of ``/ask`` (see the module docstring)."""

    def __init__(
        self,
        policy: LimitPolicy,
        store: UsageStore | None,
        *,
        fail_open: bool = False,
        clock: Clock = utc_now,
        metrics: MetricsSink | None = None,
        store_timeout_s: float = STORE_TIMEOUT_S,
    ) -> None:
        self.policy = policy
        self.store = store
        self.fail_open = fail_open
        self.clock = clock
        self.metrics = metrics
        self.store_timeout_s = store_timeout_s

    @classmethod
    def disabled(cls) -> RequestLimits:
        return cls(LimitPolicy(), None)

    @property
    def enabled(self) -> bool:
        return self.store is not None and self.policy.enabled

    def count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.record([limit_measurement(outcome)])

    async def admit(self, user: AuthUser, authorizer: TierAuthorizer) -> Admission:
        """Check and count one request before its run (raises ``LimitExceeded`` or
        ``LimitsUnavailable``)."""
        if not self.enabled or self.store is None:
            return Admission(self, ())
        tier = authorizer.limit_tier(user)
        subjects = self.policy.subjects(user.sub, user.domains, tier)
        if not subjects:
            self.count("exempt")
            return Admission(self, ())
        now = self.clock()
        try:
            async with asyncio.timeout(self.store_timeout_s):
                decision = await self.store.admit(subjects, now, self.policy.period)
        except Exception as exc:
            log.warning("usage limits: the store is unavailable: %s: %s", type(exc).__name__, exc)
            if self.fail_open:
                self.count("unavailable_open")
                return Admission(self, ())
            self.count("unavailable_closed")
            raise LimitsUnavailable(
                "the usage limits cannot be checked right now; try again shortly",
                retry_after=UNAVAILABLE_RETRY_AFTER_S,
            ) from None
        admission = Admission(self, tuple(subjects), decision)
        if not decision.allowed:
            budget = any(e.metric != "requests" for e in decision.exceeded)
            self.count("budget_exceeded" if budget else "rate_limited")
            raise LimitExceeded(decision, self.policy.period, admission.headers())
        self.count("allowed")
        return admission

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()


_RECORDS: set[asyncio.Task[None]] = set()  # charges kept until they finish


@dataclass
class Admission:
    """One admitted request: what it counts against, and what was left of each limit."""

    limits: RequestLimits
    subjects: tuple[SubjectLimits, ...]
    decision: Decision = ALLOW_ALL
    spent_tokens: int = 0
    spent_cost: float = 0.0
    _budget_keys: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self._budget_keys = tuple(s.key for s in self.subjects if s.has_budget)

    def headers(self) -> dict[str, str]:
        """The remaining allowance, the tightest over the caller and its domains, less what
        this request has been charged so far (others' concurrent use is not in it)."""
        out: dict[str, str] = {}
        requests = self.decision.left("requests")
        if requests is not None:
            out["x-ratelimit-limit"] = _count(requests.limit)
            out["x-ratelimit-remaining"] = _count(requests.remaining)
            out["x-ratelimit-reset"] = str(requests.reset_s)
        tokens = self.decision.left("tokens")
        if tokens is not None:
            out["x-budget-tokens-limit"] = _count(tokens.limit)
            out["x-budget-tokens-remaining"] = _count(max(0, tokens.remaining - self.spent_tokens))
            out["x-budget-reset"] = str(tokens.reset_s)
        cost = self.decision.left("cost_usd")
        if cost is not None:
            left = max(0.0, cost.remaining - self.spent_cost)
            out["x-budget-cost-limit"] = _usd(cost.limit)
            out["x-budget-cost-remaining"] = f"{math.floor(left * 1e6) / 1e6:.6f}"
            out["x-budget-reset"] = str(cost.reset_s)
        return out

    @property
    def charged(self) -> bool:
        return bool(self._budget_keys)

    async def record(self, answer: AgentAnswer) -> None:
        """Charge a finished run's usage (a failure is logged, never raised)."""
        await self._charge(
            answer.usage.input_tokens + answer.usage.output_tokens,
            spent_cost(answer.cost.estimated_usd, answer.cost.provider_usd),
        )

    async def _charge(self, tokens: int, cost: float) -> None:
        if not self._budget_keys or (tokens <= 0 and cost <= 0):
            return
        self.spent_tokens += tokens
        self.spent_cost += cost
        store = self.limits.store
        assert store is not None
        task = asyncio.ensure_future(
            asyncio.wait_for(
                store.record(
                    self._budget_keys, tokens, cost, self.limits.clock(), self.limits.policy.period
                ),
                RECORD_TIMEOUT_S,
            )
        )
        _RECORDS.add(task)
        task.add_done_callback(_recorded)
        try:
            # Shielded: a client that goes away does not cancel the charge.
            await asyncio.shield(task)
        except asyncio.CancelledError:
            raise
        except Exception:
            pass  # logged by _recorded

    def _left(self) -> tuple[float | None, float | None]:
        tokens = self.decision.left("tokens")
        cost = self.decision.left("cost_usd")
        return (
            None if tokens is None else tokens.remaining,
            None if cost is None else cost.remaining,
        )

    async def metered(
        self,
        events: AsyncIterator[AgentEvent],
        *,
        question: str,
        history: Sequence[Message] = (),
        model: str,
    ) -> AsyncIterator[AgentEvent]:
        """``events``, charged as described in the module docstring; raises
        ``BudgetCrossed`` (after cancelling the run and charging its estimate) once the
        estimate passes what was left at admission. Closing this closes ``events``."""
        if not self._budget_keys:
            async for event in _closing(events):
                yield event
            return
        tokens_left, cost_left = self._left()
        prompt = estimate_tokens(question) + MESSAGE_OVERHEAD_TOKENS
        prompt += sum(estimate_tokens(m.content or "") + MESSAGE_OVERHEAD_TOKENS for m in history)
        streamed = 0
        finished = False
        try:
            async for event in events:
                if isinstance(event, ProgressEvent) and event.stage == "started" and event.model:
                    model = event.model
                if isinstance(event, DoneEvent):
                    finished = True
                    await self.record(event.response)
                    yield event
                    return
                if isinstance(event, TokenEvent):
                    streamed += estimate_tokens(event.text)
                    used = prompt + streamed
                    cost = _estimated_cost(model, prompt, streamed)
                    over_tokens = tokens_left is not None and used > tokens_left
                    over_cost = cost_left is not None and cost > cost_left
                    if over_tokens or over_cost:
                        finished = True
                        await _close(events)  # cancels the run before anything else
                        await self._charge(used, cost)
                        self.limits.count("stream_cut")
                        what = "token" if over_tokens else "cost"
                        reset = _reset(self.decision)
                        raise BudgetCrossed(
                            f"the {what} budget ran out during this answer "
                            f"(~{used} tokens used, estimated); the answer was stopped",
                            retry_after=reset,
                            details={"used_tokens_estimate": used, "retry_after_s": reset},
                        )
                yield event
        finally:
            await _close(events)
            if not finished and streamed:
                # Cancelled (a disconnect, the deadline) or failed: charge the estimate in the
                # background; this task may itself be cancelled.
                charge = asyncio.ensure_future(
                    self._charge(prompt + streamed, _estimated_cost(model, prompt, streamed))
                )
                _RECORDS_BG.add(charge)
                charge.add_done_callback(_RECORDS_BG.discard)


_RECORDS_BG: set[asyncio.Future[None]] = set()


def _reset(decision: Decision) -> int:
    """Seconds until the budget period ends (what a cut stream waits for)."""
    return max((r.reset_s for r in decision.remaining if r.metric != "requests"), default=1)


def _estimated_cost(model: str, prompt: int, streamed: int) -> float:
    return spent_cost(estimate_cost(model, Usage(prompt, streamed)), None)


def _recorded(task: asyncio.Task[None]) -> None:
    _RECORDS.discard(task)
    exc = None if task.cancelled() else task.exception()
    if exc is not None:
        log.warning("usage limits: a run's usage was not recorded: %r", exc)


async def _close(events: AsyncIterator[AgentEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


async def _closing(events: AsyncIterator[AgentEvent]) -> AsyncIterator[AgentEvent]:
    try:
        async for event in events:
            yield event
    finally:
        await _close(events)


def build_request_limits(
    settings: Settings,
    policy: LimitPolicy,
    *,
    store: UsageStore | None = None,
    metrics: MetricsSink | None = None,
    clock: Clock = utc_now,
) -> RequestLimits:
    """The limits ``policy`` sets (``serve_app.wiring.limit_policy``); off (no store, nothing
    opened) when every limit is 0. ``settings``: the database the counters live in, and
    LIMITS_FAIL_OPEN."""
    if not policy.enabled:
        return RequestLimits(policy, None)
    return RequestLimits(
        policy,
        store if store is not None else LazyUsageStore(settings),
        fail_open=settings.limits.fail_open,
        clock=clock,
        metrics=metrics,
    )
