"""The fusion and depth sweep (issue 16, item 4): its store cut and its choice, without a
database."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bench import retrieval_sweep as sweep
from retrieval.store import Candidate


def _candidate(cid: str, vector: int | None, keyword: int | None) -> Candidate:
    distance = None if vector is None else vector / 100
    return Candidate(cid, "s.md", None, "", "prose", cid, vector, keyword, distance)


class FakeStore:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    async def hybrid_candidates(
        self,
        query_text: str,
        query_vector: Any,
        acl: Sequence[str],
        *,
        k_vector: int,
        k_keyword: int,
    ) -> list[Candidate]:
        self.calls.append((k_vector, k_keyword))
        return [_candidate("a", 1, 3), _candidate("b", 3, None), _candidate("c", None, 1)]


async def test_deep_candidates_are_searched_once_and_cut_to_each_depth() -> None:
    inner = FakeStore()
    deep = sweep.DeepCandidates(inner, 80, 80)  # type: ignore[arg-type]
    vec = np.zeros(3, dtype=np.float32)
    full = await deep.hybrid_candidates("q", vec, ["x"], k_vector=80, k_keyword=80)
    cut = await deep.hybrid_candidates("q", vec, ["x"], k_vector=2, k_keyword=2)
    assert inner.calls == [(80, 80)]  # one real search per query and caller
    assert [(c.chunk_id, c.vector_rank, c.keyword_rank) for c in full] == [
        ("a", 1, 3),
        ("b", 3, None),
        ("c", None, 1),
    ]
    # b falls off the vector list (and out), a keeps its vector rank only, c its keyword rank.
    assert [(c.chunk_id, c.vector_rank, c.keyword_rank, c.distance) for c in cut] == [
        ("a", 1, None, 0.01),
        ("c", None, 1, None),
    ]


def _scored(
    point: sweep.Point, ndcg: float, exact: float, benchmark: str = sweep.SAMPLE
) -> sweep.Scored:
    return sweep.Scored(
        benchmark, point, ndcg, 0.0, 0.0, exact if benchmark == sweep.SAMPLE else None
    )


def test_the_choice_is_on_the_mean_with_an_exact_token_floor_and_fewest_changes() -> None:
    today = sweep.Point(200, "ts_rank_cd", 1000, 40, 40, 60, 1.0)
    better_but_exact_drops = sweep.Point(200, "ts_rank_cd", 1000, 40, 40, 60, 0.15)
    one_change = sweep.Point(200, "ts_rank", 1000, 40, 40, 60, 1.0)
    two_changes = sweep.Point(200, "ts_rank", 1000, 40, 40, 20, 1.0)
    known = "known-item 10000 (train)"
    results = [
        _scored(today, 0.60, 0.80),
        _scored(better_but_exact_drops, 0.70, 0.70),
        _scored(one_change, 0.650, 0.80),
        _scored(two_changes, 0.651, 0.81),
        *(
            _scored(dataclass_no_chunk(p), 0.40, 0.0, known)
            for p in (today, better_but_exact_drops, one_change, two_changes)
        ),
    ]
    chosen, base, ranked = sweep.choose(results, today)
    assert base.point == today and base.objective == 0.5
    assert chosen.point == one_change  # two_changes is within the tie and changes more
    assert ranked[0].point == better_but_exact_drops  # best mean, refused by the floor


def dataclass_no_chunk(point: sweep.Point) -> sweep.Point:
    import dataclasses

    return dataclasses.replace(point, chunk_max_tokens=0)


def test_another_chunk_size_has_to_earn_a_re_ingest() -> None:
    today = sweep.Point(200, "ts_rank_cd", 1000, 40, 40, 60, 1.0)
    rechunked = sweep.Point(300, "ts_rank_cd", 1000, 40, 40, 60, 1.0)
    tuned = sweep.Point(200, "ts_rank_cd", 1000, 40, 40, 10, 1.0)
    results = [_scored(today, 0.60, 0.8), _scored(rechunked, 0.655, 0.8), _scored(tuned, 0.65, 0.8)]
    assert sweep.choose(results, today)[0].point == tuned  # +0.005: not worth a re-ingest
    results[1] = _scored(rechunked, 0.67, 0.8)
    assert sweep.choose(results, today)[0].point == rechunked
