"""``OpenedOnFirstUse``: a database-backed resource opened when first needed, not at start-up
(so a replica starts while PostgreSQL is still coming up), once, and again after a failed
attempt. The knowledge base (``serve_app.knowledge.LazyStore``) and the conversation store
(``serve_app.threads.LazyConversationStore``) hold one each."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar


class _Closes(Protocol):
    async def close(self) -> None: ...


T = TypeVar("T", bound=_Closes)


class OpenedOnFirstUse(Generic[T]):
    """What ``open`` returns, opened by the first ``get`` (concurrent first uses wait for one
    attempt; a failed attempt leaves it unopened, so the next use tries again)."""

    def __init__(self, open_: Callable[[], Awaitable[T]]) -> None:
        self._open = open_
        self._value: T | None = None
        self._lock = asyncio.Lock()

    @property
    def opened(self) -> T | None:
        """The resource if it is open, without opening it."""
        return self._value

    async def get(self) -> T:
        if self._value is not None:
            return self._value
        async with self._lock:
            if self._value is None:
                self._value = await self._open()
            return self._value

    async def close(self) -> None:
        value, self._value = self._value, None
        if value is not None:
            await value.close()
