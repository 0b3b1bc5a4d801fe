"""The local embedder's weight precision: bfloat16 must give the same vectors as float32 to
within rounding, so documents embedded one way are found by queries embedded the other; and
batches encoded side by side give the rows one call each would."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from retrieval.embedders import (
    SentenceTransformerEmbedder,
    build_embedder,
    encode_batches,
    native_bfloat16,
    stream_count,
)
from serve_app.wiring import embedder_config

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
    embedder = build_embedder(embedder_config(settings))
    assert isinstance(embedder, SentenceTransformerEmbedder)
    assert embedder.dtype == ("bfloat16" if native_bfloat16() else "float32")
    forced = build_embedder(embedder_config(settings_factory(embedding_dtype="float32")))  # type: ignore[operator]
    assert isinstance(forced, SentenceTransformerEmbedder) and forced.dtype == "float32"


# --- encode streams: batches encoded side by side, each on its share of torch's threads ---

STREAM_BATCHES = [
    [
        f"Room {i} on floor {i % 7}: " + "occupancy sensors report people counts. " * (1 + i % 9)
        for i in range(start, start + 8)
    ]
    for start in range(0, 40, 8)
]


@pytest.fixture
def two_torch_threads() -> Iterator[None]:
    """Two torch threads for the test (streams need two), the caller's count restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def streamed() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder("all-MiniLM-L6-v2", batch_size=4, streams=0)


def _forward_threads(embedder: SentenceTransformerEmbedder) -> tuple[list[tuple[str, int]], Any]:
    """Records (thread name, torch threads) at every forward pass of the embedder's model."""
    import torch

    seen: list[tuple[str, int]] = []

    def record(*_: object) -> None:
        seen.append((threading.current_thread().name, torch.get_num_threads()))

    return seen, embedder._model[0].register_forward_pre_hook(record)


@pytest.mark.usefixtures("two_torch_threads")
def test_batches_side_by_side_come_back_in_order_as_one_call_each_would_give(
    minilm: SentenceTransformerEmbedder, streamed: SentenceTransformerEmbedder
) -> None:
    one_by_one = [minilm.encode(batch) for batch in STREAM_BATCHES]
    side_by_side = list(encode_batches(streamed, iter(STREAM_BATCHES)))
    assert len(side_by_side) == len(STREAM_BATCHES)
    for alone, streamed_rows in zip(one_by_one, side_by_side, strict=True):
        assert streamed_rows.shape == alone.shape and streamed_rows.dtype == np.float32
        assert ((alone * streamed_rows).sum(axis=1)).min() > 0.9999


@pytest.mark.usefixtures("two_torch_threads")
def test_each_stream_runs_on_its_own_thread_with_one_torch_thread_and_the_caller_keeps_two(
    streamed: SentenceTransformerEmbedder,
) -> None:
    import torch

    assert streamed.streams == 2
    seen, hook = _forward_threads(streamed)
    try:
        list(encode_batches(streamed, STREAM_BATCHES))
    finally:
        hook.remove()
    caller = threading.current_thread().name
    # The first batch alone, here (two forward passes of 4 texts): it sets the tokenizer up.
    assert seen[:2] == [(caller, 2)] * 2
    names = {name for name, _ in seen[2:]}
    assert len(names) == 2 and caller not in names
    assert {threads for _, threads in seen[2:]} == {1}
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_torch_threads")
def test_one_stream_encodes_on_the_callers_thread(minilm: SentenceTransformerEmbedder) -> None:
    assert minilm.streams == 1  # the constructor's default
    seen, hook = _forward_threads(minilm)
    try:
        list(encode_batches(minilm, STREAM_BATCHES[:3]))
    finally:
        hook.remove()
    assert seen == [(threading.current_thread().name, 2)] * 3  # a pass a batch of 8


@pytest.mark.usefixtures("two_torch_threads")
def test_a_failing_batch_raises_in_the_caller_and_torch_keeps_its_threads(
    streamed: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    encode = streamed.encode

    def fails_on_the_third(texts: Sequence[str]) -> Any:
        if texts is STREAM_BATCHES[2]:
            raise RuntimeError("the model ran out of memory")
        return encode(texts)

    monkeypatch.setattr(streamed, "encode", fails_on_the_third)
    with pytest.raises(RuntimeError, match="out of memory"):
        list(encode_batches(streamed, STREAM_BATCHES))
    assert torch.get_num_threads() == 2


def test_an_embedder_without_streams_encodes_one_batch_after_another() -> None:
    calls: list[list[str]] = []

    class Plain:
        name, dim, max_tokens = "plain", 2, 8

        def count_tokens(self, text: str) -> int:
            return len(text)

        def encode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
            calls.append(list(texts))
            return np.ones((len(texts), 2), dtype=np.float32)

        async def aencode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
            return self.encode(texts)

    out = list(encode_batches(Plain(), iter([["a"], ["b", "c"]])))
    assert [rows.shape for rows in out] == [(1, 2), (2, 2)] and calls == [["a"], ["b", "c"]]


def test_a_caller_that_stops_early_drops_the_batches_not_started() -> None:
    encoded: list[str] = []

    class Slow:
        name, dim, max_tokens, streams = "slow", 2, 8, 2

        def count_tokens(self, text: str) -> int:
            return len(text)

        def encode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
            time.sleep(0.05)
            encoded.extend(texts)
            return np.ones((len(texts), 2), dtype=np.float32)

        async def aencode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
            return self.encode(texts)

    batches = encode_batches(Slow(), ([f"batch {n}"] for n in range(40)))
    assert [next(batches).shape for _ in range(3)] == [(1, 2)] * 3
    batches.close()
    assert len(encoded) < 10  # the first, two streams' worth and their queue at most
    assert stream_count(0, 2) == 2 and stream_count(1, 2) == 1 and stream_count(4, 2) == 2
