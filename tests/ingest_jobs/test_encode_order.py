"""What the in-process executor hands the embedder, and when a run drops the vector index
(``ingest_jobs.pipeline``): in-process fakes, no database."""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from foundation.settings import Settings
from ingest_jobs.pipeline import (
    DEFER_INDEX_MIN_CHUNKS,
    ENCODE_WINDOW_BATCHES,
    IngestOptions,
    _prefetched,
    defer_vector_index,
    run_ingest,
)
from retrieval import embedders
from retrieval.embedders import Vectors
from retrieval.search import embedding_input
from retrieval.store import DocumentRecord, StoredDocument, WriteOutcome
from serve_app.wiring import ingest_config


class RecordingEmbedder:
    """Zero vectors; remembers the texts of every ``encode`` call."""

    name = "recording"
    dim = 384
    max_tokens = 256

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def count_tokens(self, text: str) -> int:
        return max(1, len(text.split()))

    def encode(self, texts: Sequence[str]) -> np.ndarray:  # type: ignore[type-arg]
        self.calls.append(list(texts))
        return np.zeros((len(texts), self.dim), dtype=np.float32)

    async def aencode(self, texts: Sequence[str]) -> np.ndarray:  # type: ignore[type-arg]
        return self.encode(texts)


class MemoryStore:
    def __init__(self) -> None:
        self.written: list[str] = []

    async def documents(self) -> dict[str, StoredDocument]:
        return {}

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]:
        self.written.extend(doc.source for doc in docs)
        return ["new"] * len(docs)

    async def delete_sources(self, sources: object) -> int:
        return 0


async def test_documents_are_embedded_shortest_first_in_windows_of_several_batches(
    tmp_path: Path,
) -> None:
    rng = random.Random(7)
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(60):  # one short paragraph each: one chunk per page
        words = " ".join(f"word{rng.randrange(1000)}" for _ in range(rng.randrange(3, 40)))
        (root / f"page{i:02d}.md").write_text(words + "\n", encoding="utf-8")
    embedder, store = RecordingEmbedder(), MemoryStore()
    settings = Settings(agent_service_home=tmp_path / "home", embedding_backend="openai")
    options = IngestOptions(roots=[(root, [])], executor="local", batch_size=4, max_tokens=120)

    report = await run_ingest(store, ingest_config(settings), options, embedder=embedder)  # type: ignore[arg-type]

    assert report.new == 60
    assert sorted(Path(source).name for source in store.written) == [
        f"page{i:02d}.md" for i in range(60)
    ]
    window = 4 * ENCODE_WINDOW_BATCHES
    assert [len(call) for call in embedder.calls] == [window] * (60 // window) + [60 % window]
    lengths = [len(text) for call in embedder.calls for text in call]
    assert lengths == sorted(lengths)  # one chunk a page: the whole run is in length order


class SideBySideEmbedder(RecordingEmbedder):
    """A ``StreamingEmbedder`` of two streams whose batches finish out of order (the later
    one often first), each row a vector that names its own text."""

    streams = 2

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    def encode(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        time.sleep(random.Random(len(texts)).uniform(0, 0.02))
        return np.stack([_vector_of(text) for text in texts])


def _vector_of(text: str) -> Vectors:
    vector = np.zeros(384, dtype=np.float32)
    vector[zlib.crc32(text.encode()) % 384] = 1.0
    return vector


class RecordStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[DocumentRecord] = []

    async def write_documents(self, docs: Sequence[DocumentRecord]) -> list[WriteOutcome]:
        self.records.extend(docs)
        return await super().write_documents(docs)


def _pages_of_several_chunks(root: Path) -> None:
    root.mkdir()
    for i in range(40):  # several chunks a page, of different lengths
        sections = [
            f"## Part {j}\n\n" + f"page {i} part {j} says " * (3 + (i + j) % 20) for j in range(3)
        ]
        (root / f"page{i:02d}.md").write_text("\n\n".join(sections) + "\n", encoding="utf-8")


async def test_windows_encoded_side_by_side_keep_each_row_with_its_own_vector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedders, "STREAMS_MIN_CHUNKS", 100)  # streams for ~120 chunks
    root = tmp_path / "docs"
    _pages_of_several_chunks(root)
    embedder, store = SideBySideEmbedder(), RecordStore()
    settings = Settings(agent_service_home=tmp_path / "home", embedding_backend="openai")
    options = IngestOptions(roots=[(root, [])], executor="local", batch_size=2, max_tokens=40)

    report = await run_ingest(store, ingest_config(settings), options, embedder=embedder)  # type: ignore[arg-type]

    assert report.new == 40 and len(embedder.calls) > 4  # many windows, two at a time
    assert len(embedder.threads) == 3  # the first window on the feed's thread, then 2 streams
    chunks = [chunk for record in store.records for chunk in record.chunks]
    assert len(chunks) >= 120
    for chunk in chunks:
        assert (chunk.embedding == _vector_of(embedding_input(chunk.section, chunk.text))).all()


@pytest.mark.parametrize(
    ("setting", "new", "stored", "deferred"),
    [
        ("auto", DEFER_INDEX_MIN_CHUNKS, 0, True),  # a first ingest of a large corpus
        ("auto", DEFER_INDEX_MIN_CHUNKS - 1, 0, False),  # small: insert, keep the index
        ("auto", 25_000, 100_000, True),  # a quarter of the store
        ("auto", 24_999, 100_000, False),
        ("always", 1, 10**6, True),
        ("never", 10**6, 0, False),
    ],
)
def test_when_a_run_drops_the_vector_index(
    setting: str, new: int, stored: int, deferred: bool, tmp_path: Path
) -> None:
    settings = ingest_config(
        Settings(agent_service_home=tmp_path, ingest_defer_vector_index=setting)
    )
    assert defer_vector_index(settings, new, stored) is deferred


def test_prefetching_keeps_the_order_and_raises_the_producers_error_in_the_consumer() -> None:
    def produce() -> Iterator[int]:
        yield from range(5)
        raise OSError("page changed while it was read")

    seen: list[int] = []
    with pytest.raises(OSError, match="page changed"):
        for item in _prefetched(produce()):
            seen.append(item)
    assert seen == [0, 1, 2, 3, 4]


def test_a_consumer_that_stops_early_stops_the_producer() -> None:
    produced: list[int] = []
    stopped = threading.Event()

    def produce() -> Iterator[int]:
        try:
            for n in range(1_000):
                produced.append(n)
                yield n
        finally:
            stopped.set()

    items = _prefetched(produce())
    assert next(items) == 0
    items.close()

    assert stopped.wait(timeout=5)
    assert len(produced) <= 3  # one handed over, one queued, one waiting to be


async def test_a_small_run_encodes_one_window_at_a_time(tmp_path: Path) -> None:
    """Below ``STREAMS_MIN_CHUNKS`` the lone first and last windows cost more than streams
    save: every window on one thread."""
    root = tmp_path / "docs"
    _pages_of_several_chunks(root)
    embedder = SideBySideEmbedder()
    settings = Settings(agent_service_home=tmp_path / "home", embedding_backend="openai")
    options = IngestOptions(roots=[(root, [])], executor="local", batch_size=2, max_tokens=40)

    report = await run_ingest(RecordStore(), ingest_config(settings), options, embedder=embedder)  # type: ignore[arg-type]

    assert report.new == 40 and len(embedder.calls) > 4 and len(embedder.threads) == 1
