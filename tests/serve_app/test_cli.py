"""The ``agent-service`` CLI, in-process and as a real subprocess."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serve_app.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = main(args, out=out)
    return code, out.getvalue()


def test_help_lists_every_subcommand() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "serve_app.cli", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    for sub in ("db", "ingest", "search"):
        assert sub in proc.stdout
    ingest = subprocess.run(
        [sys.executable, "-m", "serve_app.cli", "ingest", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert "--prune" in ingest.stdout and "ray job submit" in ingest.stdout


def test_bad_setting_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOP_K_FINAL", "lots")
    assert main(["db", "status"]) == EXIT_USAGE
    assert "TOP_K_FINAL" in capsys.readouterr().err


@pytest.mark.integration
def test_search_json_and_batch_as_a_caller(
    sample_docs_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DATABASE_URL", sample_docs_url)
    code, out = run_cli(["search", "CV-E1022", "--roles", "business_staff", "--json"])
    assert code == EXIT_OK
    payload = json.loads(out)
    assert payload["results"][0]["source"].endswith("developer/error-codes.md")
    assert set(payload["results"][0]) == {"chunk_id", "source", "section", "text", "score"}

    queries = tmp_path / "q.jsonl"
    queries.write_text(
        json.dumps({"id": "a", "query": "KESTREL-7 lockout", "roles": ["admin"]})
        + "\n"
        + json.dumps({"id": "b", "query": "KESTREL-7 lockout", "roles": ["business_admin"]})
        + "\n"
    )
    code, out = run_cli(["search", "--batch", str(queries), "--top-k", "3"])
    assert code == EXIT_OK
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["id"] for line in lines] == ["a", "b"]
    assert any("operator-runbook" in r["source"] for r in lines[0]["results"])
    assert not any("operator-runbook" in r["source"] for r in lines[1]["results"])
    assert all(len(line["results"]) <= 3 for line in lines)


@pytest.mark.integration
def test_search_refuses_a_store_of_another_dimension(
    sample_docs_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", sample_docs_url)
    monkeypatch.setenv("EMBEDDING_DIM", "768")
    assert main(["search", "anything"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "EMBEDDING_DIM is 768" in err and "vector(384)" in err
    assert "Traceback" not in err


@pytest.mark.integration
def test_bad_batch_file_is_a_usage_error(
    sample_docs_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DATABASE_URL", sample_docs_url)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "query": "ok"}\nnot json\n')
    assert main(["search", "--batch", str(bad)]) == EXIT_USAGE
    assert "bad.jsonl:2" in capsys.readouterr().err
    assert main(["search", "x", "--top-k", "99"]) == EXIT_USAGE


@pytest.mark.integration
def test_db_status_reports_schema_and_counts(
    sample_docs_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", sample_docs_url)
    code, out = run_cli(["db", "status"])
    assert code == EXIT_OK
    status = json.loads(out)
    assert status["revision"] == status["head"]
    assert status["column_dim"] == 384
    assert status["documents"] >= 15


def _env(db_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = db_url
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.mark.slow
@pytest.mark.integration
def test_ray_data_job_and_local_executor_agree(db_url: str, tmp_path: Path) -> None:
    """The real Ray Data pipeline through the real CLI; then the in-process executor sees
    every document as unchanged (same fingerprints, same chunks)."""
    from tests.ingest_jobs.corpus import PAGES, write_corpus

    root = write_corpus(tmp_path / "docs")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "serve_app.cli", "ingest", "--root", str(root)),
            *("--executor", "ray", "--json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(db_url),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["new"] == len(PAGES)
    assert report["chunks_written"] > len(PAGES)
    assert report["executor"] == "ray"
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "serve_app.cli",
            "ingest",
            "--root",
            str(root),
            "--executor",
            "local",
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(db_url),
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["unchanged"] == len(PAGES)


def test_bench_lists_the_benchmarks_with_their_summaries() -> None:
    code, out = run_cli(["bench", "--list"])
    assert code == EXIT_OK
    for name in (
        "search",
        "ingest",
        "serve_overhead",
        "serve_spans",
        "reranker",
        "local_llm",
        "autoscaling",
    ):
        assert f"  {name} " in out
    for library in ("loadgen", "stack", "text_corpus"):  # libraries of the benchmarks
        assert f"  {library} " not in out
    assert "Hybrid search latency" in out  # bench/search.py's first docstring line
    assert run_cli(["bench"]) == (EXIT_OK, out)


def test_unknown_benchmark_is_a_usage_error_listing_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "nope"], out=io.StringIO()) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "unknown benchmark 'nope'" in err and "serve_overhead" in err


def test_bench_runs_the_module_from_the_root_passing_args_through(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from serve_app.cli import bench as cli

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    (tmp_path / "bench" / "fake.py").write_text(
        '"""A fake benchmark.\n\nMore text."""\n'
        "import json, os, sys\n"
        "def main() -> None:\n"
        "    with open('seen.json', 'w') as fh:\n"
        "        json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd()}, fh)\n"
        "    sys.exit(3)\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    monkeypatch.setattr(cli, "bench_root", lambda: tmp_path)
    code, out = run_cli(["bench", "--list"])
    assert code == EXIT_OK and "fake  A fake benchmark." in out

    assert main(["bench", "fake", "--rounds", "2", "--help", "x"], out=io.StringIO()) == 3
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == ["--rounds", "2", "--help", "x"]
    assert Path(seen["cwd"]).resolve() == tmp_path.resolve()
    assert cli.bench_command("fake", ["-x"]) == [sys.executable, "-m", "bench.fake", "-x"]


def test_a_failed_ingest_says_what_failed_and_what_was_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ingest_jobs import pipeline
    from serve_app import wiring

    class NoStore:
        async def close(self) -> None:
            return None

    async def open_store(*args: object, **kwargs: object) -> NoStore:
        return NoStore()

    async def failing_run(*args: object, **kwargs: object) -> pipeline.IngestReport:
        report = pipeline.IngestReport(discovered=9, new=3, executor="ray")
        missing = [f"docs/p{n}.md" for n in range(6)]
        raise pipeline.IngestFailed(RuntimeError("ActorDiedError: the actor died"), report, missing)

    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(wiring, "open_store", open_store)
    monkeypatch.setattr(pipeline, "run_ingest", failing_run)
    code, out = run_cli(["ingest", "--root", str(tmp_path), "--executor", "ray", "--json"])
    assert code == EXIT_FAILURE
    report = json.loads(out)
    assert report["failed"] is True and report["new"] == 3 and len(report["not_ingested"]) == 6
    err = capsys.readouterr().err
    assert "ingestion failed (ray): RuntimeError: ActorDiedError: the actor died" in err
    assert "3 document(s) written whole, 6 not ingested (docs/p0.md" in err
    assert "and 1 more" in err and "run the same command again" in err
    assert f"the run's log: {tmp_path / 'home' / 'logs' / 'ingest.log'}" in err


def test_ingest_shows_what_it_found_then_a_bar_over_the_chunks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The terminal's view of a run (stderr): the sources found, then the chunks embedded and
    the documents written; the summary on stdout, as before."""
    from ingest_jobs import pipeline
    from ingest_jobs.pipeline import IngestProgress
    from serve_app import wiring

    class NoStore:
        async def close(self) -> None:
            return None

    async def open_store(*args: object, **kwargs: object) -> NoStore:
        return NoStore()

    async def run(*args: object, detail: Any, **kwargs: object) -> pipeline.IngestReport:
        now = IngestProgress(discovered=3, unchanged=1, documents=2, chunks=5)
        detail(now)
        for embedded in range(1, 6):
            detail(dataclasses.replace(now, chunks_embedded=embedded))
        detail(dataclasses.replace(now, chunks_embedded=5, documents_written=2, chunks_written=5))
        return pipeline.IngestReport(
            discovered=3, new=2, unchanged=1, chunks_written=5, seconds=1.5, executor="local"
        )

    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(wiring, "open_store", open_store)
    monkeypatch.setattr(pipeline, "run_ingest", run)
    code, out = run_cli(["ingest", "--root", str(tmp_path)])
    assert code == EXIT_OK
    assert out == (
        "ingested: 2 new, 1 unchanged, 0 replaced, 0 pruned, 0 skipped; "
        "5 chunks written in 1.5s (local)\n"
    )
    err = capsys.readouterr().err
    assert err.count("found 3 documents: 2 to ingest (5 chunks), 1 unchanged") == 1
    assert "5/5 chunks embedded, 2/2 documents written" in err

    code, _ = run_cli(["ingest", "--root", str(tmp_path), "--quiet"])
    assert code == EXIT_OK and capsys.readouterr().err == ""


def test_the_found_line_says_when_there_is_nothing_to_ingest() -> None:
    from ingest_jobs.pipeline import IngestProgress
    from serve_app.cli.ingest import found_line

    assert found_line(IngestProgress(discovered=26, unchanged=26)) == (
        "found 26 documents: nothing to ingest, 26 unchanged"
    )
    assert found_line(IngestProgress(discovered=1, unchanged=0, documents=1, chunks=1)) == (
        "found 1 document: 1 to ingest (1 chunk), 0 unchanged"
    )
    assert found_line(IngestProgress(discovered=4, unchanged=2, skipped=2)).endswith(
        "nothing to ingest, 2 unchanged, 2 skipped"
    )


@pytest.mark.parametrize("verbose", [False, True])
def test_a_command_log_keeps_log_and_span_lines_off_the_terminal_unless_verbose(
    verbose: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``logs_to_file``: INFO lines (the span lines among them) go to <home>/logs/NAME.log;
    the terminal's handler keeps warnings, or everything with ``--verbose``; undone after."""
    import logging

    from foundation.settings import Settings
    from serve_app.cli.common import logs_to_file

    root = logging.getLogger()
    terminal = logging.StreamHandler(sys.stderr)  # what configure_logging installs
    root.addHandler(terminal)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        settings = Settings(agent_service_home=tmp_path)
        with logs_to_file(settings, "ingest", verbose=verbose) as path:
            logging.getLogger("agent_service.spans").info("span ingest.run 12.0ms trace=abc")
            logging.getLogger("ingest_jobs.pipeline").warning("skipped docs/x.md: not UTF-8")
        assert terminal.level == logging.NOTSET  # as it was
    finally:
        root.removeHandler(terminal)
        root.setLevel(level)
    assert path == tmp_path / "logs" / "ingest.log"
    logged = path.read_text()
    assert "span ingest.run 12.0ms" in logged and "skipped docs/x.md" in logged
    err = capsys.readouterr().err
    assert "skipped docs/x.md" in err
    assert ("span ingest.run" in err) is verbose


def test_verbose_is_taken_before_or_after_the_ingest_command() -> None:
    from serve_app.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["-v", "ingest"]).verbose is True
    assert parser.parse_args(["ingest", "--verbose"]).verbose is True
    assert parser.parse_args(["ingest"]).verbose is False


@pytest.mark.slow
@pytest.mark.integration
def test_ingest_prints_progress_and_keeps_span_lines_in_its_log(
    db_url: str, tmp_path: Path
) -> None:
    """The real CLI, as `make run` runs it: on the terminal what was found, the bar and the
    summary, and no log or span lines (those are in <home>/logs/ingest.log); ``--verbose``
    shows them there too."""
    from tests.ingest_jobs.corpus import PAGES, write_corpus

    root = write_corpus(tmp_path / "docs")
    env = {**_env(db_url), "AGENT_SERVICE_HOME": str(tmp_path / "home")}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)  # the CLI turns the loader's bars off itself
    cmd = [sys.executable, "-m", "serve_app.cli", "ingest", "--root", str(root)]
    cmd += ["--executor", "local"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = len(PAGES)
    assert proc.stdout.startswith(f"ingested: {n} new, 0 unchanged, 0 replaced"), proc.stdout
    assert f"found {n} documents: {n} to ingest (" in proc.stderr, proc.stderr
    assert f"chunks embedded, {n}/{n} documents written" in proc.stderr, proc.stderr
    assert "span " not in proc.stderr and " INFO " not in proc.stderr, proc.stderr
    assert "Loading weights" not in proc.stderr, proc.stderr
    log = (tmp_path / "home" / "logs" / "ingest.log").read_text()
    assert "agent_service.spans: span ingest.embed" in log
    assert "agent_service.spans: span ingest.run" in log

    again = subprocess.run(
        [*cmd, "--verbose"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"found {n} documents: nothing to ingest, {n} unchanged" in again.stderr
    assert "agent_service.spans: span ingest.run" in again.stderr
    assert again.stdout.startswith(f"ingested: 0 new, {n} unchanged")
