"""``tests/embedding_cache.CachedEmbedder``: the same vectors as the model, kept between
sessions, and a stale file is caught."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from retrieval.embedders import Vectors
from tests.embedding_cache import CachedEmbedder
from tests.ingest_jobs.corpus import HashedEmbedder


class CountingEmbedder(HashedEmbedder):
    def __init__(self) -> None:
        self.asked: list[str] = []

    def encode(self, texts: Sequence[str]) -> Vectors:
        self.asked += texts
        return super().encode(texts)


def test_vectors_equal_the_models_and_survive_a_new_session(tmp_path: Path) -> None:
    texts = ["occupancy alert", "cooldown", "occupancy alert", "dock door"]
    inner = CountingEmbedder()
    first = CachedEmbedder(inner, tmp_path)
    got = first.encode(texts)
    assert got.dtype == np.float32 and got.shape == (4, inner.dim)
    np.testing.assert_array_equal(got, HashedEmbedder().encode(texts))
    assert inner.asked == ["occupancy alert", "cooldown", "dock door"]  # each text once
    assert (first.misses, first.hits) == (3, 1)  # the repeat is not asked again
    first.save()

    later = CountingEmbedder()
    second = CachedEmbedder(later, tmp_path)
    np.testing.assert_array_equal(second.encode(texts[::-1]), HashedEmbedder().encode(texts[::-1]))
    assert later.asked == [] and (second.misses, second.hits) == (0, 4)
    second.encode(["a new chunk"])
    assert later.asked == ["a new chunk"]
    second.check_against_model()
    assert second.encode([]).shape == (0, inner.dim)


def test_a_stale_file_fails_the_check(tmp_path: Path) -> None:
    first = CachedEmbedder(HashedEmbedder(), tmp_path)
    first.encode(["occupancy alert", "cooldown"])
    first.save()

    class Drifted(HashedEmbedder):
        def encode(self, texts: Sequence[str]) -> Vectors:
            return -super().encode(texts)

    second = CachedEmbedder(Drifted(), tmp_path)
    second.encode(["occupancy alert", "cooldown"])
    with pytest.raises(AssertionError, match="stale embedding cache"):
        second.check_against_model()


def test_a_torn_file_is_ignored(tmp_path: Path) -> None:
    inner = HashedEmbedder()
    first = CachedEmbedder(inner, tmp_path)
    first.encode(["x"])
    first.save()
    next(tmp_path.iterdir()).write_bytes(b"not an npz")
    again = CachedEmbedder(CountingEmbedder(), tmp_path)
    again.encode(["x"])
    assert again.misses == 1
