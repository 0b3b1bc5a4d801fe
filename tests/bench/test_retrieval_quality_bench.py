"""``python -m bench.retrieval_quality`` on the real embedded PostgreSQL: the sample docs
through the real ingest into the benchmark's own database, a few labelled questions through
the four configurations, the tables printed and the report files written."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bench import retrieval_quality as bench
from foundation.database import asyncpg_url, with_database
from foundation.settings import Settings

ONLY = (
    "cooldown-config-key",  # exact token
    "concepts-dwell-anonymous",  # paraphrase
    "multi-first-week",  # five sections
    "runbook-kestrel-7",  # admin only
    "billing-grace-sp25",  # business_admin only
    "none-fake-error-code",  # unanswerable
    "hidden-kestrel-badmin",  # acl-hidden
)
CONFIGS = ["vector only", "keyword only", "hybrid (RRF)", "hybrid + reranker (noop)"]


@pytest.fixture
async def database(pg_admin_url: str) -> AsyncIterator[str]:
    """A database name of the test's own on the session's server, dropped afterwards."""
    name = f"t_rq_{uuid.uuid4().hex[:10]}"
    yield name
    conn = await asyncpg.connect(asyncpg_url(pg_admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.mark.integration
@pytest.mark.slow
async def test_the_command_ingests_and_compares_the_four_configurations(
    pg_admin_url: str,
    database: str,
    cached_minilm: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = with_database(pg_admin_url, "postgres")
    settings = Settings(agent_service_home=tmp_path / "home", database_url=server)
    options = bench.Options(out_dir=tmp_path / "out", database=database, only=ONLY)

    report = await bench.run_benchmark(settings, options, embedder=cached_minilm)

    assert [c.name for c in report.configs] == CONFIGS
    assert "26 pages" in report.context["corpus"] and "26 new" in report.context["corpus"]
    assert report.context["reranker"].startswith("noop: the hybrid + reranker column equals")
    hybrid, reranked = report.configs[2], report.configs[3]
    for plain, noop in zip(hybrid.rows, reranked.rows, strict=True):  # noop keeps the order
        assert [r.chunk_id for r in plain.deep] == [r.chunk_id for r in noop.deep]
    assert all(s.leaks == 0 for c in report.configs for s in c.rows)
    by_id = {s.row.id: s for s in report.configs[1].rows}  # keyword only
    assert by_id["cooldown-config-key"].hit  # the exact token finds its section
    assert all(len(s.final) <= settings.top_k_final for c in report.configs for s in c.rows)

    # The command itself, on the same database: nothing left to ingest.
    monkeypatch.setenv("DATABASE_URL", server)
    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path / "home"))
    out_dir = tmp_path / "cli"
    argv = ["--database", database, "--out-dir", str(out_dir), "--only", ",".join(ONLY)]
    code = await asyncio.to_thread(bench.main, argv)  # it runs its own event loop
    printed = capsys.readouterr().out
    assert code == 0
    assert "| configuration (5 answerable questions) | nDCG@10 | recall@5 | MRR@10 | hit@5 |" in (
        printed
    )
    assert "0 new, 26 unchanged" in printed
    assert "Chunks from pages the caller may not read: 0 in every configuration." in printed
    report_md = (out_dir / "report.md").read_text(encoding="utf-8")
    assert "## Per question" in report_md and "`hidden-kestrel-badmin`" in report_md
    assert len((out_dir / "report.jsonl").read_text(encoding="utf-8").splitlines()) == 28


def test_an_unknown_row_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path))
    dataset = bench.load_quality_dataset(bench.Options().dataset, repo_root=bench.ROOT)
    with pytest.raises(bench.DatasetError, match="no row 'nope'"):
        bench.select(dataset, ["nope"])
    assert len(bench.select(dataset, ["multi-first-week"]).rows) == 1


def test_the_text_corpus_options() -> None:
    options = bench.parse_args(["--corpus", "text", "--sizes", "10000,100000"])
    assert (options.corpus, options.sizes, options.queries) == ("text", (10_000, 100_000), 500)
    assert bench.parse_args([]).corpus == "sample"
    for argv in (
        ["--corpus", "text", "--sizes", "400", "--queries", "400"],  # no room for distractors
        ["--corpus", "text", "--sizes", "10k"],
        ["--corpus", "text", "--only", "cooldown-config-key"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)


def test_a_text_corpus_database_is_named_by_its_size_and_content() -> None:
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    items = bench.KnownItems(["a b", "c d", "e f"], ["q"], [1], ["json/decoder.py"])
    name = bench.text_database(items, Named("all-MiniLM-L6-v2"))  # type: ignore[arg-type]
    assert name.startswith("rq_text_3_") and len(name) == len("rq_text_3_") + 10
    assert bench.text_database(items, Named("all-MiniLM-L6-v2")) == name  # type: ignore[arg-type]
    other = bench.KnownItems(["a b", "c d", "e g"], ["q"], [1], ["json/decoder.py"])
    assert bench.text_database(other, Named("all-MiniLM-L6-v2")) != name  # type: ignore[arg-type]
    assert bench.text_database(items, Named("bge-small")) != name  # type: ignore[arg-type]


def test_split_keeps_one_side_of_the_questions() -> None:
    assert bench.parse_args([]).split is None
    assert bench.parse_args(["--split", "heldout"]).split == "heldout"
    with pytest.raises(SystemExit):
        bench.parse_args(["--split", "test"])
    dataset = bench.load_quality_dataset(bench.Options().dataset, repo_root=bench.ROOT)
    train = bench.select(dataset, [], "train").rows
    heldout = bench.select(dataset, [], "heldout").rows
    assert len(train) + len(heldout) == len(dataset.rows)
    assert not {r.id for r in train} & {r.id for r in heldout}
