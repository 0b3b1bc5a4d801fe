"""The judge, against the real scripted OpenAI-compatible server over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from evals.dataset import Row
from evals.judge import (
    ANSWERED_RUBRIC,
    Judge,
    JudgeConfig,
    model_family,
    parse_verdict,
    same_family,
)
from foundation.settings import SettingsError
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.servers import run_in_thread
from serve_app.wiring import judge_config
from tests.evals.eval_helpers import settings


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[str, ScriptedLLM]]:
    llm = ScriptedLLM()
    with run_in_thread(create_llm_app(llm)) as url:
        yield url, llm


@pytest.fixture
def llm(scripted: tuple[str, ScriptedLLM]) -> ScriptedLLM:
    scripted[1].reset()
    return scripted[1]


def make_judge(scripted: tuple[str, ScriptedLLM], model: str = "google/gemini-2.5-flash") -> Judge:
    config = JudgeConfig(model=model, base_url=f"{scripted[0]}/v1", api_key="k", max_retries=0)
    return config.build()


def verdict(passed: bool, score: float = 1.0, reason: str = "ok") -> dict[str, object]:
    return {"text": json.dumps({"pass": passed, "score": score, "reason": reason})}


async def test_a_verdict_over_http_with_a_json_schema_response_format(
    scripted: tuple[str, ScriptedLLM], llm: ScriptedLLM
) -> None:
    llm.script(
        {**verdict(True, 0.8, "It states the cooldown."), "usage": {"prompt_tokens": 120}},
        key="How long is the cooldown?",
    )
    judge = make_judge(scripted)
    try:
        outcome = await judge.grade(
            question="How long is the cooldown?", answer="10 minutes.", rubric="States it."
        )
    finally:
        await judge.aclose()
    assert outcome.verdict is not None and outcome.error is None
    assert (outcome.verdict.passed, outcome.verdict.score) == (True, 0.8)
    assert outcome.verdict.reason == "It states the cooldown."
    (request,) = llm.chat_requests()
    body = request.body
    assert body["model"] == "google/gemini-2.5-flash"
    assert body["temperature"] == 0.0
    assert body["response_format"]["type"] == "json_schema"
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["reason", "pass", "score"]
    assert list(schema["properties"]) == ["reason", "pass", "score"]  # the reason first
    assert "10 minutes." in body["messages"][1]["content"]
    assert judge.stats.calls == 1 and judge.stats.input_tokens == 120
    assert judge.stats.estimated_usd is not None and judge.stats.estimated_usd > 0


async def test_a_malformed_verdict_is_retried_once(
    scripted: tuple[str, ScriptedLLM], llm: ScriptedLLM
) -> None:
    llm.script({"text": "Sure! The answer looks fine."}, verdict(False, 0.2, "No."), key="Q1")
    judge = make_judge(scripted)
    try:
        outcome = await judge.grade(question="Q1", answer="a", rubric="r")
    finally:
        await judge.aclose()
    assert outcome.verdict is not None and outcome.verdict.passed is False
    assert judge.stats.calls == 2 and judge.stats.failures == 0


async def test_two_malformed_verdicts_fail_with_evidence(
    scripted: tuple[str, ScriptedLLM], llm: ScriptedLLM
) -> None:
    llm.script(
        {"text": '{"pass": "yes", "score": 3, "reason": "x"}'},
        {"fault": "malformed"},
        key="Q2",
    )
    judge = make_judge(scripted)
    try:
        outcome = await judge.grade(question="Q2", answer="a", rubric="r")
    finally:
        await judge.aclose()
    assert outcome.verdict is None
    assert outcome.error is not None and outcome.error.startswith("judge reply unusable: ")
    assert judge.stats.calls == 2 and judge.stats.failures == 1
    assert llm.remaining("Q2") == 0


async def test_a_provider_refusing_the_response_format_is_asked_by_prompt(
    scripted: tuple[str, ScriptedLLM], llm: ScriptedLLM
) -> None:
    llm.script(
        {"fault": "server_error", "status": 400, "message": "response_format not supported"},
        verdict(True),
        key="Q3",
    )
    judge = make_judge(scripted)
    try:
        outcome = await judge.grade(question="Q3", answer="a", rubric="r")
    finally:
        await judge.aclose()
    assert outcome.verdict is not None and outcome.verdict.passed
    first, second = llm.chat_requests("Q3")
    assert "response_format" in first.body and "response_format" not in second.body


async def test_a_provider_failure_fails_the_expectation(
    scripted: tuple[str, ScriptedLLM], llm: ScriptedLLM
) -> None:
    llm.script({"fault": "server_error", "status": 503, "retry": False}, key="Q4")
    judge = make_judge(scripted)
    try:
        outcome = await judge.grade(question="Q4", answer="a", rubric="r")
    finally:
        await judge.aclose()
    assert outcome.verdict is None
    assert outcome.error is not None and outcome.error.startswith("judge call failed: ")


async def test_grade_row_grades_declined_and_rubric(
    scripted: tuple[str, ScriptedLLM], llm: ScriptedLLM
) -> None:
    llm.script(verdict(True, 1, "Engaged."), verdict(False, 0.3, "Too rude."), key="poem please")
    row = Row.model_validate(
        {"id": "p", "question": "poem please", "declined": False, "rubric": "Politely."}
    )
    judge = make_judge(scripted)
    try:
        outcomes = await judge.grade_row(row, "I can only help with CrowdVision.")
    finally:
        await judge.aclose()
    assert outcomes["declined"].verdict is not None and outcomes["declined"].verdict.passed
    assert outcomes["rubric"].verdict is not None and not outcomes["rubric"].verdict.passed
    declined_request = llm.chat_requests("poem please")[0].body["messages"][1]["content"]
    assert ANSWERED_RUBRIC in declined_request


async def test_a_decline_is_not_judged(scripted: tuple[str, ScriptedLLM], llm: ScriptedLLM) -> None:
    """declined: true is the service's own decision and fixed sentence: no judge call."""
    row = Row.model_validate({"id": "p", "question": "poem please", "declined": True})
    judge = make_judge(scripted)
    try:
        assert await judge.grade_row(row, "I can only help with CrowdVision.") == {}
    finally:
        await judge.aclose()
    assert llm.chat_requests("poem please") == []


@pytest.mark.parametrize(
    ("text", "passed"),
    [
        ('{"pass": true, "score": 1, "reason": "r"}', True),
        ('```json\n{"pass": false, "score": 0.0, "reason": "r"}\n```', False),
        ('Verdict: {"pass": true, "score": 0.5, "reason": "r"} done', True),
    ],
)
def test_parse_verdict_accepts_fenced_and_wrapped_json(text: str, passed: bool) -> None:
    assert parse_verdict(text).passed is passed


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty reply"),
        ("no json here", "no JSON object"),
        ('{"pass": true, "score": 2, "reason": "r"}', "score"),
        ('{"pass": true, "reason": "r"}', "score: Field required"),
        ('{"pass": "true", "score": 1, "reason": "r"}', "pass"),
    ],
)
def test_parse_verdict_rejects(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_verdict(text)


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("google/gemini-2.5-flash", "google"),
        ("gemini-2.5-pro", "google"),
        ("openai/gpt-4o-mini", "openai"),
        ("gpt-4o", "openai"),
        ("qwen2.5-coder-1.5b-instruct", "qwen"),
        ("qwen/qwen-2.5-72b-instruct", "qwen"),
        ("local/qwen2.5-0.5b", "qwen"),
        ("anthropic/claude-3.5-sonnet:beta", "anthropic"),
        ("claude-3-haiku", "anthropic"),
        ("meta-llama/llama-3.1-8b-instruct", "meta"),
        ("llama-3", "meta"),
        ("local/scripted", "scripted"),
    ],
)
def test_model_family(model: str, family: str) -> None:
    assert model_family(model) == family


def test_same_family_warning() -> None:
    assert same_family("google/gemini-2.5-flash", ["openai/gpt-4o-mini"]) is None
    warning = same_family("qwen2.5-coder-1.5b-instruct", ["local/qwen2.5-0.5b", "gpt-4o"])
    assert warning is not None
    # a local judge is fine to use, but the bias is said in so many words
    assert warning.startswith(
        "judge is the same family as the answered model: grades are biased (judge "
        "qwen2.5-coder-1.5b-instruct, answer model local/qwen2.5-0.5b: both qwen;"
    )
    assert "gpt-4o" not in warning


def test_judge_config_from_settings(tmp_path: Path) -> None:
    local = settings(tmp_path, llm_base_url="http://127.0.0.1:8000/llm/v1")
    config = judge_config(local)
    assert (config.model, config.base_url) == (local.judge_model, local.llm_base_url)
    remote = settings(
        tmp_path,
        llm_base_url="https://openrouter.ai/api/v1",
        judge_base_url="http://127.0.0.1:9/v1",
        judge_model="openai/gpt-4o-mini",
        llm_api_key="sk-test",
    )
    config = judge_config(remote)
    assert (config.model, config.base_url, config.api_key) == (
        "openai/gpt-4o-mini",
        "http://127.0.0.1:9/v1",
        "sk-test",
    )
    with pytest.raises(SettingsError, match="OPENROUTER_API_KEY is not set"):
        judge_config(settings(tmp_path, llm_base_url="https://openrouter.ai/api/v1"))
