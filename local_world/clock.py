"""Injectable clocks: the simulators read time only through one of these."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """Wall-clock time, timezone-aware UTC."""
    return datetime.now(UTC)


def parse_instant(value: str | datetime) -> datetime:
    """An ISO-8601 instant (``Z`` or an offset; a naive value is read as UTC) as aware UTC."""
    when = value if isinstance(value, datetime) else datetime.fromisoformat(value.strip())
    if when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    return when.astimezone(UTC)


def format_instant(when: datetime) -> str:
    """``2025-03-04T10:15:00Z`` (UTC, whole seconds)."""
    return when.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


class FixedClock:
    """A pinned clock for tests: returns the same instant until moved."""

    def __init__(self, start: str | datetime) -> None:
        self._now = parse_instant(start)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, when: str | datetime) -> None:
        with self._lock:
            self._now = parse_instant(when)

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> datetime:
        """Move forward by ``delta`` or by ``timedelta(**kwargs)``; return the new instant."""
        step = delta if delta is not None else timedelta(**kwargs)
        with self._lock:
            self._now += step
            return self._now
