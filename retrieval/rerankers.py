"""The ``Reranker`` port: reorders fused candidates for a query.

``NoopReranker`` keeps the fused order (no cross-encoder ships offline, so it is the default
and says so once in the log). ``CrossEncoderReranker`` loads any sentence-transformers
``CrossEncoder`` by name (from a local cache or hub) or folder and scores pairs in batches;
``RERANKER_MODEL=trained`` names the one ``agent-service train-reranker`` builds under
``AGENT_SERVICE_HOME`` (``retrieval.reranker_training``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

log = logging.getLogger(__name__)

TRAINED_RERANKER = (
    "trained"  # RERANKER_MODEL alias: the folder `agent-service train-reranker` builds
)


def trained_model_dir(home: Path) -> Path:
    """Where ``agent-service train-reranker`` leaves its CrossEncoder folder."""
    return home / "models" / "reranker"


def resolve_reranker_model(name: str, home: Path) -> str:
    """``trained`` -> the folder ``agent-service train-reranker`` built under ``home`` (an
    error when it has not been built); any other name or folder unchanged."""
    if name != TRAINED_RERANKER:
        return name
    folder = trained_model_dir(home)
    if not (folder / "config.json").exists():
        raise RuntimeError(
            f"RERANKER_MODEL=trained: no trained reranker in {folder}; build it with "
            "`agent-service train-reranker`"
        )
    return str(folder)


@runtime_checkable
class Reranker(Protocol):
    @property
    def name(self) -> str: ...

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance score per passage (higher is better); None-free, same order."""
        ...

    async def ascore(self, query: str, passages: Sequence[str]) -> list[float]: ...


class NoopReranker:
    """Keeps the fused order: scores decrease with the input position."""

    name = "noop"

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        n = len(passages)
        return [float(n - i) for i in range(n)]

    async def ascore(self, query: str, passages: Sequence[str]) -> list[float]:
        return self.score(query, passages)


class CrossEncoderReranker:
    def __init__(self, model: str, *, batch_size: int = 32, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import CrossEncoder

        try:
            self._model: Any = CrossEncoder(model, device=device)
        except OSError as exc:
            raise RuntimeError(
                f"RERANKER_MODEL={model!r}: could not load a CrossEncoder offline ({exc})"
            ) from exc
        self._name = model
        self._batch_size = batch_size

    @property
    def name(self) -> str:
        return self._name

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        scores = self._model.predict(
            [(query, p) for p in passages], batch_size=self._batch_size, show_progress_bar=False
        )
        return [float(s) for s in scores]

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Many (query, passage) pairs at once: what a batching deployment calls."""
        if not pairs:
            return []
        scores = self._model.predict(
            list(pairs), batch_size=self._batch_size, show_progress_bar=False
        )
        return [float(s) for s in scores]

    async def ascore(self, query: str, passages: Sequence[str]) -> list[float]:
        return await asyncio.to_thread(self.score, query, passages)


@dataclass(frozen=True)
class RerankerConfig:
    """Which reranker to build (``build_reranker``): RERANKER and RERANKER_MODEL, and the
    service's home, where ``trained`` resolves (``resolve_reranker_model``)."""

    kind: Literal["noop", "cross-encoder"] = "noop"
    model: str | None = None  # a CrossEncoder name or folder, or ``trained``
    home: Path = Path(".agent-service")


def build_reranker(config: RerankerConfig) -> Reranker:
    if config.kind == "cross-encoder" and config.model:
        return CrossEncoderReranker(resolve_reranker_model(config.model, config.home))
    log.info(
        "reranker: noop (fused order kept). Set RERANKER=cross-encoder and RERANKER_MODEL to a "
        "sentence-transformers CrossEncoder name or folder (or `trained`: the one "
        "`agent-service train-reranker` builds) to rerank."
    )
    return NoopReranker()
