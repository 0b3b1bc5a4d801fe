"""Scoring search configurations on labelled questions: per-row metrics on what each search
returned, means over answerable rows only, the no-answer table, leaks, the report files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from evals.retrieval_labels import QualityDataset, load_quality_dataset
from evals.retrieval_quality import (
    QualityReport,
    no_answer_row,
    report_jsonl,
    report_markdown,
    run_quality,
    summary_markdown,
)
from tests.evals.retrieval_helpers import make_repo, write_rows

ROWS = """\
- id: alpha
  category: lexical
  as: std
  q: alpha?
  answers: ["user/a.md > Alpha"]
  related: ["user/a.md > Page A"]
- id: multi
  category: multi-section
  as: staff
  q: multi?
  answers: ["user/a.md > Alpha > Steps", "developer/b.md > Gamma"]
- id: none
  category: unanswerable
  as: std
  q: none?
- id: hidden
  category: acl-hidden
  as: staff
  q: hidden?
  hidden: ["user/secret.md > Keys"]
"""


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    source: str
    section: str
    similarity: float | None
    rerank_score: float | None = None


@dataclass
class FakeSearch:
    """Ranked (page, section, cosine) per question; records each call's ACL and depth."""

    docs: Path
    ranked: dict[str, list[tuple[str, str, float | None]]]

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[Hit]:
        hits = [
            Hit(f"{query}-{i}", (self.docs / page).as_posix(), section, cosine)
            for i, (page, section, cosine) in enumerate(self.ranked.get(query, []))
        ]
        return hits[: top_k or 5]


A, B, SECRET = "user/a.md", "developer/b.md", "user/secret.md"
GOOD = {
    "alpha?": [(A, "Page A > Alpha", 0.9), (A, "Page A", 0.8), (A, "Page A > Beta", 0.1)],
    "multi?": [
        (A, "Page A > Alpha > Steps", 0.7),
        (A, "Page A > Beta", 0.6),
        (B, "Page B > Gamma", 0.5),
    ],
    "none?": [(A, "Page A > Beta", 0.3)],
    "hidden?": [(A, "Page A > Beta", 0.2)],
}
BAD = {
    "alpha?": [(A, "Page A > Beta", 0.5), (A, "Page A > Beta", 0.4), (A, "Page A > Alpha", 0.3)],
    "multi?": [(A, "Page A > Beta", 0.45)],
    "none?": [(A, "Page A > Alpha", 0.95)],
    "hidden?": [(SECRET, "Secret > Keys", 0.1)],  # a leak: staff may not read it
}
NO_COSINE = {q: [(p, s, None) for p, s, _ in hits] for q, hits in GOOD.items()} | {"none?": []}


@pytest.fixture
def dataset(tmp_path: Path) -> QualityDataset:
    repo = make_repo(tmp_path)
    return load_quality_dataset(write_rows(repo, ROWS), repo_root=repo)


@pytest.fixture
async def report(dataset: QualityDataset) -> QualityReport:
    docs = dataset.corpus.docs
    searchers = {
        "good": FakeSearch(docs, GOOD),
        "bad": FakeSearch(docs, BAD),
        "keyword-like": FakeSearch(docs, NO_COSINE),
    }
    return await run_quality(dataset, searchers, final_k=2, context={"note": "fake"})


def test_row_metrics_are_taken_on_what_each_search_returned(report: QualityReport) -> None:
    good, bad, _ = report.configs
    alpha, multi = good.rows[0], good.rows[1]
    assert (alpha.ndcg, alpha.recall, alpha.reciprocal_rank, alpha.hit) == (1.0, 1.0, 1.0, True)
    assert [r.grade for r in alpha.final] == [2, 1] and len(alpha.deep) == 3
    # Steps (2) at 1, Gamma (2) at 3: (2 + 2/log2(4)) / (2 + 2/log2(3)) = 3 / 3.261860
    assert multi.ndcg == pytest.approx(0.919721, abs=1e-6)
    assert multi.recall == 0.5  # Gamma is third: outside the final top 2
    bad_alpha = bad.rows[0]
    # Beta twice, then Alpha at 3: (2/log2(4)) / (2 + 1/log2(3)) = 1 / 2.630930
    assert bad_alpha.ndcg == pytest.approx(0.380094, abs=1e-6)
    assert (bad_alpha.recall, bad_alpha.hit, bad_alpha.first_answer) == (0.0, False, 3)
    assert bad_alpha.reciprocal_rank == pytest.approx(1 / 3)


def test_means_leave_out_the_rows_with_no_answer(report: QualityReport) -> None:
    good, bad, _ = report.configs
    none = good.rows[2]
    assert (none.ndcg, none.recall, none.reciprocal_rank, none.hit) == (None, None, None, None)
    assert good.mean(lambda s: s.ndcg) == pytest.approx((1 + 0.919721) / 2, abs=1e-6)
    assert good.mean(lambda s: s.recall) == 0.75
    assert bad.mean(lambda s: s.reciprocal_rank) == pytest.approx(1 / 6)
    assert good.mean(lambda s: s.ndcg, "multi-section") == pytest.approx(0.919721, abs=1e-6)
    assert [len(c.answerable()) for c in report.configs] == [2, 2, 2]
    assert [len(c.no_answer()) for c in report.configs] == [2, 2, 2]


def test_no_answer_figures_compare_with_the_answerable_rows(report: QualityReport) -> None:
    good, bad, keyword_like = (no_answer_row(c) for c in report.configs)
    # answerable top cosines 0.9 and 0.7 (median 0.8); no-answer 0.3 and 0.2: both below
    assert good == ["good", "0/2", "0.800 / 0.250", "2/2", "2/2", "0/2"]
    # answerable 0.5 and 0.45 (median 0.475); no-answer 0.95 (above) and 0.1 (below)
    assert bad == ["bad", "0/2", "0.475 / 0.525", "1/2", "1/2", "2/2"]
    # no absolute score at all; the unanswerable row returned nothing
    assert keyword_like == ["keyword-like", "1/2", "n/a / n/a", "n/a", "n/a", "n/a"]


def test_a_chunk_the_caller_may_not_read_is_a_leak(report: QualityReport) -> None:
    good, bad, _ = report.configs
    assert sum(s.leaks for s in good.rows) == 0
    assert [s.leaks for s in bad.rows] == [0, 0, 0, 1]  # counted once, in final and deep
    assert "**LEAK**" in summary_markdown(report) and "bad 1" in summary_markdown(report)


def test_the_report_files(report: QualityReport) -> None:
    text = report_markdown(report)
    assert "4 questions: 1 lexical, 1 multi-section, 1 unanswerable, 1 acl-hidden" in text
    assert (
        "| configuration (2 answerable questions) | nDCG@10 | recall@2 | MRR@10 | hit@2 |" in text
    )
    assert "| good | 0.960 | 0.750 | 1.000 | 1.000 |" in text
    assert "**nDCG@10** by category" in text and "lexical (1)" in text
    assert "- note: fake" in text
    assert "## Per question" in text and "| `multi` | multi-section | staff |" in text
    lines = [json.loads(line) for line in report_jsonl(report).splitlines()]
    assert len(lines) == 12  # 4 questions x 3 configurations
    first = lines[0]
    assert first["id"] == "alpha" and first["config"] == "good"
    assert first["top"][0] == {
        "page": "user/a.md",
        "section": "Page A > Alpha",
        "grade": 2,
        "cosine": 0.9,
    }


async def test_final_k_must_be_positive(dataset: QualityDataset) -> None:
    with pytest.raises(ValueError, match="final_k"):
        await run_quality(dataset, {}, final_k=0)
