"""Score search configurations on the labelled retrieval benchmark (``retrieval_labels``).

Each question is searched as its row's caller, exactly as ``search_docs`` searches for the
model: the final ``TOP_K_FINAL`` chunks are what recall@k, hit@k and the no-answer figures
are measured on; a second search for 10 chunks gives nDCG@10 and MRR@10 (the same pipeline
with a deeper cut: with ``TOP_K_RERANK`` >= 10 its first ``TOP_K_FINAL`` are the same chunks).
Chunks map to (page, section) by their source and heading path; the metrics are defined in
``retrieval_metrics``.

Answerable rows make the means. Unanswerable and acl-hidden rows have no relevant section,
so nDCG, recall and MRR are undefined for them and they are kept out of the means; what
matters for them is whether the search says "nothing close", so they get their own table:
the best absolute score the search returned (the cosine similarity of the closest chunk the
vector side found: what the service's router compares with ``DOC_SIMILARITY``) against the
same figure on the answerable rows. Every chunk is also checked against its page's ACL: a
chunk the caller may not read would be a leak (the SQL filter makes it impossible; the
report counts them anyway).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.small_model.routing import DOC_SIMILARITY
from evals.retrieval_labels import (
    ANSWERABLE,
    Category,
    QualityDataset,
    QualityRow,
    SectionKey,
)
from evals.retrieval_metrics import rank_scores
from foundation.acl import is_visible

DEEP_K = 10  # nDCG@10 and MRR@10


class QualityHit(Protocol):
    """What is read of a search hit (``retrieval.search.SearchHit`` has it)."""

    @property
    def chunk_id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def section(self) -> str: ...
    @property
    def similarity(self) -> float | None: ...
    @property
    def rerank_score(self) -> float | None: ...


class Searcher(Protocol):
    """One search configuration (``retrieval.search.HybridRetriever`` satisfies it)."""

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> Sequence[QualityHit]: ...


@dataclass(frozen=True)
class Retrieved:
    """A returned chunk, mapped to its labelled section."""

    chunk_id: str
    page: str | None  # page key, None for a source outside the documentation folder
    section: str
    grade: int  # the row's label for the section, 0 when unlabelled
    similarity: float | None
    rerank_score: float | None
    readable: bool  # the row's caller may read the page (False would be a leak)

    @property
    def key(self) -> SectionKey | None:
        return None if self.page is None else (self.page, self.section)


@dataclass(frozen=True)
class RowScore:
    row: QualityRow
    final: tuple[Retrieved, ...]  # the top TOP_K_FINAL: what the model receives
    deep: tuple[Retrieved, ...]  # the top DEEP_K
    ndcg: float | None  # None on rows with no answer
    recall: float | None
    reciprocal_rank: float | None
    hit: bool | None
    first_answer: int | None  # rank of the first answering chunk within DEEP_K

    @property
    def top_cosine(self) -> float | None:
        """Cosine of the closest returned chunk (None: no chunk came from the vector side)."""
        return max((r.similarity for r in self.final if r.similarity is not None), default=None)

    @property
    def top_rerank(self) -> float | None:
        return max((r.rerank_score for r in self.final if r.rerank_score is not None), default=None)

    @property
    def leaks(self) -> int:
        """Chunks returned that the row's caller may not read (distinct; must be 0)."""
        return len({r.chunk_id for r in (*self.final, *self.deep) if not r.readable})


@dataclass
class ConfigScores:
    name: str
    rows: list[RowScore] = field(default_factory=list)

    def answerable(self, category: Category | None = None) -> list[RowScore]:
        return [
            s
            for s in self.rows
            if s.row.answerable and (category is None or s.row.category == category)
        ]

    def no_answer(self) -> list[RowScore]:
        return [s for s in self.rows if not s.row.answerable]

    def mean(
        self, metric: Callable[[RowScore], float | None], category: Category | None = None
    ) -> float:
        values = [v for s in self.answerable(category) if (v := metric(s)) is not None]
        return statistics.fmean(values) if values else 0.0


@dataclass
class QualityReport:
    dataset: QualityDataset
    final_k: int
    configs: list[ConfigScores]
    context: dict[str, str] = field(default_factory=dict)  # header facts: models, depths...


# --- running ------------------------------------------------------------------------------------


def _retrieved(row: QualityRow, hit: QualityHit, dataset: QualityDataset) -> Retrieved:
    page_key = dataset.corpus.key_of(hit.source)
    page = dataset.corpus.page(page_key) if page_key is not None else None
    return Retrieved(
        chunk_id=hit.chunk_id,
        page=page_key,
        section=hit.section,
        grade=row.grades.get((page_key, hit.section), 0) if page_key is not None else 0,
        similarity=hit.similarity,
        rerank_score=hit.rerank_score,
        readable=page is not None and is_visible(page.acl, row.caller.acl),
    )


def score_row(
    row: QualityRow, final: Sequence[Retrieved], deep: Sequence[Retrieved], final_k: int
) -> RowScore:
    """The row's metrics from its two result lists (None where the row has no answer)."""
    if not row.answerable:
        return RowScore(row, tuple(final), tuple(deep), None, None, None, None, None)
    scores = rank_scores(
        [r.key for r in final],
        [r.key for r in deep],
        row.grades,
        row.answer_keys,
        final_k=final_k,
        deep_k=DEEP_K,
    )
    return RowScore(
        row,
        tuple(final),
        tuple(deep),
        ndcg=scores.ndcg,
        recall=scores.recall,
        reciprocal_rank=scores.reciprocal_rank,
        hit=scores.hit,
        first_answer=scores.first_answer,
    )


async def score_config(
    dataset: QualityDataset, searcher: Searcher, name: str, final_k: int
) -> ConfigScores:
    scores = ConfigScores(name)
    for row in dataset.rows:
        question = row.question.strip()  # as search_docs sends it
        final = await searcher.search(question, acl=row.caller.acl, top_k=final_k)
        deep = await searcher.search(question, acl=row.caller.acl, top_k=DEEP_K)
        scores.rows.append(
            score_row(
                row,
                [_retrieved(row, h, dataset) for h in final],
                [_retrieved(row, h, dataset) for h in deep],
                final_k,
            )
        )
    return scores


async def run_quality(
    dataset: QualityDataset,
    searchers: Mapping[str, Searcher],
    *,
    final_k: int,
    context: Mapping[str, str] | None = None,
) -> QualityReport:
    """Every row through every configuration, in the mapping's order."""
    if final_k < 1:
        raise ValueError("final_k must be at least 1")
    configs = [await score_config(dataset, s, name, final_k) for name, s in searchers.items()]
    return QualityReport(dataset, final_k, configs, dict(context or {}))


# --- reporting ----------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole}" if whole else "-"


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], text: Sequence[int] = (0,)
) -> list[str]:
    """A Markdown table: the columns numbered in ``text`` left-aligned, the figures right."""
    align = ["---" if i in text else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


class RankedScore(Protocol):
    """One query's figures, whatever the benchmark (``RowScore``, ``known_item.ItemScore``)."""

    @property
    def ndcg(self) -> float | None: ...
    @property
    def recall(self) -> float | None: ...
    @property
    def reciprocal_rank(self) -> float | None: ...
    @property
    def hit(self) -> bool | None: ...


def metric_names(final_k: int) -> dict[str, Callable[[RankedScore], float | None]]:
    """The summary's columns, each a query's figure (None: not defined for that query)."""
    return {
        f"nDCG@{DEEP_K}": lambda s: s.ndcg,
        f"recall@{final_k}": lambda s: s.recall,
        f"MRR@{DEEP_K}": lambda s: s.reciprocal_rank,
        f"hit@{final_k}": lambda s: None if s.hit is None else float(s.hit),
    }


def summary_table(report: QualityReport) -> list[str]:
    metrics = metric_names(report.final_k)
    n = len(report.configs[0].answerable()) if report.configs else 0
    rows = [[c.name, *(fmt(c.mean(m)) for m in metrics.values())] for c in report.configs]
    return markdown_table([f"configuration ({n} answerable questions)", *metrics], rows)


def category_tables(report: QualityReport) -> list[str]:
    """One table per metric: configurations by answerable category."""
    categories = [c for c in report.dataset.categories() if c in ANSWERABLE]
    first = report.configs[0] if report.configs else ConfigScores("")
    header = [f"{c} ({len(first.answerable(c))})" for c in categories]
    lines: list[str] = []
    for name, metric in list(metric_names(report.final_k).items())[:3]:
        rows = [[c.name, *(fmt(c.mean(metric, cat)) for cat in categories)] for c in report.configs]
        lines += [
            "",
            f"**{name}** by category",
            "",
            *markdown_table(["configuration", *header], rows),
        ]
    return lines


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def no_answer_row(config: ConfigScores) -> list[str]:
    """One configuration's figures on the rows with no visible answer."""
    none = config.no_answer()
    answered = [v for s in config.answerable() if (v := s.top_cosine) is not None]
    missing = [v for s in none if (v := s.top_cosine) is not None]
    bar = _median(answered)
    empty = sum(not s.final for s in none)
    if bar is None:  # no absolute score at all (keyword side alone)
        flagged = lowered = under = "n/a"
    else:
        low = sum(not s.final or (s.top_cosine is not None and s.top_cosine < bar) for s in none)
        flagged = _share(low, len(none))
        lowered = _share(sum(v < DOC_SIMILARITY for v in missing) + empty, len(none))
        under = _share(sum(v < DOC_SIMILARITY for v in answered), len(config.answerable()))
    return [
        config.name,
        _share(empty, len(none)),
        f"{fmt(bar)} / {fmt(_median(missing))}",
        flagged,
        lowered,
        under,
    ]


def no_answer_table(report: QualityReport) -> list[str]:
    header = [
        "configuration",
        "no chunk returned",
        "median top cosine: answerable / no answer",
        "no-answer rows under the answerable median",
        f"no-answer rows under DOC_SIMILARITY {DOC_SIMILARITY}",
        f"answerable rows under {DOC_SIMILARITY}",
    ]
    return markdown_table(header, [no_answer_row(c) for c in report.configs])


def header_lines(report: QualityReport) -> list[str]:
    rows = report.configs[0].rows if report.configs else []
    counts = {c: sum(s.row.category == c for s in rows) for c in report.dataset.categories()}
    lines = [
        f"# Retrieval quality: {report.dataset.path}",
        "",
        f"{len(rows)} questions: "
        + ", ".join(f"{n} {c}" for c, n in counts.items())
        + f". Scored on the final top {report.final_k} chunks (TOP_K_FINAL) of a search as the "
        f"row's caller; nDCG@{DEEP_K} and MRR@{DEEP_K} on a search for {DEEP_K}.",
    ]
    lines += [f"- {key}: {value}" for key, value in report.context.items()]
    return lines


def leak_line(report: QualityReport) -> str:
    leaks = {c.name: sum(s.leaks for s in c.rows) for c in report.configs}
    total = sum(leaks.values())
    if total == 0:
        return "Chunks from pages the caller may not read: 0 in every configuration."
    return "**LEAK**: chunks from pages the caller may not read: " + ", ".join(
        f"{name} {n}" for name, n in leaks.items() if n
    )


def summary_markdown(report: QualityReport) -> str:
    """The tables the command prints: overall, by category, and the no-answer rows."""
    none = len(report.configs[0].no_answer()) if report.configs else 0
    lines = [
        *header_lines(report),
        "",
        *summary_table(report),
        *category_tables(report),
        "",
        f"**Questions with no visible answer** ({none}: unanswerable and acl-hidden; not in "
        "the means above, where nDCG, recall and MRR are undefined for them). Top cosine: the "
        "closest returned chunk found by the vector side (keyword only: none).",
        "",
        *no_answer_table(report),
        "",
        leak_line(report),
    ]
    return "\n".join(lines) + "\n"


def _section_label(r: Retrieved) -> str:
    mark = {2: "**A**", 1: "r"}.get(r.grade, "·")
    tail = r.section.rsplit(" > ", 1)[-1] if r.section else "(intro)"
    return f"{mark} {r.page or '?'} > {tail}"


def per_question_lines(report: QualityReport) -> list[str]:
    """One row per question: each configuration's nDCG@10 / recall@k / first answer rank,
    and what the last configuration put in the model's top k (A answers, r related)."""
    names = " / ".join(c.name for c in report.configs)
    last = report.configs[-1] if report.configs else ConfigScores("")
    header = [
        "id",
        "category",
        "caller",
        f"nDCG@{DEEP_K} ({names})",
        f"recall@{report.final_k}",
        "first answer rank",
        f"top {report.final_k} of {last.name}",
    ]
    rows: list[list[str]] = []
    for i, score in enumerate(last.rows):
        per = [c.rows[i] for c in report.configs]
        rows.append(
            [
                f"`{score.row.id}`",
                score.row.category,
                score.row.caller.name,
                " / ".join(fmt(s.ndcg) for s in per),
                " / ".join(fmt(s.recall) for s in per),
                " / ".join(str(s.first_answer or "-") for s in per),
                "<br>".join(_section_label(r) for r in score.final) or "(nothing)",
            ]
        )
    return [
        "Marks in the last column: **A** answers, r related, · no label. Metrics as in the "
        "summary; `-`: no answering section within 10.",
        "",
        *markdown_table(header, rows, text=(0, 1, 2, 6)),
    ]


def report_markdown(report: QualityReport) -> str:
    """The whole report file: the summary, then every question."""
    return (
        summary_markdown(report)
        + "\n## Per question\n\n"
        + "\n".join(per_question_lines(report))
        + "\n"
    )


def report_jsonl(report: QualityReport) -> str:
    """One JSON line per question and configuration, with the sections it returned."""

    def hit(r: Retrieved) -> dict[str, object]:
        return {"page": r.page, "section": r.section, "grade": r.grade, "cosine": r.similarity}

    lines = []
    for config in report.configs:
        for s in config.rows:
            line = {
                "id": s.row.id,
                "config": config.name,
                "category": s.row.category,
                "caller": s.row.caller.name,
                "ndcg": s.ndcg,
                "recall": s.recall,
                "reciprocal_rank": s.reciprocal_rank,
                "first_answer": s.first_answer,
                "top": [hit(r) for r in s.deep],
            }
            lines.append(json.dumps(line, ensure_ascii=False))
    return "\n".join(lines) + "\n"
