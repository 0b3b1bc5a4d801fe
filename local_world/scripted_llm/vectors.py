"""Deterministic embeddings: hashed bag of words plus character trigrams, L2-normalised."""

from __future__ import annotations

import hashlib
import math
import re

DEFAULT_EMBEDDING_DIM = 384
WORD = re.compile(r"[a-z0-9]+")


def _features(text: str) -> list[tuple[str, float]]:
    words = WORD.findall(text.lower())
    features: list[tuple[str, float]] = []
    for word in words:
        features.append(("w:" + word, 1.0))
        padded = f"#{word}#"
        for i in range(len(padded) - 2):
            features.append(("c:" + padded[i : i + 3], 0.35))
    if not features:
        features.append(("raw:" + text, 1.0))
    return features


def embed_text(text: str, dimensions: int = DEFAULT_EMBEDDING_DIM) -> list[float]:
    """Deterministic, L2-normalised hashed bag of words (plus character trigrams).

    Texts sharing words or word fragments get a high cosine similarity; the same text always
    gets the same vector, whatever the process.
    """
    vector = [0.0] * dimensions
    for feature, weight in _features(text):
        digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
        number = int.from_bytes(digest, "big")
        sign = 1.0 if number & 1 else -1.0
        vector[(number >> 1) % dimensions] += sign * weight
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]
