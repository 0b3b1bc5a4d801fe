"""Fault injection against one real Serve stack (issue 8, item 5).

The scripted model server fails as providers do (429 storms, 5xx, hangs, slow replies,
truncated JSON, tool calls naming unknown tools or with bad arguments) and the simulators fail
as downstream services do (down, erroring, slow, leaking other buildings' rooms, garbage).
Each case checks the decision, the HTTP status, the error envelope where there is one, that
nothing is a 500, what the model was shown, and that a normal question still succeeds
afterwards. Last, one AgentLoop replica and then one ToolProxy replica is killed by its pid
(found through the Ray state API) in the middle of a load: Serve replaces it, the error rate
stays bounded, and every request after the recovery succeeds.

The stack runs LLM_TIMEOUT_SECONDS=3 with LLM_MAX_RETRIES=1 (two attempts per model call),
TWIN_TIMEOUT_SECONDS=1, and two replicas each of AgentLoop and ToolProxy."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.stack_helpers import (
    AgentStack,
    SharedServe,
    agent_stack,
    claims,
    replica_actors,
    run_load_with,
    running_replicas,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]


STAFF = claims("u-staff", ("northwind", "business_staff"))
ADMIN_CLAIMS = claims("u-ops", ("crowdvision-ops", "admin"))
HARBOR = "bld-northwind-harbor"
# ids of what a Northwind staff member asking about Harbor Warehouse must never be shown
FOREIGN = (
    *("bld-acme", "bld-civic"),
    *("room-acme", "room-library", "room-townhall", "room-nwhq"),
    *("sen-acme", "sen-library", "sen-townhall", "sen-nwhq"),
)
REPLICAS = 2  # of AgentLoop and of ToolProxy in this stack
RETRY_FAST = {"retry_after_ms": 50}  # a short Retry-After, so the SDK's retry comes quickly


@pytest.fixture(scope="module")
def stack(
    sample_docs_url: str, tmp_path_factory: pytest.TempPathFactory, shared_serve: SharedServe
) -> Iterator[AgentStack]:
    env = {
        "LLM_TIMEOUT_SECONDS": "3",
        "LLM_MAX_RETRIES": "1",
        "TWIN_TIMEOUT_SECONDS": "1",
        "ASK_TIMEOUT_SECONDS": "30",
        "LOG_LEVEL": "WARNING",
    }
    fixed = {"num_replicas": REPLICAS, "autoscaling_config": None}
    app_args = {"per_deployment": {"AgentLoop": fixed, "ToolProxy": fixed}}
    with agent_stack(
        sample_docs_url,
        tmp_path_factory.mktemp("faults-home"),
        env=env,
        app_args=app_args,
        shared=shared_serve,
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def _healthy_world(stack: AgentStack) -> Iterator[None]:
    yield
    stack.twin_server.start()
    stack.twin.reset_faults()
    stack.sensor.reset_faults()


_questions = itertools.count(1)


def ask(stack: AgentStack, question: str, *, stream: bool = False) -> httpx.Response:
    body: dict[str, Any] = {"question": question}
    if stream:
        body["stream"] = True
    return httpx.post(f"{stack.url}/ask", json=body, headers=STAFF, timeout=90)


def sse_events(resp: httpx.Response) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    name = ""
    for line in resp.text.splitlines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            events.append((name, json.loads(line.split(":", 1)[1])))
    return events


def assert_still_serving(stack: AgentStack) -> None:
    """A normal question, with a tool call, answered end to end."""
    question = f"Still there? What is Harbor Warehouse? (check {next(_questions)})"
    stack.llm.script(
        {"tool_calls": [{"name": "get_building", "arguments": {"building_id": HARBOR}}]},
        {"text": "Harbor Warehouse is Northwind's warehouse."},
        key=question,
    )
    resp = ask(stack, question)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["decision"] == "answered"
    assert [(c["name"], c["ok"]) for c in body["tool_calls"]] == [("get_building", True)]


def tool_messages(stack: AgentStack, question: str) -> list[str]:
    """The tool results the model was shown in its last request for ``question``."""
    last = stack.llm.chat_requests(key=question)[-1].body
    return [str(m["content"]) for m in last["messages"] if m.get("role") == "tool"]


# --- the model provider misbehaves ---------------------------------------------------------------

PROVIDER_CASES: dict[str, tuple[list[dict[str, Any]], int, str, str | None, int]] = {
    # name: (steps, HTTP status, decision, error code, model calls made)
    "429 storm outlasting the retries": (
        [{"fault": "rate_limit", **RETRY_FAST}] * 2,
        503,
        "provider_error",
        "provider_unavailable",
        2,
    ),
    "429 storm ending within the retries": (
        [{"fault": "rate_limit", **RETRY_FAST}, {"text": "The storm passed."}],
        200,
        "answered",
        None,
        2,
    ),
    "500s outlasting the retries": (
        [{"fault": "server_error", "status": 500}] * 2,
        503,
        "provider_error",
        "provider_unavailable",
        2,
    ),
    "500 marked not retryable": (
        [{"fault": "server_error", "status": 500, "retry": False}],
        503,
        "provider_error",
        "provider_unavailable",
        1,
    ),
    "502 then success": (
        [{"fault": "server_error", "status": 502}, {"text": "Recovered."}],
        200,
        "answered",
        None,
        2,
    ),
    "400 rejected by the provider": (
        [{"fault": "server_error", "status": 400}],
        502,
        "provider_error",
        "provider_rejected",
        1,
    ),
    "hang past LLM_TIMEOUT_SECONDS": (
        [{"fault": "hang"}] * 2,
        504,
        "provider_error",
        "provider_unavailable",
        2,
    ),
    "reply slower than LLM_TIMEOUT_SECONDS": (
        [{"text": "Too late.", "delay_ms": 5000}] * 2,
        504,
        "provider_error",
        "provider_unavailable",
        2,
    ),
    "truncated JSON twice": (
        [{"fault": "malformed"}] * 2,
        502,
        "provider_error",
        "malformed_reply",
        2,
    ),
    "truncated JSON once, then a good reply": (
        [{"fault": "malformed"}, {"text": "Second time lucky."}],
        200,
        "answered",
        None,
        2,
    ),
}


@pytest.mark.parametrize("case", list(PROVIDER_CASES))
def test_provider_faults_end_in_a_clean_decision_and_status(stack: AgentStack, case: str) -> None:
    steps, status, decision, code, calls = PROVIDER_CASES[case]
    question = f"Provider fault: {case} ({next(_questions)})"
    stack.llm.script(*steps, key=question)
    started = time.monotonic()
    resp = ask(stack, question)
    took = time.monotonic() - started
    print(f"[faults] {case}: HTTP {resp.status_code} in {took:.2f} s")
    assert resp.status_code == status, resp.text
    assert resp.headers.get("x-request-id")
    body = resp.json()
    assert body["decision"] == decision
    assert len(stack.llm.chat_requests(key=question)) == calls
    if code is None:
        assert body.get("error") is None
        assert body["answer"]
    else:
        # the AgentAnswer's error member is the envelope: code and a clean message
        assert body["error"]["code"] == code
        assert body["error"]["message"]
        assert "Traceback" not in resp.text and "test-key" not in resp.text
        if status == 504:
            assert "timed out" in body["error"]["message"]
        assert body["answer"]  # the user-facing text, not an exception
    assert_still_serving(stack)


@pytest.mark.parametrize(
    ("case", "steps", "code"),
    [
        ("429 storm", [{"fault": "rate_limit", **RETRY_FAST}] * 2, "provider_unavailable"),
        ("truncated SSE", [{"fault": "malformed"}] * 2, "malformed_reply"),
    ],
)
def test_streamed_provider_faults_end_with_one_error_event(
    stack: AgentStack, case: str, steps: list[dict[str, Any]], code: str
) -> None:
    question = f"Streamed provider fault: {case} ({next(_questions)})"
    stack.llm.script(*steps, key=question)
    resp = ask(stack, question, stream=True)
    assert resp.status_code == 200
    events = sse_events(resp)
    print(f"[faults] stream {case}: events {[name for name, _ in events]}")
    assert [name for name, _ in events if name in ("done", "error")] == ["error"]
    assert events[-1][0] == "error"
    final = events[-1][1]
    assert final["decision"] == "provider_error"
    assert final["error"]["code"] == code
    assert_still_serving(stack)


# --- the model calls tools badly -----------------------------------------------------------------

TOOL_CALL_CASES: dict[str, tuple[str, Any, str]] = {
    # name: (tool, arguments, what the tool error says)
    "unknown tool": ("drop_all_tables", {}, "unknown tool 'drop_all_tables'"),
    "wrong argument type": ("get_building", {"building_id": 42}, "invalid arguments"),
    "missing argument": ("get_room_occupancy", {}, "invalid arguments"),
    "unexpected argument": (
        "get_building",
        {"building_id": HARBOR, "as_user": "admin"},
        "invalid arguments",
    ),
    "truncated JSON arguments": ("get_building", '{"building_id": "bld-nor', "not valid JSON"),
    "arguments not an object": ("get_building", '["bld-northwind-harbor"]', "JSON object"),
}


@pytest.mark.parametrize("case", list(TOOL_CALL_CASES))
def test_bad_tool_calls_are_tool_errors_the_model_reads(stack: AgentStack, case: str) -> None:
    tool, arguments, says = TOOL_CALL_CASES[case]
    question = f"Bad tool call: {case} ({next(_questions)})"
    stack.llm.script(
        {"tool_calls": [{"name": tool, "arguments": arguments}]},
        {"text": "I could not look that up."},
        key=question,
    )
    resp = ask(stack, question)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["decision"] == "answered"
    (trace,) = body["tool_calls"]
    print(f"[faults] {case}: tool error {trace['error']!r}")
    assert trace["ok"] is False
    assert says in trace["error"]
    (shown,) = tool_messages(stack, question)
    assert json.loads(shown) == {"error": trace["error"]}  # the model read the same error
    assert_still_serving(stack)


# --- downstream services misbehave ---------------------------------------------------------------


def _ask_with_tool(
    stack: AgentStack, case: str, tool: str, arguments: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    question = f"Downstream fault: {case} ({next(_questions)})"
    stack.llm.script(
        {"tool_calls": [{"name": tool, "arguments": arguments}]},
        {"text": "Live data is unavailable right now."},
        key=question,
    )
    resp = ask(stack, question)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    assert body["decision"] == "answered"
    (shown,) = tool_messages(stack, question)
    print(f"[faults] {case}: {tool} -> ok={body['tool_calls'][0]['ok']} {shown[:160]}")
    return body, shown


@pytest.mark.parametrize(
    ("case", "service", "faults", "says"),
    [
        ("twin 500s", "twin", {"fail_rate": 1.0}, "twin-service is unavailable (HTTP 500)"),
        ("twin slower than its timeout", "twin", {"latency_ms": 2500}, "twin-service timed out"),
        ("twin garbage", "twin", {"garbage": True}, "unreadable response"),
        ("sensor 500s", "sensor", {"fail_rate": 1.0}, "sensor-service is unavailable"),
        ("sensor garbage", "sensor", {"garbage": True}, "sensor-service returned an unreadable"),
    ],
)
def test_downstream_failures_are_tool_errors(
    stack: AgentStack, case: str, service: str, faults: dict[str, Any], says: str
) -> None:
    control = stack.twin if service == "twin" else stack.sensor
    control.set_faults(**faults)
    try:
        body, shown = _ask_with_tool(stack, case, "list_sensors", {"building_id": HARBOR})
    finally:
        control.reset_faults()
    (trace,) = body["tool_calls"]
    assert trace["ok"] is False
    assert says in trace["error"]
    assert json.loads(shown) == {"error": trace["error"]}
    assert_still_serving(stack)


def test_twin_service_down_is_a_tool_error_and_it_recovers(stack: AgentStack) -> None:
    stack.twin_server.stop()  # connection refused from now on
    try:
        body, _ = _ask_with_tool(stack, "twin down", "get_building", {"building_id": HARBOR})
        (trace,) = body["tool_calls"]
        assert trace["ok"] is False
        assert "twin-service is unreachable" in trace["error"]
    finally:
        stack.twin_server.start()
    assert_still_serving(stack)


def test_twin_service_slow_within_its_timeout_still_answers(stack: AgentStack) -> None:
    stack.twin.set_faults(latency_ms=300)
    body, shown = _ask_with_tool(stack, "twin slow", "get_building", {"building_id": HARBOR})
    assert body["tool_calls"][0]["ok"] is True
    assert "Harbor Warehouse" in shown


@pytest.mark.parametrize(
    ("case", "service", "faults", "raw_path", "tool", "arguments"),
    [
        (
            "sensor registry leaks other buildings' devices",
            "sensor",
            {"leak_foreign_rooms": True},
            f"/sensors/buildings/{HARBOR}",
            "list_sensors",
            {"building_id": HARBOR},
        ),
        (
            "twin room list leaks other buildings' rooms",
            "twin",
            {"leak_foreign_rooms": True},
            f"/buildings/{HARBOR}/rooms",
            "get_building",
            {"building_id": HARBOR},
        ),
        (
            "twin lists every building, ignoring the caller",
            "twin",
            {"leak_foreign_buildings": True},
            "/buildings",
            "list_buildings",
            {},
        ),
    ],
)
def test_foreign_rooms_from_downstream_never_reach_the_model(
    stack: AgentStack,
    case: str,
    service: str,
    faults: dict[str, Any],
    raw_path: str,
    tool: str,
    arguments: dict[str, Any],
) -> None:
    control, base = (
        (stack.twin, stack.twin_server.url)
        if service == "twin"
        else (stack.sensor, stack.sensor_url)
    )
    control.set_faults(**faults)
    try:
        # the service really answers this caller with other buildings' data ...
        raw = httpx.get(base + raw_path, headers=STAFF, timeout=10)
        assert raw.status_code == 200
        assert any(foreign in raw.text for foreign in FOREIGN), raw.text[:300]
        body, shown = _ask_with_tool(stack, case, tool, arguments)
    finally:
        control.reset_faults()
    # ... and none of it reaches the model or the caller
    assert body["tool_calls"][0]["ok"] is True
    assert "harbor" in shown.lower()
    for foreign in FOREIGN:
        assert foreign not in shown, (case, foreign)
        assert foreign not in json.dumps(body), (case, foreign)
    assert_still_serving(stack)


# --- a replica killed under load -----------------------------------------------------------------

LOAD_QUESTION = "Load: what is Harbor Warehouse?"


def _script_load(stack: AgentStack) -> None:
    stack.llm.script(
        {"tool_calls": [{"name": "get_building", "arguments": {"building_id": HARBOR}}]},
        {"text": "Harbor Warehouse is Northwind's warehouse.", "delay_ms": 20},
        key=LOAD_QUESTION,
        mode="loop",
    )


@pytest.mark.parametrize("deployment", ["AgentLoop", "ToolProxy"])
def test_a_replica_killed_under_load_is_replaced(stack: AgentStack, deployment: str) -> None:
    _script_load(stack)
    before = replica_actors(deployment)
    assert len(before) == REPLICAS, before
    victim = before[0]
    print(f"[faults] killing {deployment} replica pid {victim.pid} ({victim.actor_id[:12]})")
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.monotonic())
        os.kill(int(victim.pid), signal.SIGKILL)

    run = run_load_with(
        f"{stack.url}/ask",
        lambda i: {"question": LOAD_QUESTION},
        STAFF,
        concurrency=8,
        seconds=15,
        action=kill,
        action_at=4,
        probe_body=lambda i: {"question": f"{LOAD_QUESTION} (probe {i})"},
    )
    print(f"[faults] {deployment} kill under load: {run.summary()}")
    assert killed_at, "the kill never ran"
    assert run.result.requests >= 20, run.summary()
    # bounded: at most a fifth of the requests in the window failed ...
    assert run.result.errors <= 0.2 * run.result.requests, run.summary()
    # ... and none of them as a 500: a lost AgentLoop is a 503 envelope, a lost ToolProxy is
    # retried on the other replica
    assert {status for _, status, _ in run.probes} <= {200, 503}, run.summary()
    if deployment == "ToolProxy":
        assert run.result.errors == 0, run.summary()

    def replaced() -> bool:
        alive = replica_actors(deployment)
        return (
            running_replicas(deployment) == REPLICAS
            and len(alive) == REPLICAS
            and victim.actor_id not in {a.actor_id for a in alive}
        )

    waited = wait_until(replaced, 180, f"Serve to replace the {deployment} replica")
    recovered_after = time.monotonic() - killed_at[0]
    new_pids = sorted(int(a.pid) for a in replica_actors(deployment))
    print(
        f"[faults] {deployment}: {REPLICAS} replicas RUNNING again {recovered_after:.1f} s after "
        f"the kill (waited {waited:.1f} s after the load); pids now {new_pids}"
    )
    after = run_load_with(
        f"{stack.url}/ask",
        lambda i: {"question": LOAD_QUESTION},
        STAFF,
        concurrency=4,
        seconds=5,
    )
    print(f"[faults] {deployment} after recovery: {after.summary()}")
    assert after.result.requests > 0
    assert after.result.errors == 0, after.summary()
