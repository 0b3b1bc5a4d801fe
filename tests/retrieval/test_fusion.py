from __future__ import annotations

import pytest

from retrieval.fusion import rrf_fuse, rrf_score
from retrieval.search import fuse_candidates
from retrieval.store import Candidate


def test_rrf_score_is_sum_of_reciprocal_ranks() -> None:
    assert rrf_score([1, 1], k=60) == pytest.approx(2 / 61)
    assert rrf_score([1, None], k=60) == pytest.approx(1 / 61)
    assert rrf_score([None, None]) == 0.0


def test_item_ranked_well_by_both_lists_wins() -> None:
    fused = rrf_fuse([["a", "b", "c"], ["b", "c", "a"]], k=60)
    assert [item for item, _ in fused] == ["b", "a", "c"]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)


def test_k_controls_how_much_top_ranks_dominate() -> None:
    # With a small k, first place in one list beats middling places in both.
    lists = [["x", "a", "b", "m"], ["y", "c", "d", "m"]]
    assert rrf_fuse(lists, k=1)[0][0] == "x"
    big = dict(rrf_fuse(lists, k=1000))
    assert big["m"] > big["x"]


def test_ties_are_deterministic_and_duplicates_count_once() -> None:
    assert [i for i, _ in rrf_fuse([["a"], ["b"]])] == ["a", "b"]
    assert dict(rrf_fuse([["a", "a", "b"]]))["a"] == pytest.approx(1 / 61)


def test_invalid_k() -> None:
    with pytest.raises(ValueError):
        rrf_fuse([["a"]], k=0)


def _cand(cid: str, v: int | None, k: int | None) -> Candidate:
    return Candidate(cid, "s.md", None, "", "prose", "t", v, k, None)


def test_fuse_candidates_uses_both_rank_columns() -> None:
    fused = fuse_candidates(
        [_cand("vec-only", 1, None), _cand("both", 3, 2), _cand("kw-only", None, 1)], 60
    )
    assert [c.chunk_id for c, _ in fused] == ["both", "vec-only", "kw-only"]


def test_weighted_rrf_scales_each_lists_term() -> None:
    assert rrf_score([1, 1], k=60, weights=[1.0, 0.5]) == pytest.approx(1.5 / 61)
    assert rrf_score([None, 2], k=60, weights=[1.0, 0.25]) == pytest.approx(0.25 / 62)
    with pytest.raises(ValueError):
        rrf_score([1, 1], weights=[1.0])


def test_a_lighter_keyword_list_lets_the_vector_order_lead() -> None:
    candidates = [_cand("vec-1", 1, None), _cand("vec-30-kw-1", 30, 1), _cand("kw-only", None, 1)]
    equal = [c.chunk_id for c, _ in fuse_candidates(candidates, 60)]
    assert equal == ["vec-30-kw-1", "vec-1", "kw-only"]
    light = [c.chunk_id for c, _ in fuse_candidates(candidates, 60, keyword_weight=0.3)]
    assert light == ["vec-1", "vec-30-kw-1", "kw-only"]
