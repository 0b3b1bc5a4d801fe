"""A replica dying under a request, at the two deployment hops that call another deployment
(fast: fake handles raising what Serve raises). The real thing, a replica killed by its pid
under load, is in tests/e2e/test_faults.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from agent.llm.base import ToolCall
from agent.request import AgentRequest
from agent.tools import build_default_registry
from agent.tools.executor import ToolRequest
from agent.tools.registry import ToolOutcome
from deployments.agent_loop import HandleToolExecutor
from deployments.ingress import ServeBackend
from foundation.identity import AuthUser
from foundation.settings import Settings
from serve_app.backend import BackendError

USER = AuthUser(sub="u-1", roles=("business_staff",), domains=("northwind",))
CALL = ToolCall(id="call_1", name="get_building", arguments='{"building_id": "bld-x"}')
OK = ToolOutcome(
    call_id="call_1",
    name="get_building",
    arguments={"building_id": "bld-x"},
    ok=True,
    error=None,
    result_json="{}",
    duration_ms=1.0,
)


class _Method:
    """``handle.<method>`` whose ``.remote()`` awaits to each of ``results`` in turn (an
    exception instance is raised)."""

    def __init__(self, results: list[Any]) -> None:
        self.results = results
        self.calls = 0

    def remote(self, *args: Any) -> Any:
        self.calls += 1
        result = self.results.pop(0)

        async def respond() -> Any:
            if isinstance(result, BaseException):
                raise result
            return result

        return respond()


class _Handle:
    def __init__(self, **methods: _Method) -> None:
        for name, method in methods.items():
            setattr(self, name, method)

    def options(self, **_: Any) -> _Handle:
        return self


def _executor(results: list[Any]) -> tuple[HandleToolExecutor, _Method]:
    method = _Method(results)
    handle: Any = _Handle(execute=method)
    return HandleToolExecutor(handle, build_default_registry().specs()), method


def test_a_tool_call_survives_one_dead_tool_proxy_replica() -> None:
    executor, method = _executor([ActorDiedError(), OK])
    outcome = asyncio.run(executor.execute(CALL, ToolRequest(user=USER)))
    assert outcome == OK
    assert method.calls == 2  # read-only tools: retried once on another replica


@pytest.mark.parametrize(
    "failures",
    [
        [ActorDiedError(), ActorDiedError()],
        [ActorUnavailableError("unreachable", None), ActorDiedError()],
        [RuntimeError("boom")],
    ],
)
def test_a_tool_proxy_failure_is_a_tool_error_the_model_reads(failures: list[Any]) -> None:
    executor, method = _executor(list(failures))
    outcome = asyncio.run(executor.execute(CALL, ToolRequest(user=USER)))
    assert outcome.ok is False
    assert outcome.call_id == "call_1" and outcome.name == "get_building"
    assert outcome.arguments == {"building_id": "bld-x"}
    assert outcome.error and "unavailable" in outcome.error
    assert json.loads(outcome.result_json) == {"error": outcome.error}
    assert method.calls == len(failures)


def test_cancelling_a_tool_call_still_cancels() -> None:
    executor, _ = _executor([asyncio.CancelledError()])
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(executor.execute(CALL, ToolRequest(user=USER)))


def test_a_dead_agent_loop_replica_is_a_503_envelope_not_a_500(tmp_path: Any) -> None:
    handle: Any = _Handle(answer=_Method([ActorDiedError()]))
    backend = ServeBackend(handle, Settings(agent_service_home=tmp_path))
    with pytest.raises(BackendError) as caught:
        asyncio.run(backend.ask(AgentRequest("hi", USER)))
    assert caught.value.status == 503
    assert caught.value.code == "backend_unavailable"
    assert caught.value.retry_after is not None


class _DyingStream:
    """A streaming response whose replica dies before the first event."""

    def __init__(self) -> None:
        self.cancelled = False

    def __aiter__(self) -> _DyingStream:
        return self

    async def __anext__(self) -> Any:
        raise ActorDiedError()

    def cancel(self) -> None:
        self.cancelled = True


def test_a_dead_agent_loop_replica_mid_stream_is_a_backend_error(tmp_path: Any) -> None:
    dying = _DyingStream()

    class _StreamMethod:
        def remote(self, *args: Any) -> _DyingStream:
            return dying

    handle: Any = _Handle(stream=_StreamMethod())  # type: ignore[arg-type]
    backend = ServeBackend(handle, Settings(agent_service_home=tmp_path))

    async def consume() -> None:
        async for _ in backend.ask_stream(AgentRequest("hi", USER)):
            pass

    with pytest.raises(BackendError) as caught:
        asyncio.run(consume())
    assert caught.value.status == 503
    assert dying.cancelled  # the Serve call is still cancelled on the way out
