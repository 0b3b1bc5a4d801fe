"""End to end: the real Serve application (five deployments on a local Ray, HTTP on
127.0.0.1) with the scripted model server, the twin/sensor simulators and the embedded
PostgreSQL holding the sample documentation."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_world.otlp_collector import OtlpCollector, create_otlp_app
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.sensor_service import create_sensor_app
from local_world.servers import run_in_thread
from local_world.twin_service import create_twin_app
from local_world.world import build_world
from tests.e2e.stack_helpers import (
    SharedServe,
    chunk_id_for,
    claims,
    scoped_environ,
    wait_ready,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


EVAL_SECRET = "e2e-eval-secret-0123456789abcdef"
STAFF = claims("u-staff", ("northwind", "business_staff"))
ADMIN = claims("u-admin", ("crowdvision-ops", "admin"))
USER_PER_MINUTE = 30


class Stack:
    def __init__(self, url: str, llm: ScriptedLLM, collector: OtlpCollector) -> None:
        self.url = url
        self.llm = llm
        self.collector = collector  # every replica exports its spans here over OTLP/HTTP


@pytest.fixture(scope="module")
def stack(
    sample_docs_url: str, tmp_path_factory: pytest.TempPathFactory, shared_serve: SharedServe
) -> Iterator[Stack]:
    from deployments.graph import build_app

    world = build_world()
    llm = ScriptedLLM()
    collector = OtlpCollector()
    docs = tmp_path_factory.mktemp("ingest-docs")
    (docs / "page.md").write_text("# E2E page\n\nThe pelican sensor reports every minute.\n")
    with (
        run_in_thread(create_twin_app(world)) as twin_url,
        run_in_thread(create_sensor_app(world)) as sensor_url,
        run_in_thread(create_llm_app(llm)) as llm_url,
        run_in_thread(create_otlp_app(collector)) as otlp_url,
    ):
        env = {
            "DATABASE_URL": sample_docs_url,
            "AGENT_SERVICE_HOME": str(tmp_path_factory.mktemp("home")),
            "LLM_BASE_URL": f"{llm_url}/v1",
            "LLM_API_KEY": "test-key",
            "ANSWER_MODEL": "local/scripted",
            "TWIN_SERVICE_URL": twin_url,
            "SENSOR_SERVICE_URL": sensor_url,
            "MODEL_OVERRIDE_MIN_ROLE": "business_admin",
            "ALLOWED_MODELS": "local/scripted,local/other",
            "DOC_ROOTS": f"{docs}=",
            "HF_HUB_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "ASK_TIMEOUT_SECONDS": "8",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url,
            "OTEL_EXPORTER_OTLP_HEADERS": "x-langfuse-ingestion-version=4",
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # export within 0.2 s (default 5 s)
            "EVAL_JWT_SECRET": EVAL_SECRET,
            # High enough for every other test's caller; the limits test uses its own.
            "RATE_LIMIT_USER_PER_MINUTE": str(USER_PER_MINUTE),
        }
        # Two Ingress replicas: the rate limit is counted across both. On the session's shared
        # Ray head, the settings in the replicas' environment.
        ingress = {"autoscaling_config": {"min_replicas": 2, "max_replicas": 2}}
        app = build_app({"per_deployment": {"Ingress": ingress}, "env": env})
        with scoped_environ(env), shared_serve.app((app, "agent", "/")) as url:
            wait_ready(url)
            yield Stack(url, llm, collector)


def _script_docs_answer(llm: ScriptedLLM, question: str, chunk_id: str, **final: Any) -> None:
    llm.script(
        {"tool_calls": [{"name": "search_docs", "arguments": {"query": "alert cooldown"}}]},
        {
            "text": f"Alerts repeat at most once per cooldown [^{chunk_id}]. "
            "Also see [^deadbeef0000].",
            "usage": {"prompt_tokens": 120, "completion_tokens": 20},
            **final,
        },
        key=question,
    )


def test_json_ask_runs_the_tool_chain_and_validates_citations(
    stack: Stack, sample_docs_url: str
) -> None:
    question = "How often do alerts repeat? (json)"
    chunk_id = chunk_id_for(sample_docs_url, "Cooldown: how often")
    _script_docs_answer(stack.llm, question, chunk_id)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    resp = httpx.post(
        f"{stack.url}/ask",
        json={"question": question, "top_k": 8},
        headers={**STAFF, "traceparent": traceparent},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["decision"] == "answered"
    assert [c["name"] for c in body["tool_calls"]] == ["search_docs"]
    assert body["tool_calls"][0]["ok"] is True
    assert [c["chunk_id"] for c in body["citations"]] == [chunk_id]
    assert body["retrieval"]["hallucinated_citations"] == ["deadbeef0000"]
    assert "deadbeef0000" not in body["answer"]
    assert body["usage"]["input_tokens"] >= 120
    # The caller's trace crossed Ingress -> AgentLoop (and on to the tools' hops).
    assert body["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    # top_k reached retrieval: the tool result shown to the model had up to 8 chunks.
    tool_message = stack.llm.chat_requests()[-1].body["messages"][-1]["content"]
    assert 1 < tool_message.count('"chunk_id"') <= 8


def test_one_trace_spans_every_deployment_and_arrives_over_otlp(
    stack: Stack, sample_docs_url: str
) -> None:
    question = "How often do alerts repeat? (traced)"
    chunk_id = chunk_id_for(sample_docs_url, "Cooldown: how often")
    _script_docs_answer(stack.llm, question, chunk_id)
    resp = httpx.post(
        f"{stack.url}/ask",
        json={"question": question},
        headers={**STAFF, "x-session-id": "chat-7"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    trace_id = resp.json()["trace_id"]

    def complete(spans: list[Any]) -> bool:
        names = {s.name for s in spans if s.trace_id == trace_id}
        return {"agent.answer", "tool.search_docs", "retrieve.rerank"} <= names

    spans = [s for s in stack.collector.wait_for(complete) if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if s.name == "agent.answer"]
    assert root.parent_span_id == ""  # a true root: no invented parent
    # each span's parent is in the same trace, so the tree is whole across processes
    assert all(s.parent_span_id in by_id for s in spans if s is not root)
    components = {s.name: s.resource["service.component"] for s in spans}
    assert components["agent.answer"] == "AgentLoop"
    assert components["tool.search_docs"] == "ToolProxy"
    assert components["retrieve.vector"] == components["retrieve.rerank"] == "Retriever"
    tool = next(s for s in spans if s.name == "tool.search_docs")
    assert by_id[tool.parent_span_id].name == "agent.hop.1"
    assert by_id[by_id[tool.parent_span_id].parent_span_id] is root
    for span in spans:
        assert span.attributes["user.id"] == "u-staff"
        assert span.attributes["session.id"] == "chat-7"
        assert span.attributes["langfuse.observation.type"]
        assert span.resource["service.name"] == "agent-service"
    # OBSERVE_PAYLOADS is off: the question's words are nowhere in what was exported
    exported = json.dumps([[s.name, s.attributes, s.events] for s in spans])
    assert "alert cooldown" not in exported and "repeat" not in exported
    assert all(h.get("x-langfuse-ingestion-version") == "4" for h in stack.collector.requests)


def _streamed_ask(stack: Stack, question: str) -> list[tuple[str, dict[str, Any], float]]:
    """POST a streamed /ask as STAFF: its events (name, data, arrival time), in order."""
    events: list[tuple[str, dict[str, Any], float]] = []
    with httpx.stream(
        "POST",
        f"{stack.url}/ask",
        json={"question": question, "stream": True},
        headers=STAFF,
        timeout=60,
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1]), time.monotonic()))
    return events


def test_sse_streams_events_in_order_and_done_matches_json(
    stack: Stack, sample_docs_url: str
) -> None:
    question = "How often do alerts repeat? (stream)"
    chunk_id = chunk_id_for(sample_docs_url, "Cooldown: how often")
    _script_docs_answer(stack.llm, question, chunk_id, chunk_chars=4, stream_delay_ms=40)
    events = _streamed_ask(stack, question)
    kinds = [k for k, _, _ in events]
    # progress events cross the AgentLoop -> Ingress streaming handle too: started first
    assert events[0][:2] == ("progress", {"stage": "started", "model": "local/scripted"})
    stages = [d["stage"] for k, d, _ in events if k == "progress"]
    calls = [i for i, stage in enumerate(stages) if stage == "model"]
    assert calls[0] < stages.index("tool_started") < calls[1]  # between the two model calls
    assert kinds[-1] == "done"
    assert "token" in kinds and "citation" in kinds
    assert kinds.index("progress") < kinds.index("tool") < kinds.index("token")
    tokens = [(d, t) for k, d, t in events if k == "token"]
    streamed = "".join(d["text"] for d, _ in tokens)
    assert "deadbeef0000" not in streamed
    # Per-token: the first token arrived well before the last (the model streams slowly).
    assert tokens[-1][1] - tokens[0][1] > 0.3
    done = events[-1][1]  # the done event carries the response object itself
    assert done["decision"] == "answered"
    assert [c["chunk_id"] for c in done["citations"]] == [chunk_id]
    assert done["answer"].strip() == streamed.strip()
    # Same shape as the JSON response.
    _script_docs_answer(stack.llm, question + " again", chunk_id)
    json_body = httpx.post(
        f"{stack.url}/ask", json={"question": question + " again"}, headers=STAFF, timeout=60
    ).json()
    assert set(done) == set(json_body)


def test_a_conversation_continues_through_the_ingress_and_reads_back(stack: Stack) -> None:
    """The Ingress replica opens its own pool and stores each turn where the answer leaves:
    a JSON turn, then a streamed one in the same thread, read back; another caller gets the
    unknown id's 404."""
    stack.llm.script({"text": "Turn one answered."}, key="conversation turn one")
    first = httpx.post(
        f"{stack.url}/ask", json={"question": "conversation turn one"}, headers=STAFF, timeout=60
    ).json()
    ident = first["conversation_id"]
    assert first["turn"] == 1 and ident
    # a follow-up's first user message is the thread's first question (its history)
    stack.llm.script({"text": "Turn two answered."}, key="conversation turn one")
    with httpx.stream(
        "POST",
        f"{stack.url}/ask",
        json={"question": "conversation turn two", "stream": True, "conversation_id": ident},
        headers=STAFF,
        timeout=60,
    ) as resp:
        data = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
    assert (data[-1]["conversation_id"], data[-1]["turn"]) == (ident, 2)
    thread = httpx.get(f"{stack.url}/conversations/{ident}", headers=STAFF, timeout=30).json()
    assert [(t["turn"], t["answer"]) for t in thread["turns"]] == [
        (1, "Turn one answered."),
        (2, "Turn two answered."),
    ]
    theirs = httpx.get(f"{stack.url}/conversations/{ident}", headers=ADMIN, timeout=30)
    assert theirs.status_code == 404
    assert theirs.json() == {"error": {"code": "not_found", "message": f"no conversation {ident}"}}
    gone = httpx.delete(f"{stack.url}/conversations/{ident}", headers=STAFF, timeout=30)
    assert gone.status_code == 204


def test_the_rate_limit_holds_through_the_serve_ingress(stack: Stack) -> None:
    """RATE_LIMIT_USER_PER_MINUTE counted in PostgreSQL from two Ingress replicas at once: a
    fresh caller sending N+k asks eight at a time gets exactly N answers this minute and k 429
    envelopes with Retry-After; the answers carry each remaining allowance once; an admin
    (Cedar: exempt) is never refused."""
    from ray import serve

    ingress = serve.status().applications["agent"].deployments["Ingress"]
    assert ingress.replica_states.get("RUNNING") == 2
    question = "limits through the ingress"
    stack.llm.script({"text": "Within the limit."}, key=question, mode="loop")
    caller = claims("u-limited", ("acme", "business_staff"))
    if 60 - time.gmtime().tm_sec < 20:  # the minute window must not roll over mid-test
        time.sleep(61 - time.gmtime().tm_sec)
    with httpx.Client(base_url=stack.url, timeout=60) as client:

        def ask(_: int) -> httpx.Response:
            return client.post("/ask", json={"question": question}, headers=caller)

        with ThreadPoolExecutor(max_workers=8) as pool:
            responses = list(pool.map(ask, range(USER_PER_MINUTE + 3)))
        admin = client.post("/ask", json={"question": question}, headers=ADMIN)
    answered = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert len(answered) == USER_PER_MINUTE
    assert [r.status_code for r in refused] == [429] * 3
    remaining = sorted(int(r.headers["x-ratelimit-remaining"]) for r in answered)
    assert remaining == list(range(USER_PER_MINUTE))
    for r in refused:
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert r.json()["error"]["code"] == "rate_limited"
    assert admin.status_code == 200


def test_model_override_is_role_gated_and_allow_listed(stack: Stack) -> None:
    forbidden = httpx.post(
        f"{stack.url}/ask",
        json={"question": "hi", "model": "local/other"},
        headers=STAFF,
        timeout=30,
    )
    assert forbidden.status_code == 403
    assert set(forbidden.json()["error"]) >= {"code", "message"}
    badmin = claims("u-badmin", ("northwind", "business_admin"))
    not_allowed = httpx.post(
        f"{stack.url}/ask",
        json={"question": "hi", "model": "someone/else"},
        headers=badmin,
        timeout=30,
    )
    assert not_allowed.status_code == 400
    assert "error" in not_allowed.json()


@pytest.mark.parametrize(
    "headers",
    [
        {"x-gateway-claims": "%%% not base64 %%%"},
        {"x-gateway-claims": base64.b64encode(b"not json").decode()},
        {"authorization": "Bearer not.a.jwt"},
        {},
    ],
)
def test_bad_credentials_are_401_with_the_envelope(stack: Stack, headers: dict[str, str]) -> None:
    resp = httpx.post(f"{stack.url}/ask", json={"question": "hi"}, headers=headers, timeout=30)
    assert resp.status_code == 401
    assert set(resp.json()["error"]) >= {"code", "message"}


def test_unknown_route_and_bad_body_use_the_envelope(stack: Stack) -> None:
    missing = httpx.get(f"{stack.url}/nope", headers=STAFF, timeout=30)
    assert missing.status_code == 404
    assert "error" in missing.json()
    bad = httpx.post(f"{stack.url}/ask", json={"question": ""}, headers=STAFF, timeout=30)
    assert bad.status_code == 422
    assert "question" in bad.json()["error"]["message"]


def test_ingest_is_admin_only_and_runs_as_a_ray_job(stack: Stack) -> None:
    denied = httpx.post(f"{stack.url}/ingest", json={}, headers=STAFF, timeout=30)
    assert denied.status_code == 403
    started = httpx.post(f"{stack.url}/ingest", json={}, headers=ADMIN, timeout=60)
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    deadline = time.monotonic() + 300
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = httpx.get(f"{stack.url}/ingest/{run_id}", headers=ADMIN, timeout=30).json()
        if status["status"] in {"succeeded", "failed", "stopped"}:
            break
        time.sleep(0.5)
    assert status["status"] == "succeeded", status
    assert status["counts"]["new"] + status["counts"]["unchanged"] == 1
    assert status["progress"]["done"] == status["progress"]["total"]
    unknown = httpx.get(f"{stack.url}/ingest/ingest-000000000000", headers=ADMIN, timeout=30)
    assert unknown.status_code == 404


def test_readyz_fails_while_the_database_is_down(stack: Stack) -> None:
    from foundation.database import start_embedded, stop_embedded
    from tests.conftest import TEST_HOME

    assert httpx.get(f"{stack.url}/readyz", timeout=30).status_code == 200
    stop_embedded(TEST_HOME)
    try:
        down = httpx.get(f"{stack.url}/readyz", timeout=30)
        assert down.status_code == 503
        checks = {c["name"]: c for c in down.json()["checks"]}
        assert checks["database"]["ok"] is False
    finally:
        start_embedded(TEST_HOME)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(f"{stack.url}/readyz", timeout=30).status_code == 200:
            break
        time.sleep(0.25)
    else:
        pytest.fail("/readyz did not recover after the database came back")


def test_a_run_past_the_deadline_is_a_504_envelope(stack: Stack) -> None:
    question = "A question the model takes too long over"
    stack.llm.script({"text": "too late", "delay_ms": 12_000}, key=question)
    resp = httpx.post(f"{stack.url}/ask", json={"question": question}, headers=STAFF, timeout=60)
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "timeout"


def test_a_stream_past_the_deadline_ends_with_a_timeout_event(stack: Stack) -> None:
    question = "A streamed question the model takes too long over"
    stack.llm.script({"text": "too late", "delay_ms": 12_000}, key=question)
    started = time.monotonic()
    events = _streamed_ask(stack, question)
    assert time.monotonic() - started < 11.0  # the deadline (8 s), not the model (12 s)
    assert events[-1][0] == "error" and events[-1][1]["error"]["code"] == "timeout", events
    assert "done" not in [kind for kind, _, _ in events]


EVAL_ROWS = """
version: 1
defaults:
  as: {sub: eval-staff, roles: [business_staff], domains: [northwind]}
rows:
  - id: doc-cooldown
    question: "How often do alerts repeat? (eval)"
    tools_called: {all: [search_docs]}
    tool_args: {search_docs: {query: "ALERT cooldown"}}
    cited_sources: [SOURCE]
    keywords: {any: [cooldown]}
    decision: answered
  - id: live-harbor
    question: "What is Harbor Warehouse? (eval)"
    tools_called: {all: [get_building]}
    tool_args: {get_building: {building_id: bld-northwind-harbor}}
    keywords: {all: [harbor warehouse]}
    declined: false
  - id: offtopic-poem
    question: "Write me a poem about cats (eval)"
    tools_called: {none: true}
    decision: declined_out_of_scope
    declined: true
  - id: idk-dark-mode
    question: "Is there a dark mode? (eval)"
    idk: true
    xfail: {models: ["*scripted"], reason: "the scripted model guesses instead of saying IDK"}
  - id: fixed-gap
    question: "Which city is Harbor Warehouse in? (eval)"
    tools_called: {any: [get_building]}
    xfail: {models: ["*scripted"], reason: "was a gap; the marker is stale now"}
"""


def test_eval_runner_scores_the_running_app_with_a_scripted_judge(
    stack: Stack, sample_docs_url: str, tmp_path: Path
) -> None:
    from xml.etree import ElementTree

    from serve_app.cli import main

    chunk_id = chunk_id_for(sample_docs_url, "Cooldown: how often")
    source = _source_of(sample_docs_url, chunk_id)
    dataset = tmp_path / "subset.yaml"
    dataset.write_text(EVAL_ROWS.replace("SOURCE", source))
    loop = {"mode": "loop"}
    stack.llm.script(
        {"tool_calls": [{"name": "search_docs", "arguments": {"query": "alert cooldown"}}]},
        {"text": f"Alerts repeat at most once per cooldown [^{chunk_id}]."},
        key="How often do alerts repeat? (eval)",
        **loop,
    )
    building = {"name": "get_building", "arguments": {"building_id": "bld-northwind-harbor"}}
    stack.llm.script(
        {"tool_calls": [building]},
        {"text": "Harbor Warehouse is Northwind's warehouse."},
        key="What is Harbor Warehouse? (eval)",
        **loop,
    )
    stack.llm.script(
        {"text": "I can only help with CrowdVision: buildings, rooms, occupancy and sensors."},
        key="Write me a poem about cats (eval)",
        **loop,
    )
    stack.llm.script(
        {"text": "Yes, there is a dark mode."}, key="Is there a dark mode? (eval)", **loop
    )
    stack.llm.script(
        {"tool_calls": [building]},
        {"text": "It is in the harbour district."},
        key="Which city is Harbor Warehouse in? (eval)",
        **loop,
    )
    judge = ScriptedLLM()
    judge.script(
        {"text": json.dumps({"pass": True, "score": 1.0, "reason": "It answered."})},
        mode="loop",
    )
    with run_in_thread(create_llm_app(judge)) as judge_url:
        env = {
            "EVAL_JWT_SECRET": EVAL_SECRET,
            "JUDGE_BASE_URL": f"{judge_url}/v1",
            "JUDGE_MODEL": "other-family/judge",
            "LLM_API_KEY": "test-key",
            "ANSWER_MODEL": "local/scripted",
        }
        # the rows name no split (test, like any row nobody put on dev): run them all
        base = ["eval", str(dataset), "--base-url", stack.url, "--quiet", "--split", "all"]
        with scoped_environ(env):
            code = main([*base, "--out-dir", str(tmp_path / "lenient")])
            strict = main([*base, "--out-dir", str(tmp_path / "strict"), "--strict"])
    assert (code, strict) == (0, 1)  # the stale XPASS marker fails only under --strict

    report = (tmp_path / "lenient" / "report.md").read_text()
    statuses = {
        case.get("name"): (
            "fail"
            if case.find("failure") is not None
            else "skip"
            if case.find("skipped") is not None
            else "pass"
        )
        for case in ElementTree.parse(tmp_path / "lenient" / "junit.xml").iter("testcase")
    }
    assert statuses == {
        "doc-cooldown": "pass",
        "live-harbor": "pass",
        "offtopic-poem": "pass",
        "idk-dark-mode": "skip",  # XFAIL
        "fixed-gap": "pass",  # XPASS (noted, not failed, without --strict)
    }, statuses
    assert "XFAIL" in report and "XPASS" in report
    # live-harbor's `declined: false`, once per run; offtopic-poem's `declined: true` is
    # settled by the service's own decision and never reaches the judge
    assert len(judge.chat_requests()) == 2


def _source_of(sample_docs_url: str, chunk_id: str) -> str:
    import asyncio

    import asyncpg

    async def find() -> str:
        conn = await asyncpg.connect(sample_docs_url)
        try:
            value: str = await conn.fetchval(
                "SELECT d.source FROM chunks c JOIN documents d ON d.id = c.document_id "
                "WHERE c.id = $1",
                chunk_id,
            )
            return value
        finally:
            await conn.close()

    return asyncio.run(find())
