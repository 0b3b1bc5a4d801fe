"""Ranking metrics over retrieved sections, for the labelled retrieval benchmark.

The input is what a search returned, in order: one section key per chunk (``None`` for a
chunk of no labelled section). Two chunks of one section are two ranks, because they take
two of the model's slots, but a section counts once: its second chunk gains nothing, since
the model has already seen that section. So a search that fills the top five with one
section's chunks scores as it should, below one that brings five different answers.

* nDCG@k: graded gain (the label's grade: 2 answers, 1 related; linear, as trec_eval's
  ``ndcg``), discounted by log2(rank + 1), divided by the DCG of the ideal ranking (the
  row's labels, best first, one per rank).
* recall@k: the share of the row's answering sections (grade 2) among the top k.
* reciprocal rank: 1 / the rank of the first chunk of an answering section within k, else 0.
* hit@k: whether any answering section is within the top k (the model saw an answer).

``rank_scores`` computes all of them for one query from its final and deep lists; both the
labelled sample questions and the known-item tasks (one relevant passage a query) use it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)


def gains(ranked: Sequence[Key | None], grades: Mapping[Key, int]) -> list[int]:
    """The gain at each rank: a section's grade where it first appears, else 0."""
    seen: set[Key] = set()
    out: list[int] = []
    for key in ranked:
        fresh = key is not None and key not in seen
        out.append(grades.get(key, 0) if fresh and key is not None else 0)
        if key is not None:
            seen.add(key)
    return out


def dcg(values: Sequence[int]) -> float:
    return sum(gain / math.log2(rank + 1) for rank, gain in enumerate(values, 1))


def ndcg_at(ranked: Sequence[Key | None], grades: Mapping[Key, int], k: int) -> float:
    """nDCG@k of ``ranked`` against graded labels; undefined (ValueError) without any."""
    ideal = dcg(sorted((g for g in grades.values() if g > 0), reverse=True)[:k])
    if ideal == 0:
        raise ValueError("nDCG needs at least one label with a positive grade")
    return dcg(gains(ranked[:k], grades)) / ideal


def recall_at(ranked: Sequence[Key | None], relevant: Collection[Key], k: int) -> float:
    """The share of ``relevant`` found in the top ``k``; undefined (ValueError) without any."""
    if not relevant:
        raise ValueError("recall needs at least one relevant section")
    return len(set(ranked[:k]) & set(relevant)) / len(set(relevant))


def first_rank(ranked: Sequence[Key | None], relevant: Collection[Key], k: int) -> int | None:
    """1-based rank of the first chunk of a ``relevant`` section within ``k``, else None."""
    return next((i for i, key in enumerate(ranked[:k], 1) if key in relevant), None)


def reciprocal_rank_at(ranked: Sequence[Key | None], relevant: Collection[Key], k: int) -> float:
    rank = first_rank(ranked, relevant, k)
    return 1.0 / rank if rank else 0.0


@dataclass(frozen=True)
class RankScores:
    """One query's figures: nDCG and MRR on the deep list, recall and hit on the final one."""

    ndcg: float
    recall: float
    reciprocal_rank: float
    hit: bool
    first_answer: int | None  # 1-based rank of the first answering key within the deep cut


def rank_scores(
    final: Sequence[Key | None],
    deep: Sequence[Key | None],
    grades: Mapping[Key, int],
    answers: Collection[Key],
    *,
    final_k: int,
    deep_k: int,
) -> RankScores:
    """nDCG@deep_k (graded) and MRR@deep_k of ``deep``, recall@final_k and hit@final_k of
    ``final`` against the answering keys; undefined (ValueError) without an answer."""
    return RankScores(
        ndcg=ndcg_at(deep, grades, deep_k),
        recall=recall_at(final, answers, final_k),
        reciprocal_rank=reciprocal_rank_at(deep, answers, deep_k),
        hit=first_rank(final, answers, final_k) is not None,
        first_answer=first_rank(deep, answers, deep_k),
    )
