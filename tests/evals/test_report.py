"""JUnit XML (valid, counted right) and the Markdown report's content."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

from evals.assertions import AssertionResult
from evals.judge import JudgeStats
from evals.report import junit_xml, write_junit, write_markdown
from evals.runner import EvalRun, RowResult, Status

START = datetime(2025, 3, 4, 10, 30, tzinfo=UTC)


def sample_run(strict: bool = False) -> EvalRun:
    ok = AssertionResult("decision", True, "decision=answered; expected answered")
    bad = AssertionResult("keywords.all", False, "answer lacks [10 minutes]")
    skipped = AssertionResult("rubric", False, "not checked: no judge configured", True)
    rows = [
        RowResult(
            "doc-ok",
            "evals/datasets/golden.yaml",
            "Q1?",
            Status.PARTIAL,
            [ok, skipped],
            tags=["doc"],
            latency_ms=1200,
            http_status=200,
            answer="Fine.",
            decision="answered",
            model="local/scripted",
            input_tokens=900,
            output_tokens=40,
            cost_usd=0.0002,
        ),
        RowResult(
            "doc-bad",
            "evals/datasets/golden.yaml",
            "Q2 | pipes?",
            Status.FAIL,
            [ok, bad],
            tags=["doc", "permission"],
            latency_ms=2400,
            http_status=200,
            answer="It is \x07fifteen | minutes " + "long " * 200,
            decision="answered",
            model="local/scripted",
            input_tokens=800,
            output_tokens=30,
            cost_usd=0.0001,
        ),
        RowResult(
            "gap",
            "evals/datasets/golden.yaml",
            "Q3?",
            Status.XFAIL,
            [bad],
            xfail="known gap",
            xfail_models=["qwen2.5-coder-0.5b-instruct"],
            tags=["off-topic"],
            latency_ms=800,
            answer="Nope.",
            decision="answered",
        ),
        RowResult(
            "fixed",
            "evals/datasets/golden.yaml",
            "Q4?",
            Status.XPASS,
            [ok],
            xfail="was broken",
            xfail_models=["local/*"],
            tags=["off-topic"],
            latency_ms=900,
            answer="Yes.",
            decision="answered",
        ),
        RowResult(
            "boom",
            "evals/datasets/golden.yaml",
            "Q5?",
            Status.ERROR,
            error="HTTP 500: internal server error",
            latency_ms=15,
            http_status=500,
            tags=["live-data"],
        ),
    ]
    judge = JudgeStats(
        "google/gemini-2.5-flash", calls=3, input_tokens=600, output_tokens=60, estimated_usd=0.0004
    )
    return EvalRun(
        base_url="http://127.0.0.1:8000",
        dataset="golden",
        model=None,
        judge_model="google/gemini-2.5-flash",
        started_at=START,
        finished_at=START + timedelta(seconds=12),
        results=rows,
        judge=judge,
        warnings=["judge is the same family as the answered model: grades are biased (x)"],
        strict=strict,
    )


def test_junit_is_valid_xml_with_the_right_counts(tmp_path: Path) -> None:
    path = write_junit(sample_run(), tmp_path / "out" / "junit.xml")
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert (
        suite.get("tests"),
        suite.get("failures"),
        suite.get("errors"),
        suite.get("skipped"),
    ) == (
        "5",
        "1",
        "1",
        "2",  # XFAIL and PARTIAL: neither is a pass
    )
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert list(cases) == ["doc-ok", "doc-bad", "gap", "fixed", "boom"]
    assert all(c.get("classname") == "evals.golden" for c in cases.values())
    assert cases["doc-ok"].get("time") == "1.200"
    failure = cases["doc-bad"].find("failure")
    assert failure is not None and failure.text == "keywords.all: answer lacks [10 minutes]"
    skipped = cases["gap"].find("skipped")
    assert skipped is not None and skipped.get("message") == "xfail: known gap"
    error = cases["boom"].find("error")
    assert error is not None and error.get("message") == "HTTP 500: internal server error"
    assert cases["fixed"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in cases["fixed"].iter("property")}
    assert props["status"] == "XPASS" and "stale xfail marker" in (props["xpass"] or "")
    partial = {p.get("name"): p.get("value") for p in cases["doc-ok"].iter("property")}
    assert (partial["status"], partial["not_checked"]) == ("PARTIAL", "rubric")
    skipped = cases["doc-ok"].find("skipped")
    assert skipped is not None
    assert skipped.get("message") == "partially checked: not checked rubric"
    # the control character in the answer did not break the document
    out = cases["doc-bad"].find("system-out")
    assert out is not None and "\ufffdfifteen" in (out.text or "")


def test_junit_under_strict_counts_xpass_as_a_failure() -> None:
    root = ET.fromstring(junit_xml(sample_run(strict=True)).encode())
    suite = root.find("testsuite")
    assert suite is not None and suite.get("failures") == "2"
    fixed = next(c for c in suite.iter("testcase") if c.get("name") == "fixed")
    failure = fixed.find("failure")
    assert failure is not None and failure.get("type") == "XPASS"


def test_markdown_report(tmp_path: Path) -> None:
    text = write_markdown(sample_run(), tmp_path / "report.md").read_text()
    assert text.startswith("# Eval report: golden (2025-03-04)\n")
    assert "- Date: 2025-03-04 10:30:00 UTC (12.0 s)" in text
    assert "- Base URL: `http://127.0.0.1:8000`" in text
    assert "- Judge model: google/gemini-2.5-flash" in text
    assert (
        "- Rows: 5; pass rate 20.0% = 1 fully passed (PASS + XPASS: every declared expectation "
        "checked and held) / all 5 rows (FAIL, ERROR, XFAIL and PARTIAL rows count in the "
        "denominator only)"
    ) in text
    assert "- Partially checked (PARTIAL, not passes): 1 rows" in text
    assert "| 0 | 1 | 1 | 1 | 1 | 1 | 20.0% |" in text
    assert "Judge: 3 calls, 600/60 tokens, cost $0.000400, 0 without a usable verdict." in text
    assert "- **XPASS** `fixed`: passes although marked xfail for local/* (was broken)" in text
    assert "| `doc-ok` | PARTIAL | 1,200 ms | 900/40 | $0.000200 | answered | doc |" in text
    assert "| `doc-bad` | **FAIL** | 2,400 ms | 800/30 | $0.000100 | answered | doc, permis" in text
    assert "| `boom` | **ERROR** | 15 ms | - | - | - | live-data |" in text
    details = text.split("## Failures, errors and XPASS", 1)[1].split("## Partially", 1)[0]
    assert "### `doc-bad`: FAIL" in details
    assert "Question: Q2 \\| pipes?" in details
    assert "- **keywords.all**: answer lacks [10 minutes]" in details
    assert "> It is \x07fifteen \\| minutes long" in details and "…" in details
    assert "### `fixed`: XPASS" in details and "remove the xfail marker" in details
    assert "### `boom`: ERROR" in details and "- **error**: HTTP 500" in details
    assert "### `doc-ok`" not in details
    assert (
        "- `gap` (xfail for qwen2.5-coder-0.5b-instruct): known gap (failed: keywords.all)"
    ) in text
    assert "- `doc-ok`: 1 checked and held; not checked: rubric" in text


def test_the_report_leads_with_a_biased_judge_warning(tmp_path: Path) -> None:
    text = write_markdown(sample_run(), tmp_path / "report.md").read_text()
    warning = "> **WARNING: judge is the same family as the answered model: grades are biased"
    assert warning in text
    assert text.index(warning) < text.index("## Rows")


def test_per_route_pass_rates_and_latency(tmp_path: Path) -> None:
    text = write_markdown(sample_run(), tmp_path / "report.md").read_text()
    routes = text.split("## Per route", 1)[1].split("## Rows", 1)[0]
    # one route per row (the first matching tag): the routes add up to the 5 rows
    assert "| off-topic / scope | 2 | 1 | 50.0% | 0 | 0 | 0 | 1 | 800 ms | 900 ms |" in routes
    assert "| permission | 1 | 0 | 0.0% | 0 | 1 | 0 | 0 | 2,400 ms | 2,400 ms |" in routes
    assert "| live data, one tool | 1 | 0 | 0.0% | 0 | 0 | 1 | 0 | 15 ms | 15 ms |" in routes
    assert "| documentation | 1 | 0 | 0.0% | 1 | 0 | 0 | 0 | 1,200 ms | 1,200 ms |" in routes


def test_a_rescored_run_says_it_is_not_a_fresh_run(tmp_path: Path) -> None:
    import dataclasses

    run = dataclasses.replace(sample_run(), rescored_from="old/responses.jsonl")
    text = write_markdown(run, tmp_path / "report.md").read_text()
    assert "**Re-scored** from saved answers (old/responses.jsonl), not a fresh run" in text


def test_the_router_table_counts_each_kind_of_row_by_the_route_the_service_took(
    tmp_path: Path,
) -> None:
    import dataclasses

    run = sample_run()
    notes = {"doc-ok": ["route: documentation (a documented token)"], "doc-bad": ["other"]}
    run = dataclasses.replace(
        run,
        results=[
            dataclasses.replace(r, response={"notes": notes[r.id]}) if r.id in notes else r
            for r in run.results
        ],
    )
    text = write_markdown(run, tmp_path / "report.md").read_text()
    router = text.split("## Router", 1)[1].split("## Rows", 1)[0]
    assert "| kind | greeting | documentation | live_data | both | open | - |" in router
    assert "| documentation | 0 | 1 | 0 | 0 | 0 | 0 |" in router
    assert "| permission | 0 | 0 | 0 | 0 | 0 | 1 |" in router  # a response with no route note
    # No row with a route note at all (native mode): no table.
    plain = write_markdown(sample_run(), tmp_path / "plain.md").read_text()
    assert "## Router" not in plain


def test_the_report_says_which_split_ran_from_which_files(tmp_path: Path) -> None:
    import dataclasses

    run = sample_run()
    for result, (split, world) in zip(
        run.results,
        [
            ("dev", "sample"),
            ("test", "sample"),
            ("test", "second"),
            ("test", "sample"),
            ("dev", "sample"),
        ],
        strict=True,
    ):
        result.split, result.world = split, world
    run.results[1].file = run.results[2].file = "evals/datasets/test.yaml"
    run = dataclasses.replace(
        run,
        split="all",
        files=("evals/datasets/golden.yaml", "evals/datasets/test.yaml"),
        rows_in_files=156,
    )
    text = write_markdown(run, tmp_path / "report.md").read_text()
    assert "- Split: all: dev and test together" in text
    assert "- Ran: split all: 5 rows (golden.yaml 3, test.yaml 2) of 156 in the files" in text
    assert "- Files: `evals/datasets/golden.yaml`, `evals/datasets/test.yaml`" in text
    assert "## Per split and world" in text
    assert "| dev | sample | 2 | 0 | 0.0% | 1 | 0 | 1 | 0 |" in text
    assert "| test | sample | 2 | 1 | 50.0% | 0 | 1 | 0 | 0 |" in text
    assert "| test | second | 1 | 0 | 0.0% | 0 | 0 | 0 | 1 |" in text
    assert (
        text.index("| dev | sample") < text.index("| test | sample") < text.index("| test | second")
    )
    root = ET.fromstring(junit_xml(run))
    assert root.find("testsuite/properties/property[@name='split']").get("value") == "all"  # type: ignore[union-attr]


def authored_run() -> EvalRun:
    """The sample run with who wrote each answer (``boom`` has none: an ERROR without a
    response), and the planner's route on two rows."""
    import dataclasses

    by = {"doc-ok": "model", "doc-bad": "service", "gap": "service", "fixed": "service"}
    notes = {"doc-ok": ["route: documentation (a documented token)"], "fixed": ["route: open"]}
    run = sample_run()
    return dataclasses.replace(
        run,
        results=[
            dataclasses.replace(
                r,
                answered_by=by.get(r.id),
                response={"notes": notes.get(r.id, [])} if r.id in by else None,
            )
            for r in run.results
        ],
    )


def test_model_written_and_service_written_rows_are_rated_apart_per_route(
    tmp_path: Path,
) -> None:
    text = write_markdown(authored_run(), tmp_path / "report.md").read_text()
    authors = text.split("## Who wrote the answer", 1)[1].split("## Router", 1)[0]
    # per route: model-written rows, passed, rate | service-written rows, passed, rate | none
    assert "| all rows | 1 | 0 | 0.0% | 3 | 1 | 33.3% | 1 |" in authors
    assert "| off-topic / scope | 0 | 0 | - | 2 | 1 | 50.0% | 0 |" in authors
    assert "| permission | 0 | 0 | - | 1 | 0 | 0.0% | 0 |" in authors
    assert "| documentation | 1 | 0 | 0.0% | 0 | 0 | - | 0 |" in authors
    assert "| live data, one tool | 0 | 0 | - | 0 | 0 | - | 1 |" in authors
    # by the route the planner took (its note), rows without one under "-"
    assert "| documentation | 1 | 0 | 0.0% | 0 | 0 | - | 0 |" in authors.split("planner", 1)[1]
    assert "| open | 0 | 0 | - | 1 | 1 | 100.0% | 0 |" in authors
    assert "| - | 0 | 0 | - | 2 | 0 | 0.0% | 1 |" in authors
    assert "- model-written rows: latency p50 1,200 ms, p95 1,200 ms; tokens 900/40" in authors
    assert "- service-written rows: latency p50 900 ms, p95 2,400 ms" in authors
    # the failing row's details say who wrote the answer that failed
    assert "Answer (answered, local/scripted, written by the service):" in text


def test_a_run_without_answered_by_has_no_such_section(tmp_path: Path) -> None:
    text = write_markdown(sample_run(), tmp_path / "report.md").read_text()
    assert "## Who wrote the answer" not in text


def test_the_terminal_summary_rates_the_authors_apart() -> None:
    import io

    from rich.console import Console

    from evals.report import print_summary

    out = io.StringIO()
    print_summary(authored_run(), Console(file=out, width=200))
    assert (
        "written by the model: 0/1 fully passed (0.0%); by the service: 1/3 fully passed (33.3%)"
        in out.getvalue()
    )
