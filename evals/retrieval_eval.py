"""Retrieval-only eval (``--retrieval``): how well ``search_docs``'s retrieval finds the
sources a row expects to be cited, without any model, so a retrieval change can be judged
in seconds and for free.

For every row with ``cited_sources``, the question goes to the retriever exactly as the
``search_docs`` tool sends it (stripped, with the row user's ACL entries). The ranked chunks
collapse to distinct sources, best first, and are cut at ``k``:

* recall@k: the fraction of the expected sources among those top-k sources;
* reciprocal rank: 1 / rank of the first expected source within them (0 if none): MRR@k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from evals.assertions import source_matches
from evals.dataset import Dataset, Identity
from foundation.identity import AuthUser

MAX_SEARCH_DEPTH = 50  # search_docs' top_k ceiling


class _Hit(Protocol):
    @property
    def source(self) -> str: ...


class SearchRetriever(Protocol):
    """What is needed from retrieval (``retrieval.search.HybridRetriever`` satisfies it)."""

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> Sequence[_Hit]: ...


@dataclass(frozen=True)
class RetrievalRow:
    id: str
    expected: list[str]
    sources: list[str]  # distinct retrieved sources, best first, cut at k
    found: list[str]  # the expected sources among them
    recall: float
    reciprocal_rank: float
    first_rank: int | None  # 1-based rank of the first expected source, or None


@dataclass(frozen=True)
class RetrievalReport:
    dataset: str
    k: int
    rows: list[RetrievalRow]
    split: str = "all"  # the split the rows were selected from (dev, test or all)

    @property
    def mean_recall(self) -> float:
        return sum(r.recall for r in self.rows) / len(self.rows) if self.rows else 0.0

    @property
    def mrr(self) -> float:
        return sum(r.reciprocal_rank for r in self.rows) / len(self.rows) if self.rows else 0.0


def user_acl(identity: Identity) -> list[str]:
    """The ACL entries of the user an eval token with these claims becomes."""
    user = AuthUser.from_claims(
        {"sub": identity.sub, "roles": list(identity.roles), "domains": list(identity.domains)}
    )
    return user.acl_entries


def distinct_sources(hits: Sequence[_Hit]) -> list[str]:
    return list(dict.fromkeys(hit.source for hit in hits))


def score_sources(row_id: str, expected: Sequence[str], sources: Sequence[str]) -> RetrievalRow:
    """recall@k and reciprocal rank of ``expected`` within the ranked ``sources``."""
    found = [e for e in expected if any(source_matches(e, s) for s in sources)]
    first_rank = next(
        (rank for rank, s in enumerate(sources, 1) if any(source_matches(e, s) for e in expected)),
        None,
    )
    return RetrievalRow(
        id=row_id,
        expected=list(expected),
        sources=list(sources),
        found=found,
        recall=len(found) / len(expected) if expected else 0.0,
        reciprocal_rank=1 / first_rank if first_rank else 0.0,
        first_rank=first_rank,
    )


async def run_retrieval_eval(
    dataset: Dataset,
    retriever: SearchRetriever,
    *,
    k: int = 5,
    depth: int | None = None,
) -> RetrievalReport:
    """Score every row with ``cited_sources``. ``depth`` chunks are fetched (default 4 x k,
    at most 50) so that several chunks of one source do not crowd others out of the top k."""
    if k < 1:
        raise ValueError("k must be at least 1")
    fetch = min(MAX_SEARCH_DEPTH, max(k, depth or 4 * k))
    rows: list[RetrievalRow] = []
    for case in dataset.cases:
        expected = case.row.cited_sources
        if not expected:
            continue
        hits = await retriever.search(
            case.row.question.strip(), acl=user_acl(case.user), top_k=fetch
        )
        rows.append(score_sources(case.id, expected, distinct_sources(hits)[:k]))
    return RetrievalReport(dataset=dataset.name, k=k, rows=rows, split=dataset.split)


def retrieval_markdown(report: RetrievalReport) -> str:
    lines = [
        f"# Retrieval eval: {report.dataset}",
        "",
        f"split {report.split}: {len(report.rows)} rows with cited_sources; k = {report.k}; "
        f"mean recall@{report.k} {report.mean_recall:.3f}; MRR@{report.k} {report.mrr:.3f}",
        "",
        f"| id | recall@{report.k} | RR | first rank | missing | top sources |",
        "|---|---:|---:|---:|---|---|",
    ]
    for r in report.rows:
        missing = [e for e in r.expected if e not in r.found]
        lines.append(
            f"| `{r.id}` | {r.recall:.2f} | {r.reciprocal_rank:.2f} | {r.first_rank or '-'} "
            f"| {', '.join(missing) or '-'} | {', '.join(r.sources[:3]) or '-'} |"
        )
    return "\n".join(lines) + "\n"
