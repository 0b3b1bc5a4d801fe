"""The order chat completions take a model's slots in: the earliest ask first, then arrival;
a waiter that goes away never keeps a slot; and the router holds a slot for a whole reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest

from agent.llm.base import QUEUE_PRIORITY_HEADER
from serve_app.local_llm.proxy import ReplyHead
from serve_app.local_llm.router import ModelRouter, RoutedLLM, create_router_app
from serve_app.local_llm.slots import SlotGate, priority_of


def test_priority_is_the_header_when_it_is_a_finite_number_else_the_arrival() -> None:
    assert priority_of({QUEUE_PRIORITY_HEADER: "1764700000.25"}, now=5.0) == 1764700000.25
    for bad in ("soon", "", "nan", "inf", "-inf"):
        assert priority_of({QUEUE_PRIORITY_HEADER: bad}, now=5.0) == 5.0
    assert priority_of({}, now=5.0) == 5.0


async def _holder(gate: SlotGate, priority: float, order: list[float], hold: asyncio.Event) -> None:
    async with gate.slot(priority):
        order.append(priority)
        await hold.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_waiters_are_admitted_lowest_priority_first_not_in_arrival_order() -> None:
    gate, order, release = SlotGate(1), [], asyncio.Event()
    first = asyncio.create_task(_holder(gate, 50.0, order, asyncio.Event()))
    await _settle()
    waiters = [asyncio.create_task(_holder(gate, p, order, release)) for p in (30.0, 10.0, 20.0)]
    await _settle()
    assert order == [50.0] and gate.waiting == 3
    first.cancel()  # the holder ends: the slot goes to the earliest ask, not the first to wait
    release.set()
    await asyncio.gather(*waiters)
    assert order == [50.0, 10.0, 20.0, 30.0]


async def test_equal_priorities_keep_arrival_order_and_slots_run_side_by_side() -> None:
    gate, order, hold = SlotGate(2), [], asyncio.Event()
    tasks = [asyncio.create_task(_holder(gate, 1.0, order, hold)) for _ in range(4)]
    await _settle()
    assert len(order) == 2 and gate.waiting == 2  # two slots busy at once
    hold.set()
    await asyncio.gather(*tasks)
    assert len(order) == 4


async def test_a_waiter_that_goes_away_does_not_keep_a_slot() -> None:
    gate, order = SlotGate(1), []
    hold, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_holder(gate, 1.0, order, hold))
    await _settle()
    gone = asyncio.create_task(_holder(gate, 2.0, order, release))
    later = asyncio.create_task(_holder(gate, 3.0, order, release))
    await _settle()
    gone.cancel()
    await _settle()
    assert gate.waiting == 1
    hold.set()
    release.set()
    await asyncio.gather(holder, later)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert order == [1.0, 3.0]
    async with gate.slot(0.0):  # everything released: free at once
        pass


async def test_a_waiter_granted_as_it_is_cancelled_passes_the_slot_on() -> None:
    gate, order, release = SlotGate(1), [], asyncio.Event()
    held = gate.slot(1.0)
    await held.__aenter__()
    unlucky = asyncio.create_task(_holder(gate, 2.0, order, release))
    next_one = asyncio.create_task(_holder(gate, 3.0, order, release))
    await _settle()
    await held.__aexit__(None, None, None)  # the slot is granted to `unlucky`, not yet run...
    unlucky.cancel()  # ...which goes away before it runs
    release.set()
    await next_one
    assert order == [3.0]
    assert gate.waiting == 0


def test_a_gate_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        SlotGate(0)


class SlowModel:
    """A backend whose replies take until ``release`` is set; records who got in, in order."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def chat_completion_parts(
        self, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[ReplyHead | bytes]:
        self.started.append(body.decode())
        yield ReplyHead(status=200, content_type="application/json", stream=False)
        await self.release.wait()
        yield b"{}"

    async def model_entries(self) -> list[dict[str, Any]]:
        return []

    async def probe(self) -> tuple[bool, str]:
        return True, "ok"


async def test_the_router_serves_the_earliest_ask_first_and_holds_the_slot_for_the_reply() -> None:
    model = SlowModel()
    routes = RoutedLLM(ModelRouter([("m", model)]), {"m": 1})
    transport = httpx.ASGITransport(app=create_router_app(routes))
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:

        def post(name: str, asked_at: float | None) -> asyncio.Task[httpx.Response]:
            headers = {} if asked_at is None else {QUEUE_PRIORITY_HEADER: str(asked_at)}
            return asyncio.create_task(
                client.post("/v1/chat/completions", content=name, headers=headers)
            )

        first = post('"first"', 100.0)
        for _ in range(20):
            await asyncio.sleep(0.01)
            if model.started:
                break
        rest = [post('"newer ask"', 300.0), post('"no header"', None), post('"older ask"', 200.0)]
        await asyncio.sleep(0.1)
        assert model.started == ['"first"']  # one slot: the others wait, holding nothing
        model.release.set()
        replies = await asyncio.gather(first, *rest)
    assert [r.status_code for r in replies] == [200] * 4
    # the older ask before the newer one, although it arrived last; a request with no header
    # ranks by its arrival (now: after both)
    assert model.started == ['"first"', '"older ask"', '"newer ask"', '"no header"']
