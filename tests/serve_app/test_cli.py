"""The ``agent-service`` CLI, in-process and as a real subprocess."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

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
