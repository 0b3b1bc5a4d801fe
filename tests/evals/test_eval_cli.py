"""``agent-service eval``: the exit-code contract end to end through the real CLI entry
point, against the fake service over HTTP."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, main
from tests.evals.eval_helpers import SECRET, FakeService, answer, call, fake_service, write_dataset

DATASET = """
version: 1
split: dev
rows:
  - id: ok
    question: "What is CV-E1033?"
    keywords: {any: [sensor]}
    tags: [doc]
  - id: gap
    question: "How busy is the lobby?"
    tools_called: {all: [get_room_occupancy]}
    xfail: {models: [local/scripted], reason: "the model does not call the tool yet"}
    tags: [live]
  - id: poem
    question: "Write a poem"
    declined: true
    tags: [scope]
"""


@pytest.fixture
def service() -> FakeService:
    svc = FakeService()
    svc.reply("What is CV-E1033?", answer("A sensor went offline."))
    svc.reply("How busy is the lobby?", answer("Busy, I think."))
    svc.reply(
        "Write a poem",
        answer("I can only help with CrowdVision.", decision="declined_out_of_scope"),
    )
    return svc


@pytest.fixture
def url(service: FakeService, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("EVAL_JWT_SECRET", SECRET)
    with fake_service(service) as base_url:
        yield base_url


def run(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["eval", *args, "--quiet"], out=out)
    return code, out.getvalue()


def test_all_pass_with_xfail_exits_0_and_writes_reports(url: str, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path, DATASET)
    code, out = run(
        [str(dataset), "--base-url", url, "--out-dir", str(tmp_path / "r"), "--no-judge"]
    )
    assert code == EXIT_OK, out
    assert "3 rows: 2 PASS, 1 XFAIL" in out
    root = ET.parse(tmp_path / "r" / "junit.xml").getroot()
    assert len(root.findall("testsuite/testcase")) == 3
    assert len(root.findall("testsuite/testcase/skipped")) == 1
    report = (tmp_path / "r" / "report.md").read_text()
    assert "- `gap` (xfail for local/scripted): the model does not call the tool yet" in report
    assert "- Judge model: none" in report


def test_xpass_exits_0_but_1_with_strict(
    url: str, service: FakeService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service.reply(
        "How busy is the lobby?",
        answer("12 people.", tool_calls=[call("get_room_occupancy", room_id="room-nwhq-lobby")]),
    )
    dataset = write_dataset(tmp_path, DATASET)
    common = [str(dataset), "--base-url", url, "--out-dir", str(tmp_path), "--no-judge"]
    code, out = run(common)
    assert code == EXIT_OK
    assert "XPASS gap: marked xfail (the model does not call the tool yet) but passes" in out
    junit = tmp_path / "strict.xml"
    code, out = run([*common, "--strict", "--junit", str(junit)])
    assert code == EXIT_FAILURE
    assert "fails the run (--strict)" in out
    assert ET.parse(junit).getroot().find("testsuite").get("failures") == "1"  # type: ignore[union-attr]


def test_a_failure_exits_1(url: str, service: FakeService, tmp_path: Path) -> None:
    service.reply("What is CV-E1033?", answer("No idea."))
    dataset = write_dataset(tmp_path, DATASET)
    code, out = run([str(dataset), "--base-url", url, "--out-dir", str(tmp_path), "--no-judge"])
    assert code == EXIT_FAILURE
    assert "keywords.any" in out


def test_only_and_tag_select_rows(url: str, service: FakeService, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path, DATASET)
    common = [str(dataset), "--base-url", url, "--out-dir", str(tmp_path)]
    assert run([*common, "--only", "ok"])[0] == EXIT_OK
    assert [a["question"] for a in service.asked] == ["What is CV-E1033?"]
    assert run([*common, "--tag", "live,doc"])[0] == EXIT_OK
    assert len(service.asked) == 3


def test_judged_rows_need_a_judge_key_or_no_judge(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLM_BASE_URL", "https://openrouter.ai/api/v1")
    for name in ("OPENROUTER_API_KEY", "LLM_API_KEY", "DEEPSEEK_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    dataset = write_dataset(tmp_path, DATASET)
    code, _ = run([str(dataset), "--base-url", url, "--out-dir", str(tmp_path)])
    assert code == EXIT_USAGE
    assert "the judge at https://openrouter.ai/api/v1 needs an API key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "a", "--models", "b,c"], "give --model or --models, not both"),
        (["--retrieval", "--models", "a,b"], "--retrieval involves no model"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--only", "nope"], "--only: no row with id 'nope'"),
    ],
)
def test_usage_errors_exit_2(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    dataset = write_dataset(tmp_path, DATASET)
    code, _ = run([str(dataset), "--base-url", url, "--out-dir", str(tmp_path), *args])
    assert code == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_a_bad_dataset_exits_2_naming_file_row_and_field(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_dataset(tmp_path, "version: 1\nrows:\n  - {id: a, question: q, xfail: true}\n")
    code, _ = run([str(bad), "--base-url", url, "--out-dir", str(tmp_path)])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{bad}: row 1 (id 'a'): xfail: give the models it is about and a reason" in err
    missing = tmp_path / "missing.yaml"
    assert run([str(missing), "--base-url", url])[0] == EXIT_USAGE
    assert f"{missing}: no such file" in capsys.readouterr().err


def test_missing_secret_exits_2(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("EVAL_JWT_SECRET")
    dataset = write_dataset(tmp_path, DATASET)
    code, _ = run([str(dataset), "--base-url", url, "--out-dir", str(tmp_path), "--no-judge"])
    assert code == EXIT_USAGE
    assert "EVAL_JWT_SECRET is not set" in capsys.readouterr().err


def test_an_unreachable_service_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EVAL_JWT_SECRET", SECRET)
    with fake_service(FakeService()) as gone:
        pass
    dataset = write_dataset(tmp_path, DATASET)
    code, _ = run([str(dataset), "--base-url", gone, "--out-dir", str(tmp_path), "--no-judge"])
    assert code == EXIT_USAGE
    assert f"could not reach the service at {gone}" in capsys.readouterr().err


FROZEN = """
version: 1
rows:
  - id: frozen
    question: "How busy is the cafeteria?"
    keywords: {any: [busy]}
    tags: [live, "world:second"]
"""


def test_split_selects_the_rows_and_the_report_says_which_ran(
    url: str, service: FakeService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service.reply("How busy is the cafeteria?", answer("It is busy."))
    dev = write_dataset(tmp_path, DATASET)
    test = write_dataset(tmp_path, FROZEN, "test.yaml")
    common = [str(dev), str(test), "--base-url", url, "--no-judge"]

    code, out = run([*common, "--out-dir", str(tmp_path / "dev")])  # the default: dev
    assert code == EXIT_OK, out
    assert "How busy is the cafeteria?" not in [a["question"] for a in service.asked]
    assert "split dev: 3 rows (golden.yaml 3, test.yaml 0) of 4 in the files" in out
    assert (
        "- Split: dev: rules, thresholds and prompts may be fitted"
        in (tmp_path / "dev" / "report.md").read_text()
    )

    service.asked.clear()
    code, out = run([*common, "--split", "test", "--out-dir", str(tmp_path / "test")])
    assert code == EXIT_OK, out
    assert [a["question"] for a in service.asked] == ["How busy is the cafeteria?"]
    assert "split test: 1 row (golden.yaml 0, test.yaml 1) of 4 in the files" in out
    report = (tmp_path / "test" / "report.md").read_text()
    assert "- Split: test: frozen rows, not read while changing the agent; the run of record" in (
        report
    )
    assert "| test | second | 1 | 1 | 100.0% |" in report

    service.asked.clear()
    code, out = run([*common, "--split", "all", "--world", "sample", "--out-dir", str(tmp_path)])
    assert code == EXIT_OK, out
    assert len(service.asked) == 3  # the second world's row left out
    assert "split all: 3 rows (golden.yaml 3, test.yaml 0) of 4 in the files; worlds sample" in out

    code, _ = run([*common, "--only", "frozen", "--out-dir", str(tmp_path)])
    assert code == EXIT_USAGE
    assert "--only: row 'frozen' is on the test split, not dev" in capsys.readouterr().err


def test_a_rescore_keeps_the_saved_runs_split(
    url: str, service: FakeService, tmp_path: Path
) -> None:
    service.reply("How busy is the cafeteria?", answer("It is busy."))
    dev = write_dataset(tmp_path, DATASET)
    test = write_dataset(tmp_path, FROZEN, "test.yaml")
    saved = tmp_path / "saved"
    args = [str(dev), str(test), "--base-url", url, "--no-judge", "--split", "test"]
    assert run([*args, "--out-dir", str(saved)])[0] == EXIT_OK
    responses = saved / "responses.jsonl"
    code, out = run([str(dev), str(test), "--rescore", str(responses), "--out-dir", str(tmp_path)])
    assert code == EXIT_OK, out
    assert "split test: 1 row (golden.yaml 0, test.yaml 1)" in out
    rescore = [str(dev), str(test), "--rescore", str(responses)]
    code, out = run([*rescore, "--split", "all", "--out-dir", str(tmp_path / "all")])
    assert code == EXIT_FAILURE  # the dev rows were never asked in the saved run: ERROR
    assert "split all: 4 rows" in out
