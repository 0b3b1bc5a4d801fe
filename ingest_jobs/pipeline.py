"""The ingestion job: discover -> read/hash/skip -> chunk -> embed -> write.

The driver reads and hashes every source and compares fingerprints with the store, so
unchanged documents cost one file read; it keeps one page's text at a time (the executors
read each changed page again and check its hash). The driver writes whole documents, each
with all of its chunks, several to a transaction once their last chunks are embedded
(:func:`collect_documents`): a crash leaves only whole documents, and a re-run finishes the
job.

``executor="local"`` chunks and embeds in-process; ``executor="ray"`` runs the Ray Data job
(:mod:`ingest_jobs.ray_executor`) on a local Ray or, under ``ray job submit``, on the
cluster; ``executor="auto"`` (the default) picks by the work (:func:`choose_executor`). Any
failure part-way raises :class:`IngestFailed`: what failed, what was written, what was not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
from opentelemetry import context as otel_context

from foundation.observability import attributes as attr
from foundation.observability.spans import tracer
from ingest_jobs.config import IngestConfig
from ingest_jobs.ray_executor import RayChild, RayWork, start_ray_child
from ingest_jobs.sources import (
    PreparedSource,
    SkippedSource,
    SourceFile,
    chunk_rows,
    discover,
    prepare,
    read_body,
)
from ingest_jobs.token_counts import token_counter
from retrieval.chunking import Chunk, chunk_markdown
from retrieval.embedders import (
    Embedder,
    build_embedder,
    encode_batches,
    resolve_local_model,
    streams_pay,
)
from retrieval.search import embedding_input
from retrieval.store import (
    ChunkRecord,
    DocumentRecord,
    DocumentStore,
    StoredDocument,
    VectorIndexOwner,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")

Executor = Literal["ray", "local", "auto"]


@dataclass
class IngestReport:
    discovered: int = 0
    new: int = 0
    unchanged: int = 0
    replaced: int = 0
    pruned: int = 0
    skipped: int = 0
    chunks_written: int = 0
    seconds: float = 0.0
    skip_reasons: list[str] = field(default_factory=list)
    executor: str = ""  # the one that ran ("" when nothing needed embedding)

    def as_dict(self) -> dict[str, object]:
        return {
            "discovered": self.discovered,
            "new": self.new,
            "unchanged": self.unchanged,
            "replaced": self.replaced,
            "pruned": self.pruned,
            "skipped": self.skipped,
            "chunks_written": self.chunks_written,
            "seconds": round(self.seconds, 3),
            "skip_reasons": list(self.skip_reasons),
            "executor": self.executor,
        }


@dataclass(frozen=True)
class IngestOptions:
    roots: Sequence[tuple[Path, Sequence[str]]]
    prune: bool = False
    executor: Executor = "auto"
    embed_actors: int = 1
    batch_size: int = 32
    max_tokens: int = 200


ProgressCallback = Callable[[str, int, int], None]  # (event, done, total)


@dataclass(frozen=True)
class IngestProgress:
    """Where a run is, for a progress display (``run_ingest(detail=...)``): the sources found
    under the roots and those needing no work, the documents to ingest (new or changed) with
    the chunks counted for them, the chunks embedded so far, and what is written."""

    discovered: int = 0
    unchanged: int = 0
    skipped: int = 0
    documents: int = 0  # new or changed: chunked, embedded and written by this run
    chunks: int = 0  # the documents' chunks, as counted before embedding
    chunks_embedded: int = 0  # rows back from the executor (a retried task's repeats too)
    documents_written: int = 0
    chunks_written: int = 0


ProgressDetail = Callable[[IngestProgress], None]

NOT_INGESTED_SHOWN = 5  # sources a failure message names (the report lists them all)
# Finished documents written in one transaction at most (whole documents only; a batch is
# written as soon as the writer has caught up with the embedder, full or not).
WRITE_BATCH_DOCUMENTS = 64
WRITE_BATCH_CHUNKS = 512
# Batches handed to one ``Embedder.encode`` call. sentence-transformers sorts a call's texts
# by length before cutting its batches, so a window of several batches pads far less than
# batches cut in file order (3,000 docstring paragraphs here: 65 chunks/s in batches of 32,
# 113/s in windows of 256, 128/s sorted whole). The documents themselves go to the executors
# shortest first (``mean_input_chars``), so neighbouring windows hold similar lengths too.
ENCODE_WINDOW_BATCHES = 8


class IngestFailed(RuntimeError):
    """The pipeline (or its Ray node) failed part-way. The store holds whole documents only;
    ``report`` counts what was written, ``not_ingested`` lists the sources that were not, and a
    re-run finishes the job (written documents are then unchanged)."""

    def __init__(self, cause: BaseException, report: IngestReport, not_ingested: list[str]):
        self.report = report
        self.not_ingested = not_ingested
        first_line = (str(cause).strip().splitlines() or [""])[0]
        self.cause = f"{type(cause).__name__}: {first_line}" if first_line else type(cause).__name__
        super().__init__(
            f"ingestion failed ({report.executor or 'before embedding'}): {self.cause}. "
            f"{report.new + report.replaced} document(s) written whole, "
            f"{len(not_ingested)} not ingested{_first_few(not_ingested)}; "
            "run the same command again to finish"
        )


def _first_few(sources: list[str]) -> str:
    if not sources:
        return ""
    more = len(sources) - NOT_INGESTED_SHOWN
    return f" ({', '.join(sources[:NOT_INGESTED_SHOWN])}{f' and {more} more' if more > 0 else ''})"


def choose_executor(requested: Executor, chunks: int, config: IngestConfig) -> Executor:
    """The executor for a run of ``chunks`` chunks. ``auto``: Ray Data on a running cluster
    (``RAY_ADDRESS``: ``ray job submit``, ``POST /ingest``), else in-process below
    ``INGEST_RAY_MIN_CHUNKS``. Measured on the 2-core machine (bench/RESULTS.md "Executor
    choice"): a private Ray costs ~20 s before the first chunk and then embeds at ~0.85x the
    in-process rate, so small and medium corpora are several times faster in-process."""
    if requested != "auto":
        return requested
    if config.ray_address:
        return "ray"
    return "ray" if chunks >= config.ray_min_chunks else "local"


# ``INGEST_DEFER_VECTOR_INDEX=auto``: a run embedding fewer chunks inserts into the index (a
# build over the whole store would cost more than it saves, and live searches keep the index).
DEFER_INDEX_MIN_CHUNKS = 2_000


def defer_vector_index(config: IngestConfig, new_chunks: int, stored_chunks: int) -> bool:
    """Whether a run writing ``new_chunks`` into a store of ``stored_chunks`` drops the vector
    index and builds it after. Building costs ~0.4 ms of CPU per vector of the whole store,
    inserting ~2 ms per new vector (10,000 vectors on this machine), so ``auto`` defers from a
    quarter of the store's size."""
    if config.defer_vector_index != "auto":
        return config.defer_vector_index == "always"
    return new_chunks >= DEFER_INDEX_MIN_CHUNKS and 4 * new_chunks >= stored_chunks


@asynccontextmanager
async def vector_index_for(
    store: DocumentStore, config: IngestConfig, new_chunks: int, stored_chunks: int
) -> AsyncIterator[None]:
    """Around a run's writes: the vector index dropped for a bulk load and built after (also
    when the run fails: the original error wins), or built first if a run killed during its
    bulk load left it missing. A run with nothing to embed leaves it alone (``db up`` mends
    it too)."""
    if not isinstance(store, VectorIndexOwner) or new_chunks == 0:
        yield
        return
    deferred = defer_vector_index(config, new_chunks, stored_chunks)
    if deferred:
        await store.drop_vector_index()
    else:
        await _build_vector_index(store)
    try:
        yield
    except BaseException:
        if deferred:
            with contextlib.suppress(Exception):
                await _build_vector_index(store)
        raise
    if deferred:
        await _build_vector_index(store)


async def _build_vector_index(store: VectorIndexOwner) -> None:
    with tracer().start_as_current_span("ingest.index") as span:
        built = await store.build_vector_index()
        span.set_attribute("ingest.index_built", built)
    if built:
        log.info("built the vector index")


def effective_max_tokens(config: IngestConfig, embedder_max_tokens: int) -> int:
    """The chunk budget, kept under the embedder's window with room for the section path."""
    return max(16, min(config.chunk_max_tokens, embedder_max_tokens - 48))


def mean_input_chars(chunks: Sequence[Chunk]) -> float:
    """How long a document's embedding inputs are on average: documents go to the executors
    in this order (shortest first), so each encode call holds texts of similar lengths and
    pads little (``ENCODE_WINDOW_BATCHES``)."""
    return sum(len(embedding_input(c.section, c.text)) for c in chunks) / max(1, len(chunks))


@dataclass(frozen=True)
class _Counted:
    """A source to embed, as the driver counted it (its text dropped)."""

    doc: PreparedSource
    chunks: int
    mean_chars: float  # ``mean_input_chars``: the order documents go to the executors in
    text_chars: int


def _survey(
    file: SourceFile,
    *,
    counter: Callable[[str], int],
    stored: Mapping[str, StoredDocument],
    embedder_name: str,
    max_tokens: int,
) -> _Counted | SkippedSource | None:
    """One source read, hashed and, when it changed, chunked to count: None if unchanged."""
    prepared = prepare(file, embedder_name=embedder_name, max_tokens=max_tokens)
    if isinstance(prepared, SkippedSource):
        return prepared
    old = stored.get(prepared.source)
    if old is not None and old.fingerprint == prepared.fingerprint:
        return None
    chunks = chunk_markdown(prepared.body, counter, max_tokens) if prepared.body.strip() else []
    light = dataclasses.replace(prepared, body="")
    return _Counted(light, len(chunks), mean_input_chars(chunks), len(prepared.body))


@dataclass
class _Counts:
    """What needs writing, as the driver counted it (texts dropped: memory holds one
    document's text at a time, not the corpus; the executors read each file again and check
    it is the one hashed here)."""

    pending: dict[str, PreparedSource] = field(default_factory=dict)  # to embed, by source
    lengths: dict[str, float] = field(default_factory=dict)  # source -> ``mean_input_chars``
    empty: list[PreparedSource] = field(default_factory=list)  # no chunks: never embedded
    chunks: int = 0
    text_chars: int = 0

    @classmethod
    def of(
        cls, surveyed: Iterable[_Counted | SkippedSource | None], report: IngestReport
    ) -> _Counts:
        """The sources ``_survey`` found; skipped and unchanged ones are counted in ``report``."""
        counts = cls()
        for found in surveyed:
            if isinstance(found, SkippedSource):
                report.skipped += 1
                report.skip_reasons.append(found.reason)
                log.warning("%s", found.reason)
            elif found is None:
                report.unchanged += 1
            elif found.chunks:
                counts.chunks += found.chunks
                counts.text_chars += found.text_chars
                counts.pending[found.doc.source] = found.doc
                counts.lengths[found.doc.source] = found.mean_chars
            else:
                counts.empty.append(found.doc)
        return counts

    def in_order(self) -> list[PreparedSource]:
        """The documents to embed, shortest first (``mean_input_chars``)."""
        return sorted(self.pending.values(), key=lambda doc: (self.lengths[doc.source], doc.source))

    def ray_work(self, options: IngestOptions) -> RayWork:
        return RayWork.of(
            self.in_order(), self.chunks, self.text_chars, options.max_tokens, options.embed_actors
        )


def _text(doc: PreparedSource) -> str:
    """A pending document's text: dropped once counted, read again (and checked) here."""
    assert doc.path is not None, "pending documents are prepared from files"
    return read_body(doc.path, doc.source, doc.content_hash)


def _iter_local(
    docs: Sequence[PreparedSource],
    embedder: Embedder,
    tokenizer_path: str | None,
    options: IngestOptions,
    chunks: int,
) -> Iterator[dict[str, Any]]:
    counter = token_counter(tokenizer_path) if tokenizer_path else embedder.count_tokens
    window = options.batch_size * ENCODE_WINDOW_BATCHES
    encoding: deque[list[dict[str, Any]]] = deque()  # the windows whose vectors are due next

    def texts() -> Iterator[list[str]]:
        # The next window is read and chunked on a thread of its own while this one encodes:
        # one after the other they left the embedder idle ~2.5% of a 10,000-page run.
        for rows in _prefetched(_windows(docs, counter, options.max_tokens, window)):
            encoding.append(rows)
            yield [embedding_input(r["section"], r["text"]) for r in rows]

    # Windows encode side by side where the embedder can (a local model: one per torch
    # thread), so the writer and the database slow one stream, not every layer of one pass.
    for vectors in encode_batches(embedder, texts(), streams=None if streams_pay(chunks) else 1):
        rows = encoding.popleft()
        for row, vec in zip(rows, vectors, strict=True):
            yield {**row, "embedding": vec}


def _windows(
    docs: Sequence[PreparedSource],
    counter: Callable[[str], int],
    max_tokens: int,
    window: int,
) -> Iterator[list[dict[str, Any]]]:
    """The documents' chunk rows, ``window`` at a time (the last window may be shorter)."""
    rows: list[dict[str, Any]] = []
    for doc in docs:
        with_text = dataclasses.replace(doc, body=_text(doc))
        rows.extend(chunk_rows(with_text, counter, max_tokens))
        while len(rows) >= window:
            batch, rows = rows[:window], rows[window:]
            yield batch
    if rows:
        yield rows


# What a draining thread queues: ("item", x) per item, then ("done", None), or ("error", exc).
_Entry = tuple[Literal["item", "done", "error"], Any]


def _drain_on_thread(
    items: Iterator[Any], ready: queue.Queue[_Entry], stop: threading.Event, name: str
) -> None:
    """Starts a daemon thread that puts ``items`` into ``ready`` (``_Entry``); it gives up at
    its next entry once ``stop`` is set (the consumer is gone)."""

    def offer(entry: _Entry) -> bool:
        """Queue ``entry`` unless the consumer has stopped (False)."""
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                ready.put(entry, timeout=0.5)
                return True
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(("item", item)):
                    return
            offer(("done", None))
        except BaseException as exc:
            offer(("error", exc))

    threading.Thread(target=produce, name=name, daemon=True).start()


def _prefetched(items: Iterator[_T]) -> Generator[_T, None, None]:
    """``items``, produced one ahead on a daemon thread; its exception is raised here. A
    consumer that stops early stops the producer at its next item."""
    ready: queue.Queue[_Entry] = queue.Queue(maxsize=1)
    stop = threading.Event()
    _drain_on_thread(items, ready, stop, "ingest-chunks")
    try:
        while True:
            kind, payload = ready.get()
            if kind == "done":
                return
            if kind == "error":
                raise payload
            yield payload
    finally:
        stop.set()


class _RowFeed:
    """Drains a blocking iterator on a thread so the async writer keeps going meanwhile."""

    def __init__(self, iterator: Iterator[dict[str, Any]]) -> None:
        self._queue: queue.Queue[_Entry] = queue.Queue(maxsize=256)
        _drain_on_thread(iterator, self._queue, threading.Event(), "ingest-rows")

    def idle(self) -> bool:
        """No row is waiting: the writer has caught up with the embedder."""
        return self._queue.empty()

    async def rows(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            try:  # rows already waiting cost no thread hop; only an empty queue is waited on
                kind, payload = self._queue.get_nowait()
            except queue.Empty:
                kind, payload = await asyncio.to_thread(self._queue.get)
            if kind == "done":
                return
            if kind == "error":
                raise payload
            assert isinstance(payload, dict)
            yield payload


Batch = list[tuple[PreparedSource, list[dict[str, Any]]]]  # finished documents and their rows


def _full(batch: Batch) -> bool:
    """A write batch at its size limit (documents or chunks)."""
    chunks = sum(len(rows) for _, rows in batch)
    return len(batch) >= WRITE_BATCH_DOCUMENTS or chunks >= WRITE_BATCH_CHUNKS


class RowSource(Protocol):
    """What ``collect_documents`` reads: embedded rows, and whether none is waiting right now."""

    def idle(self) -> bool: ...

    def rows(self) -> AsyncIterator[dict[str, Any]]: ...


class _CountedFeed:
    """A ``RowSource`` that calls ``on_row`` for each row it passes on."""

    def __init__(self, feed: RowSource, on_row: Callable[[], None]) -> None:
        self._feed = feed
        self._on_row = on_row

    def idle(self) -> bool:
        return self._feed.idle()

    async def rows(self) -> AsyncIterator[dict[str, Any]]:
        async for row in self._feed.rows():
            self._on_row()
            yield row


async def collect_documents(
    feed: RowSource,
    pending: dict[str, PreparedSource],
    write: Callable[[Batch], Awaitable[None]],
) -> None:
    """Rows in, whole documents out: a document is finished once all its chunks arrived
    (keyed by ordinal: a Ray task retried after its worker died may repeat rows). Finished
    documents wait while more rows are ready and are written together once the writer has
    caught up with the embedder (or the batch is full): one commit per embedder batch, not
    one per page. A document leaves ``pending`` once its batch committed; when the pipeline
    fails, what it finished is written before the failure is raised."""
    rows_by_source: dict[str, dict[int, dict[str, Any]]] = {}
    ready: Batch = []
    finished: set[str] = set()  # in ``ready`` or written

    async def flush() -> None:
        await write(ready)
        for doc, _ in ready:
            del pending[doc.source]
        ready.clear()

    failure: Exception | None = None
    rows = feed.rows()
    while True:
        try:
            item = await anext(rows)
        except StopAsyncIteration:
            break
        except Exception as exc:
            failure = exc
            break
        source = str(item["source"])
        if source in finished or source not in pending:
            continue  # a repeat of a document already finished
        bucket = rows_by_source.setdefault(source, {})
        bucket[int(item["ordinal"])] = item
        if len(bucket) == int(item["n_chunks"]):
            ready.append((pending[source], list(rows_by_source.pop(source).values())))
            finished.add(source)
            if feed.idle() or _full(ready):
                await flush()
    if ready:
        await flush()
    if failure is not None:
        raise failure


def _record(doc: PreparedSource, rows: list[dict[str, Any]]) -> DocumentRecord:
    rows.sort(key=lambda r: int(r["ordinal"]))
    chunks = [
        ChunkRecord(
            id=str(r["id"]),
            ordinal=int(r["ordinal"]),
            text=str(r["text"]),
            section=str(r["section"]),
            kind=str(r["kind"]),
            token_count=int(r["token_count"]),
            embedding=np.asarray(r["embedding"], dtype=np.float32),
            metadata={"oversized": True} if bool(r["oversized"]) else {},
        )
        for r in rows
    ]
    return DocumentRecord(
        source=doc.source,
        title=doc.title,
        content_hash=doc.content_hash,
        fingerprint=doc.fingerprint,
        permissions=doc.permissions,
        chunks=chunks,
        metadata=doc.metadata,
    )


@contextlib.contextmanager
def _ray_child_ahead(
    options: IngestOptions,
    config: IngestConfig,
    tokenizer_path: str | None,
    files: Sequence[SourceFile],
) -> Iterator[RayChild | None]:
    """The Ray pipeline's process, started before the corpus is counted when the run is sure
    to go to Ray (``--executor ray``, or ``auto`` on a running cluster) and has sources; ended
    at the block's exit (told there is no work if its rows were never asked for: nothing
    changed)."""
    ray_sure = options.executor == "ray" or (
        options.executor == "auto" and choose_executor("auto", 0, config) == "ray"
    )
    child = start_ray_child(config, tokenizer_path) if ray_sure and files else None
    try:
        yield child
    finally:
        if child is not None:
            child.close()


async def run_ingest(
    store: DocumentStore,
    config: IngestConfig,
    options: IngestOptions,
    *,
    embedder: Embedder | None = None,
    progress: ProgressCallback | None = None,
    detail: ProgressDetail | None = None,
) -> IngestReport:
    """Bring the store in line with the sources under ``options.roots``.

    ``progress`` hears ``(event, done, total)`` in documents ("start", "document" per
    write, "done"); ``detail`` hears the same moments, and each embedded chunk, as an
    :class:`IngestProgress` (what was found, what is to ingest, embedded and written).

    Traced as its own trace (an ``ingest.run`` root, whatever the caller's context), with
    ``ingest.discover``, ``ingest.embed`` (chunking and embedding, Ray Data or in-process) and
    one ``ingest.write`` per document."""
    with tracer().start_as_current_span(
        "ingest.run",
        context=otel_context.Context(),
        attributes={attr.LANGFUSE_TYPE: "span", "ingest.executor": options.executor},
    ) as span:
        report = await _run_ingest(
            store, config, options, embedder=embedder, progress=progress, detail=detail
        )
        for key, value in report.as_dict().items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                span.set_attribute(f"ingest.{key}", value)
        return report


async def _run_ingest(
    store: DocumentStore,
    config: IngestConfig,
    options: IngestOptions,
    *,
    embedder: Embedder | None,
    progress: ProgressCallback | None,
    detail: ProgressDetail | None,
) -> IngestReport:
    started = time.perf_counter()
    report = IngestReport()
    on_progress = progress or (lambda event, done, total: None)
    now = IngestProgress()  # what ``detail`` heard last
    chunks_to_embed = 0

    def notify(event: str, done: int, total: int) -> None:
        on_progress(event, done, total)
        show(
            discovered=report.discovered,
            unchanged=report.unchanged,
            skipped=report.skipped,
            documents=total,
            chunks=chunks_to_embed,
            documents_written=done,
            chunks_written=report.chunks_written,
        )

    def show(**changed: int) -> None:
        nonlocal now
        if detail is not None:
            now = dataclasses.replace(now, **changed)
            detail(now)

    def embedded() -> None:
        show(chunks_embedded=now.chunks_embedded + 1)

    with tracer().start_as_current_span("ingest.discover") as span:
        files: list[SourceFile] = discover(options.roots)
        report.discovered = len(files)
        stored = await store.documents()
        span.set_attribute("ingest.discovered", len(files))
    embedder_name = config.embedder.model if embedder is None else embedder.name
    if embedder_name in {"sentence-transformers/all-MiniLM-L6-v2"}:
        embedder_name = "all-MiniLM-L6-v2"

    tokenizer_path = (
        resolve_local_model(config.embedder.model)
        if config.embedder.backend == "sentence-transformers"
        else None
    )
    counter = token_counter(tokenizer_path)
    # The Ray pipeline's process joins Ray while this one counts the corpus (when Ray is sure
    # to run it): the join and the process's start no longer wait for the count.
    with contextlib.ExitStack() as children:
        # Ended after the vector index is built: a child leaves Ray meanwhile.
        ray_child = children.enter_context(_ray_child_ahead(options, config, tokenizer_path, files))
        survey = functools.partial(
            _survey,
            counter=counter,
            stored=stored,
            embedder_name=embedder_name,
            max_tokens=options.max_tokens,
        )
        counted = _Counts.of(map(survey, files), report)
        pending = counted.pending
        total = len(pending) + len(counted.empty)
        chunks_to_embed = counted.chunks
        notify("start", 0, total)

        async def write(batch: Batch) -> None:
            """Whole documents, in one transaction (``DocumentStore.write_documents``)."""
            records = [_record(doc, rows) for doc, rows in batch]
            n_chunks = sum(len(record.chunks) for record in records)
            with tracer().start_as_current_span(
                "ingest.write",
                attributes={
                    "ingest.documents": len(records),
                    "ingest.chunks": n_chunks,
                    "ingest.source": records[0].source,
                },
            ) as span:
                outcomes = await store.write_documents(records)
                span.set_attribute("ingest.new", outcomes.count("new"))
                span.set_attribute("ingest.replaced", outcomes.count("replaced"))
            report.new += outcomes.count("new")
            report.replaced += outcomes.count("replaced")
            report.chunks_written += n_chunks
            notify("document", report.new + report.replaced, total)

        empty = counted.empty
        for start in range(0, len(empty), WRITE_BATCH_DOCUMENTS):
            await write([(doc, []) for doc in empty[start : start + WRITE_BATCH_DOCUMENTS]])

        stored_chunks = sum(doc.chunk_count for doc in stored.values())
        async with vector_index_for(store, config, counted.chunks, stored_chunks):
            if pending:
                report.executor = choose_executor(options.executor, counted.chunks, config)
                log.info(
                    "embedding %d chunks of %d documents (%s)",
                    counted.chunks,
                    len(pending),
                    report.executor,
                )
                if report.executor == "ray":
                    child = ray_child or children.enter_context(
                        contextlib.closing(start_ray_child(config, tokenizer_path))
                    )
                    iterator = child.rows(counted.ray_work(options))
                else:
                    embedder = embedder or build_embedder(config.embedder)
                    iterator = _iter_local(
                        counted.in_order(), embedder, tokenizer_path, options, counted.chunks
                    )
                embed_span = tracer().start_span(
                    "ingest.embed",
                    attributes={
                        attr.LANGFUSE_TYPE: "embedding",
                        attr.GEN_AI_OPERATION: "embeddings",
                        attr.GEN_AI_REQUEST_MODEL: config.embedder.model,
                        "ingest.documents": len(pending),
                    },
                )
                try:
                    feed: RowSource = _RowFeed(iterator)
                    if detail is not None:
                        feed = _CountedFeed(feed, embedded)
                    await collect_documents(feed, pending, write)
                    if pending:
                        raise RuntimeError("the pipeline ended without some documents' chunks")
                except Exception as exc:
                    embed_span.record_exception(exc)
                    raise IngestFailed(exc, report, sorted(pending)) from exc
                finally:
                    embed_span.end()

    if options.prune:
        present = {f.source for f in files}
        gone = [s for s in stored if s not in present]
        with tracer().start_as_current_span("ingest.prune") as span:
            report.pruned = await store.delete_sources(gone)
            span.set_attribute("ingest.pruned", report.pruned)
    report.seconds = time.perf_counter() - started
    notify("done", report.new + report.replaced, total)
    return report
