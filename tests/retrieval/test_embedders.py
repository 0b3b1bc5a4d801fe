"""The local embedder's weight precision: bfloat16 must give the same vectors as float32 to
within rounding, so documents embedded one way are found by queries embedded the other."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.embedders import SentenceTransformerEmbedder, build_embedder, native_bfloat16

TEXTS = [
    "alert cooldown",
    "How long is the alert cooldown by default, and what does it do?",
    "Occupancy sensors report people counts per room every minute. " * 12,
]


@pytest.fixture(scope="module")
def bf16() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder("all-MiniLM-L6-v2", dtype="bfloat16")


def test_bfloat16_vectors_match_float32_ones(
    minilm: SentenceTransformerEmbedder, bf16: SentenceTransformerEmbedder
) -> None:
    exact = minilm.encode(TEXTS)
    rounded = bf16.encode(TEXTS)
    assert minilm.dtype == "float32" and bf16.dtype == "bfloat16"
    assert rounded.dtype == np.float32 and rounded.shape == exact.shape
    # Pooling and normalisation stay float32: unit rows, cosine ~0.99995 (bf16 pooling: 0.998).
    assert np.allclose(np.linalg.norm(rounded, axis=1), 1.0, atol=1e-5)
    cosines = (exact * rounded).sum(axis=1)
    assert cosines.min() > 0.9995, cosines


def test_bfloat16_keeps_the_ranking(
    minilm: SentenceTransformerEmbedder, bf16: SentenceTransformerEmbedder
) -> None:
    passages = [
        "The alert cooldown is 15 minutes: an alert repeats at most once per cooldown.",
        "Buildings contain floors, floors contain rooms.",
        "Sensors are calibrated on installation.",
        "Export occupancy reports as CSV from the dashboard.",
    ]
    docs = minilm.encode(passages)
    for question in TEXTS[:2]:
        exact = np.argsort(-(docs @ minilm.encode([question])[0]))
        rounded = np.argsort(-(docs @ bf16.encode([question])[0]))
        assert exact.tolist() == rounded.tolist()


def test_auto_follows_the_cpu(settings_factory: object) -> None:
    settings = settings_factory(embedding_dtype="auto")  # type: ignore[operator]
    embedder = build_embedder(settings)
    assert isinstance(embedder, SentenceTransformerEmbedder)
    assert embedder.dtype == ("bfloat16" if native_bfloat16() else "float32")
    forced = build_embedder(settings_factory(embedding_dtype="float32"))  # type: ignore[operator]
    assert isinstance(forced, SentenceTransformerEmbedder) and forced.dtype == "float32"
