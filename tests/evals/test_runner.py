"""The runner against a tiny real-HTTP fake of the service: statuses, the exit-code
contract, tokens minted per row, bounded concurrency, and the fail-fast checks."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from agent.answer import AgentAnswer
from evals.dataset import Dataset, load_dataset
from evals.runner import EvalConfigError, EvalRun, Status, exit_code, run_eval
from local_world.scripted_llm import ScriptedLLM, create_llm_app
from local_world.servers import run_in_thread
from serve_app.wiring import eval_config
from tests.evals.eval_helpers import (
    FakeService,
    answer,
    call,
    citation,
    fake_service,
    mock_transport,
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
    xfail: {models: [local/scripted], reason: "the model guesses instead of calling the tool"}
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
        eval_config(settings(tmp_path)),
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


async def test_a_504_on_an_xfail_row_is_an_error_not_xfail(
    dataset: Dataset, url: str, service: FakeService, tmp_path: Path
) -> None:
    service.reply(
        "Which room is busiest right now?",
        {"error": {"code": "timeout", "message": "no answer within 170 s; try again"}},
        status=504,
    )
    result = await run(dataset, url, tmp_path)
    gap = result.results[1]
    # a timeout says nothing about the model's behaviour: the marker cannot hide it
    assert (gap.id, gap.status, gap.http_status) == ("known-gap", Status.ERROR, 504)
    assert gap.error is not None and "no answer within 170 s" in gap.error
    assert exit_code(result) == 1


async def test_a_provider_error_answer_is_scored_only_where_expected(
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
    assert (failed.status, failed.assertions) == (Status.ERROR, [])
    assert failed.error == "HTTP 503: provider_unavailable: down"


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


async def test_without_a_judge_a_rubric_row_is_partial_and_declined_is_still_checked(
    tmp_path: Path, url: str, service: FakeService
) -> None:
    service.reply("Write a poem", answer("I only help with CrowdVision.", decision="answered"))
    text = "version: 1\nrows:\n  - {id: poem, question: Write a poem, "
    rubric = load_dataset(write_dataset(tmp_path, text + "rubric: It declines.}\n"))
    (row,) = (await run(rubric, url, tmp_path)).results
    assert row.status is Status.PARTIAL
    assert [a.name for a in row.skipped_assertions] == ["rubric"]
    # declined needs no judge: the service said "answered", so the row fails
    declined = load_dataset(write_dataset(tmp_path, text + "declined: true}\n", "d.yaml"))
    (row,) = (await run(declined, url, tmp_path)).results
    assert row.status is Status.FAIL and row.skipped_assertions == []
    assert row.failed_assertions[0].name == "declined"


async def test_with_a_scripted_judge(tmp_path: Path, url: str, service: FakeService) -> None:
    from evals.judge import JudgeConfig

    # A refusal written as prose under decision=answered: only the judge catches it.
    refusal = answer("I won't do that.", model="qwen2.5-coder-1.5b-instruct")
    service.reply("Summarise the alerts page", refusal)
    dataset = load_dataset(
        write_dataset(
            tmp_path,
            "version: 1\nrows:\n  - {id: s, question: Summarise the alerts page,"
            " declined: false}\n",
        )
    )
    llm = ScriptedLLM()
    llm.script({"text": '{"pass": false, "score": 0, "reason": "It refused."}'})
    with run_in_thread(create_llm_app(llm)) as llm_url:
        judge = JudgeConfig("qwen/qwen-2.5-72b-instruct", f"{llm_url}/v1", "k").build()
        try:
            result = await run(dataset, url, tmp_path, judge=judge)
        finally:
            await judge.aclose()
    (row,) = result.results
    assert row.status is Status.FAIL
    assert [a.name for a in row.failed_assertions] == ["declined.judge"]
    assert row.failed_assertions[0].evidence == "judge fail (score 0.00): It refused."
    assert result.judge is not None and result.judge.calls == 1
    assert result.judge_model == "qwen/qwen-2.5-72b-instruct"
    # the answer came from a qwen model: the judge's family matches, and that is said
    (warning,) = result.warnings
    assert warning.startswith(
        "judge is the same family as the answered model: grades are biased (judge "
        "qwen/qwen-2.5-72b-instruct, answer model qwen2.5-coder-1.5b-instruct: both qwen"
    )


async def test_missing_secret_is_a_config_error(dataset: Dataset, url: str, tmp_path: Path) -> None:
    with pytest.raises(EvalConfigError, match="EVAL_JWT_SECRET is not set"):
        await run_eval(
            dataset, url, eval_config(settings(tmp_path, eval_jwt_secret=None)), progress=False
        )


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
    wrong = eval_config(settings(tmp_path, eval_jwt_secret="another-secret-0123456789abcdef012345"))
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
        'keywords: {all: ["10 minutes"]}\n    xfail: {models: ["local/*"], reason: now}',
    ).replace(DATASET.splitlines()[-1] + "\n", "")
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


# --- honest scoring, in-process (httpx.MockTransport: no sockets) ---------------------------

SCOPED = """
version: 1
rows:
  - id: gap-of-the-small-one
    question: "Which room is busiest?"
    tools_called: {any: [get_room_occupancy]}
    xfail: {models: [qwen2.5-coder-0.5b-instruct], reason: "the 0.5B guesses"}
  - id: off-topic
    question: "Write a poem"
    tools_called: {none: true}
    forbidden: ["roses are red"]
    decision: declined_out_of_scope
    declined: true
    tags: [off-topic]
  - id: graded
    question: "Summarise the alert docs"
    keywords: {any: [cooldown]}
    rubric: "Says the cooldown is 10 minutes."
    xfail: {models: ["qwen2.5-coder-0.5b-*"], reason: "the 0.5B misses the number"}
"""
DECLINE = "I can only help with CrowdVision."


def scripted(service: FakeService, model: str, *, poem: str = DECLINE) -> None:
    decision = "declined_out_of_scope" if poem == DECLINE else "answered"
    service.reply("Which room is busiest?", answer("The lobby.", model=model))
    service.reply("Write a poem", answer(poem, decision=decision, model=model))
    service.reply("Summarise the alert docs", answer("A cooldown applies.", model=model))


async def mocked(
    tmp_path: Path, service: FakeService, text: str = SCOPED, **kwargs: object
) -> EvalRun:
    dataset = load_dataset(write_dataset(tmp_path, text, "scoped.yaml"))
    return await run_eval(
        dataset,
        "http://eval.invalid",
        eval_config(settings(tmp_path)),
        progress=False,
        console=kwargs.pop("console", quiet()),  # type: ignore[arg-type]
        transport=mock_transport(service),
        **kwargs,  # type: ignore[arg-type]
    )


def statuses(run: EvalRun) -> dict[str, Status]:
    return {r.id: r.status for r in run.results}


@pytest.mark.parametrize(
    ("model", "gap"),
    [
        ("qwen2.5-coder-0.5b-instruct", Status.XFAIL),  # the model the marker names
        ("qwen2.5-coder-1.5b-instruct", Status.FAIL),  # its gap is not hidden for the 1.5B
        ("openai/gpt-4o-mini", Status.FAIL),  # nor for a real provider
    ],
)
async def test_an_xfail_applies_only_to_the_model_that_answered(
    tmp_path: Path, model: str, gap: Status
) -> None:
    service = FakeService()
    scripted(service, model)
    result = await mocked(tmp_path, service)
    row = result.results[0]
    assert row.status is gap
    assert row.xfail == ("the 0.5B guesses" if gap is Status.XFAIL else None)
    assert exit_code(result) == (0 if gap is Status.XFAIL else 1)


async def test_the_requested_model_decides_when_the_answer_names_none(tmp_path: Path) -> None:
    service = FakeService()
    scripted(service, "")
    result = await mocked(tmp_path, service, model="qwen2.5-coder-0.5b-instruct")
    assert result.results[0].status is Status.XFAIL


@pytest.mark.parametrize(
    "reply",
    [
        (504, {"error": {"code": "timeout", "message": "no answer within 170 s"}}),
        # a full answer that came with a 504 is not scored either
        (504, answer("", decision="provider_error", model="qwen2.5-coder-0.5b-instruct")),
    ],
)
async def test_an_xfail_never_hides_a_504(
    tmp_path: Path, reply: tuple[int, AgentAnswer | dict[str, object]]
) -> None:
    service = FakeService()
    scripted(service, "qwen2.5-coder-0.5b-instruct")
    status, body = reply
    service.reply("Which room is busiest?", body, status=status)
    result = await mocked(tmp_path, service)
    row = result.results[0]
    assert (row.status, row.http_status, row.xfail) == (Status.ERROR, 504, None)
    assert row.error is not None and row.error.startswith("HTTP 504: ")
    assert exit_code(result) == 1


async def test_an_xfail_never_hides_a_timeout_or_transport_error(tmp_path: Path) -> None:
    import httpx

    service = FakeService()
    scripted(service, "qwen2.5-coder-0.5b-instruct")
    inner = mock_transport(service)

    def handle(request: httpx.Request) -> httpx.Response:
        if b"busiest" in request.content:
            raise httpx.ReadTimeout("timed out", request=request)
        return inner.handle_request(request)

    dataset = load_dataset(write_dataset(tmp_path, SCOPED, "scoped.yaml"))
    result = await run_eval(
        dataset,
        "http://eval.invalid",
        eval_config(settings(tmp_path)),
        progress=False,
        console=quiet(),
        transport=httpx.MockTransport(handle),
    )
    row = result.results[0]
    assert row.status is Status.ERROR
    assert row.error == "request failed: ReadTimeout: timed out"


async def test_partially_checked_rows_are_counted_apart_from_passes(tmp_path: Path) -> None:
    service = FakeService()
    scripted(service, "qwen2.5-coder-1.5b-instruct")
    service.reply(
        "Which room is busiest?",
        answer("The lobby.", tool_calls=[call("get_room_occupancy", room_id="r")]),
    )
    result = await mocked(tmp_path, service)
    # graded: its keyword held, its rubric had no judge: neither a pass nor a failure
    assert statuses(result) == {
        "gap-of-the-small-one": Status.PASS,
        "off-topic": Status.PASS,
        "graded": Status.PARTIAL,
    }
    assert (result.fully_passed, result.total) == (2, 3)
    assert result.pass_rate == pytest.approx(2 / 3)
    assert exit_code(result) == 0


async def test_an_xfail_row_is_xpass_only_when_fully_checked(tmp_path: Path) -> None:
    service = FakeService()
    scripted(service, "qwen2.5-coder-0.5b-instruct")
    result = await mocked(tmp_path, service)
    # the keyword held but the rubric was not checked: no proof the gap is fixed
    assert result.results[2].status is Status.PARTIAL
    assert result.counts[Status.XPASS] == 0


@pytest.mark.parametrize(
    ("poem", "tools", "expected", "failed"),
    [
        (DECLINE, [], Status.PASS, []),
        # declined after a search: not the clean decline the prompt asks for
        (DECLINE, [call("search_docs", query="p")], Status.FAIL, ["tools_called.none", "declined"]),
        ("Roses are red.", [], Status.FAIL, ["forbidden", "decision", "declined"]),
    ],
)
async def test_off_topic_rows_are_scored_without_a_judge(
    tmp_path: Path, poem: str, tools: list[dict[str, object]], expected: Status, failed: list[str]
) -> None:
    service = FakeService()
    scripted(service, "qwen2.5-coder-1.5b-instruct", poem=poem)
    decision = "declined_out_of_scope" if poem == DECLINE else "answered"
    service.reply("Write a poem", answer(poem, decision=decision, tool_calls=tools))
    row = (await mocked(tmp_path, service)).results[1]
    assert row.status is expected
    assert row.skipped_assertions == []  # fully checked, no judge needed
    assert [a.name for a in row.failed_assertions] == failed


async def test_a_same_family_judge_is_warned_about_loudly(tmp_path: Path) -> None:
    from agent.testing import ScriptedModel, text_reply
    from evals.judge import Judge

    service = FakeService()
    scripted(service, "qwen2.5-coder-1.5b-instruct")
    verdict = '{"pass": true, "score": 1, "reason": "Declined."}'
    replies = [text_reply(verdict, model="qwen2.5-coder-0.5b-instruct") for _ in range(2)]
    judge = Judge(ScriptedModel(*replies), "qwen2.5-coder-0.5b-instruct")
    out = io.StringIO()
    result = await mocked(tmp_path, service, judge=judge, console=Console(file=out, width=300))
    assert "WARNING: judge is the same family as the answered model: grades are biased" in (
        out.getvalue()
    )
    assert result.warnings and result.warnings[0].startswith("judge is the same family")
    # a local judge grades: the rubric is checked, the row no longer partial
    assert result.results[2].status is Status.PASS


async def test_the_judge_grades_after_every_question_is_answered(tmp_path: Path) -> None:
    """A local judge shares the service's model slots: grading while rows are still asked
    would queue the judge's calls with the service's and slow the latencies measured."""
    from agent.llm.base import ChatRequest, ChatResult
    from agent.testing import FunctionModel, text_reply
    from evals.judge import Judge

    service = FakeService()
    scripted(service, "qwen2.5-coder-1.5b-instruct")
    asked_when_graded: list[int] = []

    def verdict(request: ChatRequest) -> ChatResult:
        asked_when_graded.append(len(service.asked))
        return text_reply('{"pass": true, "score": 1, "reason": "ok"}', model="judge-model")

    judge = Judge(FunctionModel(verdict), "judge-model")
    result = await mocked(tmp_path, service, judge=judge, concurrency=2)
    total = len(result.results)
    assert asked_when_graded and set(asked_when_graded) == {total}
    assert result.results[2].status is Status.PASS  # graded, scored, in the dataset's order
    rows = load_dataset(write_dataset(tmp_path, SCOPED, "scoped.yaml")).cases
    assert [r.id for r in result.results] == [case.row.id for case in rows]


# --- who wrote the answer ----------------------------------------------------------------------

COMPOSED_NOTE = "answer composed by the service from the tool results (no model call)"


async def test_each_row_keeps_who_wrote_its_answer_through_a_saved_run(tmp_path: Path) -> None:
    from evals.runner import read_responses, rescore, write_responses

    service = FakeService()
    service.reply("Which room is busiest?", answer("The lobby.", answered_by="service"))
    service.reply("Write a poem", answer(DECLINE, decision="declined_out_of_scope"))
    service.reply("Summarise the alert docs", answer("A cooldown applies."))
    first = await mocked(tmp_path, service)
    by = {r.id: r.answered_by for r in first.results}
    assert by == {"gap-of-the-small-one": "service", "off-topic": "model", "graded": "model"}

    saved = write_responses(first, tmp_path / "run" / "responses.jsonl")
    assert {r.id: r.answered_by for r in read_responses(saved).results} == by
    dataset = load_dataset(write_dataset(tmp_path, SCOPED, "again.yaml"))
    assert {r.id: r.answered_by for r in rescore(dataset, read_responses(saved)).results} == by


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"decision": "answered", "notes": [COMPOSED_NOTE]}, "service"),
        (
            {"decision": "idk", "notes": ["answer replaced by IDK; not in any tool result: 9 °C"]},
            "service",
        ),
        ({"decision": "idk", "notes": ["the model returned an empty answer"]}, "service"),
        ({"decision": "tool_loop_exhausted", "notes": []}, "service"),
        ({"decision": "provider_error", "notes": []}, "service"),
        (
            {"decision": "answered", "notes": ["answer repaired; not in any tool result: 9 °C"]},
            "model",
        ),
        ({"decision": "idk", "notes": ["route: open (no signal)"]}, "model"),
        ({"decision": "declined_out_of_scope"}, "model"),
    ],
)
def test_a_body_saved_before_answered_by_says_who_wrote_it_through_its_notes(
    body: dict[str, object], expected: str
) -> None:
    """responses.jsonl of runs before the field: the service's own notes tell."""
    from evals.runner import legacy_answered_by, parse_answer

    full = {"answer": "x", "model": "local/scripted", **body}
    assert legacy_answered_by(full) == expected
    assert parse_answer(full).answered_by == expected
    # a body that says it is taken at its word
    assert parse_answer({**full, "answered_by": "model"}).answered_by == "model"


def test_the_committed_record_runs_read_back_with_the_composed_rows_as_the_services() -> None:
    """The 2026-12-05 golden run of record: 39 of its rows were composed (issue 42)."""
    from evals.runner import read_responses

    saved = Path(__file__).resolve().parents[2] / "evals/reports/2026-12-05-qwen1.5b-c1"
    run = read_responses(saved / "responses.jsonl")
    composed = [
        r for r in run.results if r.response and COMPOSED_NOTE in (r.response.get("notes") or [])
    ]
    assert len(composed) == 39 and all(r.answered_by == "service" for r in composed)
    assert {r.answered_by for r in run.results if r.response} == {"model", "service"}
