"""Ranking metrics of the labelled retrieval benchmark, against values computed by hand."""

from __future__ import annotations

import pytest

from evals.retrieval_metrics import (
    dcg,
    first_rank,
    gains,
    ndcg_at,
    rank_scores,
    recall_at,
    reciprocal_rank_at,
)

# A and C answer (2), B and D are related (1); x is a chunk of no labelled section.
GRADES = {"A": 2, "B": 1, "C": 2, "D": 1}
RANKED = ["A", "x", "B", "A", "C"]  # A's second chunk gains nothing


def test_a_section_gains_its_grade_once() -> None:
    assert gains(RANKED, GRADES) == [2, 0, 1, 0, 2]
    assert gains(["A", "A", None, "A"], GRADES) == [2, 0, 0, 0]


def test_dcg_by_hand() -> None:
    # 2/log2(2) + 1/log2(4) + 2/log2(6) = 2 + 0.5 + 0.773706
    assert dcg([2, 0, 1, 0, 2]) == pytest.approx(3.273706, abs=1e-6)


def test_ndcg_by_hand() -> None:
    # ideal: 2, 2, 1, 1 -> 2 + 2/log2(3) + 1/log2(4) + 1/log2(5) = 4.192536
    assert ndcg_at(RANKED, GRADES, 10) == pytest.approx(3.273706 / 4.192536, abs=1e-6)
    assert ndcg_at(["A", "C", "B", "D"], GRADES, 10) == pytest.approx(1.0)


def test_ndcg_counts_a_repeated_section_once() -> None:
    # three chunks of A: 2 / (2 + 2/log2(3)) = 0.613147, not above the ideal
    assert ndcg_at(["A", "A", "A"], {"A": 2, "B": 2}, 10) == pytest.approx(0.613147, abs=1e-6)


def test_ndcg_cuts_at_k() -> None:
    # only rank 1 counts at k=1; the ideal at k=1 is one grade-2 section
    assert ndcg_at(["B", "A"], GRADES, 1) == pytest.approx(0.5)
    # related only, second: (1/log2(3)) / (2 + 1/log2(3)) = 0.239812
    assert ndcg_at(["x", "B"], {"A": 2, "B": 1}, 10) == pytest.approx(0.239812, abs=1e-6)


def test_recall_is_the_share_of_answering_sections_in_the_top_k() -> None:
    answers = {"A", "C"}
    assert recall_at(RANKED, answers, 3) == 0.5  # A, not C
    assert recall_at(RANKED, answers, 5) == 1.0
    assert recall_at(["x", "B"], answers, 5) == 0.0


def test_reciprocal_rank_of_the_first_answering_chunk() -> None:
    assert reciprocal_rank_at(RANKED, {"A", "C"}, 10) == 1.0
    assert reciprocal_rank_at(["x", "B", "C"], {"A", "C"}, 10) == pytest.approx(1 / 3)
    assert reciprocal_rank_at(["x", "B", "C"], {"A", "C"}, 2) == 0.0
    assert first_rank(["x", "B", "C"], {"C"}, 10) == 3
    assert first_rank([], {"C"}, 10) is None


def test_undefined_without_labels() -> None:
    with pytest.raises(ValueError, match="nDCG"):
        ndcg_at(["A"], {}, 10)
    with pytest.raises(ValueError, match="recall"):
        recall_at(["A"], set(), 5)


def test_rank_scores_reads_the_final_and_the_deep_list() -> None:
    # final (top 3): x, B, A -> A answers at 3; deep: the RANKED list above
    scores = rank_scores(["x", "B", "A"], RANKED, GRADES, {"A", "C"}, final_k=3, deep_k=10)
    assert scores.ndcg == pytest.approx(3.273706 / 4.192536, abs=1e-6)
    assert scores.recall == 0.5  # A of A and C
    assert scores.reciprocal_rank == 1.0  # A first in the deep list
    assert scores.hit and scores.first_answer == 1
    missed = rank_scores(["x"], ["x", "B"], GRADES, {"A"}, final_k=5, deep_k=10)
    assert (missed.recall, missed.reciprocal_rank, missed.hit, missed.first_answer) == (
        0.0,
        0.0,
        False,
        None,
    )
