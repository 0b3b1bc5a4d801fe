"""The runner against a tiny real-HTTP fake of the service: statuses, the exit-code
contract, tokens minted per row, bounded concurrency, and the fail-fast checks."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from evals.dataset import Dataset, load_dataset
from evals.runner import EvalConfigError, EvalRun, Status, exit_code, run_eval
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.servers import run_in_thread
from tests.evals.eval_helpers import (
    FakeService,
    answer,
    call,
    citation,
    fake_service,
    settings,
    write_dataset,
)

DATASET = """
version: 1
defaults:
  as: {sub: eval-user, roles: [business_staff], domains: [acme]}
rows:
  - id: passes
    question: "How long is the alert cooldown?"
    tools_called: {all: [search_docs]}
    cited_sources: [documentation/user/occupancy-alerts.md]
    keywords: {all: ["10 minutes"]}
  - id: known-gap
    question: "Which room is busiest right now?"
    as: {sub: nina, roles: [business_admin], domains: [northwind]}
    tools_called: {any: [get_room_occupancy]}
    xfail: "the model guesses instead of calling the occupancy tool"
"""


def good_answers(service: FakeService) -> None:
    service.reply(
        "How long is the alert cooldown?",
        answer(
            "The cooldown is 10 minutes [^c1].",
            tool_calls=[call("search_docs", query="alert cooldown")],
            citations=[citation("documentation/user/occupancy-alerts.md")],
            usage={"input_tokens": 900, "output_tokens": 40, "hops": []},
            cost={"estimated_usd": 0.0002, "provider_usd": 0.00025},
        ),
    )
    service.reply(
        "Which room is busiest right now?",
        answer("Probably the lobby.", usage={"input_tokens": 500, "output_tokens": 9, "hops": []}),
    )


@pytest.fixture
def service() -> FakeService:
    svc = FakeService()
    good_answers(svc)
    return svc


@pytest.fixture
def url(service: FakeService) -> Iterator[str]:
    with fake_service(service) as base_url:
        yield base_url


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    return load_dataset(write_dataset(tmp_path, DATASET))


def quiet() -> Console:
    return Console(file=io.StringIO())


async def run(dataset: Dataset, url: str, tmp_path: Path, **kwargs: object) -> EvalRun:
    return await run_eval(
        dataset,
        url,
        settings(tmp_path),
        progress=False,
        console=quiet(),
        **kwargs,  # type: ignore[arg-type]
    )


async def test_pass_and_xfail_exit_0(
    dataset: Dataset, url: str, service: FakeService, tmp_path: Path
) -> None:
    result = await run(dataset, url, tmp_path)
    assert [(r.id, r.status) for r in result.results] == [
        ("passes", Status.PASS),
        ("known-gap", Status.XFAIL),
    ]
    assert exit_code(result) == 0 and exit_code(result, strict=True) == 0
    first = result.results[0]
    assert (first.input_tokens, first.output_tokens, first.cost_usd) == (900, 40, 0.00025)
    assert first.latency_ms is not None and first.latency_ms > 0
    assert first.http_status == 200 and first.model == "local/scripted"
    assert result.counts[Status.PASS] == 1 and result.pass_rate == 0.5
    # each row asked as its own user, with an HS256 token the fake verified
    assert sorted((a["sub"], a["roles"], a["domains"]) for a in service.asked) == [
        ("eval-user", ("business_staff",), ("acme",)),
        ("nina", ("business_admin",), ("northwind",)),
    ]
    assert all("model" not in a for a in service.asked)


async def test_a_fixed_xfail_row_is_xpass_and_fails_only_under_strict(
    dataset: Dataset, url: str, service: FakeService, tmp_path: Path
) -> None:
    service.reply(
        "Which room is busiest right now?",
        answer("The Boardroom.", tool_calls=[call("get_room_occupancy", room_id="r")]),
    )
    result = await run(dataset, url, tmp_path, model="local/other")
    assert [r.status for r in result.results] == [Status.PASS, Status.XPASS]
    assert exit_code(result) == 0
    assert exit_code(result, strict=True) == 1
    assert [a["model"] for a in service.asked] == ["local/other", "local/other"]


async def test_a_failing_row_exits_1_with_evidence(
    dataset: Dataset, url: str, service: FakeService, tmp_path: Path
) -> None:
    service.reply("How long is the alert cooldown?", answer("I am not sure."))
    result = await run(dataset, url, tmp_path)
    failing = result.results[0]
    assert failing.status is Status.FAIL
    assert [a.name for a in failing.failed_assertions] == [
        "tools_called.all",
        "cited_sources",
        "keywords.all",
    ]
    assert failing.failed_assertions[2].evidence == "answer lacks [10 minutes]"
    assert exit_code(result) == 1


async def test_an_error_envelope_is_an_error_row_not_a_crash(
    dataset: Dataset, url: str, service: FakeService, tmp_path: Path
) -> None:
    service.reply(
        "How long is the alert cooldown?",
        {"error": {"code": "overloaded", "message": "too many requests"}},
        status=429,
    )
    result = await run(dataset, url, tmp_path)
    errored = result.results[0]
    assert errored.status is Status.ERROR and errored.http_status == 429
    assert errored.error is not None and errored.error.startswith("HTTP 429: ")
    assert "too many requests" in errored.error
    assert exit_code(result) == 1


async def test_an_xfail_row_that_errors_is_xfail_with_the_error_as_evidence(
    dataset: Dataset, url: str, service: FakeService, tmp_path: Path
) -> None:
    service.reply(
        "Which room is busiest right now?",
        {"error": {"code": "timeout", "message": "no answer within 170 s; try again"}},
        status=504,
    )
    result = await run(dataset, url, tmp_path)
    gap = result.results[1]
    assert (gap.id, gap.status, gap.http_status) == ("known-gap", Status.XFAIL, 504)
    assert gap.error is not None and "no answer within 170 s" in gap.error
    assert exit_code(result) == 0


async def test_a_provider_error_answer_is_scored(
    tmp_path: Path, url: str, service: FakeService
) -> None:
    service.reply(
        "Is the provider down?",
        answer(
            "",
            decision="provider_error",
            error={"code": "provider_unavailable", "message": "down", "status_code": 503},
        ),
        status=503,
    )
    text = "version: 1\nrows:\n  - {id: down, question: 'Is the provider down?', "
    rows = load_dataset(write_dataset(tmp_path, text + "decision: provider_error}\n"))
    assert (await run(rows, url, tmp_path)).results[0].status is Status.PASS
    rows = load_dataset(write_dataset(tmp_path, text + "idk: false}\n"))
    failed = (await run(rows, url, tmp_path)).results[0]
    assert failed.status is Status.FAIL
    assert [a.name for a in failed.failed_assertions] == ["http_status"]


async def test_concurrency_is_bounded(tmp_path: Path, url: str, service: FakeService) -> None:
    rows = "".join(f"  - {{id: r{i}, question: q{i}, idk: false}}\n" for i in range(8))
    for i in range(8):
        service.reply(f"q{i}", answer())
    service.delay_s = 0.1
    dataset = load_dataset(write_dataset(tmp_path, "version: 1\nrows:\n" + rows))
    result = await run(dataset, url, tmp_path, concurrency=3)
    assert [r.id for r in result.results] == [f"r{i}" for i in range(8)]  # dataset order
    assert all(r.status is Status.PASS for r in result.results)
    assert service.max_in_flight == 3


async def test_judged_rows_without_a_judge_are_skipped_not_failed(
    tmp_path: Path, url: str, service: FakeService
) -> None:
    service.reply("Write a poem", answer("I only help with CrowdVision.", decision="answered"))
    dataset = load_dataset(
        write_dataset(
            tmp_path,
            "version: 1\nrows:\n  - {id: poem, question: Write a poem, declined: true}\n",
        )
    )
    result = await run(dataset, url, tmp_path)
    (row,) = result.results
    assert row.status is Status.PASS
    assert [a.name for a in row.skipped_assertions] == ["declined"]


async def test_with_a_scripted_judge(tmp_path: Path, url: str, service: FakeService) -> None:
    from evals.judge import JudgeConfig

    service.reply("Write a poem", answer("Roses are red.", model="qwen2.5-coder-1.5b-instruct"))
    dataset = load_dataset(
        write_dataset(
            tmp_path,
            "version: 1\nrows:\n  - {id: poem, question: Write a poem, declined: true}\n",
        )
    )
    llm = ScriptedLLM()
    llm.script({"text": '{"pass": false, "score": 0, "reason": "It wrote a poem."}'})
    with run_in_thread(create_llm_app(llm)) as llm_url:
        judge = JudgeConfig("qwen/qwen-2.5-72b-instruct", f"{llm_url}/v1", "k").build()
        try:
            result = await run(dataset, url, tmp_path, judge=judge)
        finally:
            await judge.aclose()
    (row,) = result.results
    assert row.status is Status.FAIL
    assert row.failed_assertions[0].evidence == "judge fail (score 0.00): It wrote a poem."
    assert result.judge is not None and result.judge.calls == 1
    assert result.judge_model == "qwen/qwen-2.5-72b-instruct"
    # the answer came from a qwen model: the judge's family matches, and that is said
    assert any("same family (qwen)" in w for w in result.warnings)


async def test_missing_secret_is_a_config_error(dataset: Dataset, url: str, tmp_path: Path) -> None:
    with pytest.raises(EvalConfigError, match="EVAL_JWT_SECRET is not set"):
        await run_eval(dataset, url, settings(tmp_path, eval_jwt_secret=None), progress=False)


async def test_an_unreachable_service_is_a_config_error(dataset: Dataset, tmp_path: Path) -> None:
    with fake_service(FakeService()) as gone:
        pass  # stopped: nothing listens there any more
    with pytest.raises(EvalConfigError, match=r"could not reach the service at .*is it running"):
        await run(dataset, gone, tmp_path)


async def test_a_service_not_ready_is_a_config_error(
    dataset: Dataset, url: str, service: FakeService, tmp_path: Path
) -> None:
    service.ready = False
    with pytest.raises(EvalConfigError, match="not ready: database: unreachable"):
        await run(dataset, url, tmp_path)


async def test_a_refused_token_stops_the_run(dataset: Dataset, url: str, tmp_path: Path) -> None:
    wrong = settings(tmp_path, eval_jwt_secret="another-secret-0123456789abcdef012345")
    with pytest.raises(EvalConfigError, match=r"refused the eval token .*signature does not"):
        await run_eval(dataset, url, wrong, progress=False, console=quiet())


async def test_saved_responses_rescore_against_an_edited_dataset_without_the_service(
    dataset: Dataset, url: str, tmp_path: Path
) -> None:
    from evals.runner import read_responses, rescore, write_responses

    first = await run(dataset, url, tmp_path)
    saved = write_responses(first, tmp_path / "run" / "responses.jsonl")
    assert len(saved.read_text().splitlines()) == 1 + len(first.results)

    # The same answers, scored against the dataset as loaded: same statuses, same figures.
    again = rescore(dataset, read_responses(saved))
    assert [(r.id, r.status) for r in again.results] == [(r.id, r.status) for r in first.results]
    assert again.results[0].input_tokens == 900 and again.results[0].latency_ms is not None

    # Mark the passing row xfail and drop the known gap's marker: XPASS and FAIL, no HTTP.
    edited = DATASET.replace(
        'keywords: {all: ["10 minutes"]}',
        'keywords: {all: ["10 minutes"]}\n    xfail: "now marked"',
    ).replace('    xfail: "the model guesses instead of calling the occupancy tool"\n', "")
    rescored = rescore(
        load_dataset(write_dataset(tmp_path, edited, "b.yaml")), read_responses(saved)
    )
    assert [(r.id, r.status) for r in rescored.results] == [
        ("passes", Status.XPASS),
        ("known-gap", Status.FAIL),
    ]
    # A row the saved run never asked is an ERROR, not a silent pass.
    extra = DATASET + '  - id: new-row\n    question: "New?"\n    idk: true\n'
    grown = rescore(load_dataset(write_dataset(tmp_path, extra, "c.yaml")), read_responses(saved))
    assert grown.results[-1].status is Status.ERROR
    assert grown.results[-1].error == "not in the saved run"
