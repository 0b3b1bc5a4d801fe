"""The ingestion job: discover -> read/hash/skip -> chunk -> embed -> write.

The driver reads and hashes every source and compares fingerprints with the store, so
unchanged documents cost one file read. Changed and new documents flow through Ray Data:
chunking as parallel tasks, embedding in an actor pool (one model per actor, batched). The
driver writes each document, with all of its chunks, in one transaction as soon as its last
chunk is embedded: a crash leaves only whole documents, and a re-run finishes the job.

``executor="local"`` runs the same stage functions in-process; ``executor="ray"`` runs them
on a local Ray or, under ``ray job submit``, on the cluster, from a child process that sends
the rows back (a dying Ray node ends only that child, and the run fails with its counts);
``executor="auto"`` (the default) picks by the work (:func:`choose_executor`). Any failure
part-way raises :class:`IngestFailed`: what failed, what was written, what was not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Literal

import numpy as np
from opentelemetry import context as otel_context

from foundation.observability import attributes as attr
from foundation.observability.spans import tracer
from foundation.settings import Settings
from ingest_jobs.sources import (
    PreparedSource,
    SkippedSource,
    SourceFile,
    chunk_rows,
    discover,
    prepare,
    read_body,
    token_counter,
)
from retrieval.embedders import Embedder, build_embedder, resolve_local_model
from retrieval.search import embedding_input
from retrieval.store import ChunkRecord, DocumentRecord, DocumentStore

log = logging.getLogger(__name__)

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

NOT_INGESTED_SHOWN = 5  # sources a failure message names (the report lists them all)


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


def choose_executor(requested: Executor, chunks: int, settings: Settings) -> Executor:
    """The executor for a run of ``chunks`` chunks. ``auto``: Ray Data on a running cluster
    (``RAY_ADDRESS``: ``ray job submit``, ``POST /ingest``), else in-process below
    ``INGEST_RAY_MIN_CHUNKS``. Measured on the 2-core machine (bench/RESULTS.md "Executor
    choice"): a private Ray costs ~20 s before the first chunk and then embeds at ~0.85x the
    in-process rate, so small and medium corpora are several times faster in-process."""
    if requested != "auto":
        return requested
    if os.environ.get("RAY_ADDRESS"):
        return "ray"
    return "ray" if chunks >= settings.ingest_ray_min_chunks else "local"


def effective_max_tokens(settings: Settings, embedder_max_tokens: int) -> int:
    """The chunk budget, kept under the embedder's window with room for the section path."""
    return max(16, min(settings.chunk_max_tokens, embedder_max_tokens - 48))


# --- the Ray Data stages ----------------------------------------------------------------------


class _ChunkEmbedActor:
    """Ray Data actor-pool callable: a batch of documents (path and hash each) -> their
    embedded chunk rows. The worker reads each file itself, so the corpus streams through the
    object store, and chunks it beside the encode, as the in-process path does: one stage, no
    second process competing for the 2 cores and no extra hop through the object store."""

    def __init__(
        self, settings_env: dict[str, str], threads: int, tokenizer_path: str | None, budget: int
    ) -> None:
        from foundation.settings import load_settings

        os.environ.update(settings_env)
        # Ray sets OMP_NUM_THREADS to the actor's CPU request (1), which halves torch's encode
        # rate on 2 cores; the actors share the machine's cores between them instead.
        import torch

        torch.set_num_threads(threads)
        self.embedder = build_embedder(load_settings())
        self.count_tokens = token_counter(tokenizer_path)
        self.budget = budget

    def __call__(self, batch: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        rows: list[dict[str, Any]] = []
        for source, path, content_hash in zip(
            batch["source"], batch["path"], batch["content_hash"], strict=True
        ):
            body = read_body(Path(str(path)), str(source), str(content_hash))
            doc = PreparedSource(str(source), None, body, "", "", [], {})
            rows.extend(chunk_rows(doc, self.count_tokens, self.budget))
        texts = [embedding_input(r["section"], r["text"]) for r in rows]
        # text as object arrays: a fixed-width numpy string column pads every row to the longest
        columns = {
            key: np.array([r[key] for r in rows], dtype=object if key in TEXT_COLUMNS else None)
            for key in CHUNK_COLUMNS
        }
        columns["embedding"] = self.embedder.encode(texts)
        return columns


CHUNK_COLUMNS = (
    "source",
    "n_chunks",
    "id",
    "ordinal",
    "text",
    "section",
    "kind",
    "token_count",
    "oversized",
)
TEXT_COLUMNS = frozenset({"source", "id", "text", "section", "kind"})


def _settings_env(settings: Settings) -> dict[str, str]:
    """The embedder's settings as environment variables, for Ray workers."""
    env = {
        "EMBEDDING_BACKEND": settings.embedding_backend,
        "EMBEDDING_MODEL": settings.embedding_model,
        "EMBEDDING_DIM": str(settings.resolved_embedding_dim),
        "EMBEDDING_BATCH_SIZE": str(settings.embedding_batch_size),
        "EMBEDDING_DTYPE": settings.embedding_dtype,
        "LLM_BASE_URL": settings.llm_base_url,
        "HF_HUB_OFFLINE": "1",
    }
    if settings.embedding_base_url:
        env["EMBEDDING_BASE_URL"] = settings.embedding_base_url
    if settings.llm_api_key:
        env["LLM_API_KEY"] = settings.llm_api_key.get_secret_value()
    return env


def start_ray(settings: Settings) -> None:
    """Join ``RAY_ADDRESS`` or start a private local Ray, on the CALLING thread.

    Ray's local processes (raylet, GCS) die with the thread that started them: it forks them
    with ``PR_SET_PDEATHSIG=SIGKILL``, which Linux fires when the creating *thread* exits.
    Started from the row feed's thread, they were killed the moment the last row had been
    fetched, and the driver with them (exit 1, nothing printed, the rest of the documents
    never written: 732 of 974 tiny pages)."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    # On 2 cores the default CPU requests deadlock (a stage waits for a CPU held by the actor
    # pool): give the local Ray logical CPUs that fit the fractional asks. address="local": a
    # private Ray for this run, never a stale cluster named in /tmp/ray/ray_current_cluster.
    # On a cluster, `ray job submit` sets RAY_ADDRESS.
    ray.init(
        address="local",
        num_cpus=settings.ingest_cpus,
        object_store_memory=settings.ingest_object_store_mb * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )


def _iter_ray(
    work: RayWork,
    settings: Settings,
    tokenizer_path: str | None,
    options: IngestOptions,
) -> Iterator[dict[str, Any]]:
    """The chunk rows of ``docs`` from the Ray Data pipeline. Ray is started here, on the
    caller's thread (``start_ray``); the rows may then be drained on any thread."""
    import ray.data
    from ray.data import ActorPoolStrategy, DataContext

    start_ray(settings)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.verbose_progress = False

    ds: Any = ray.data.from_items(work.items, override_num_blocks=work.blocks)
    ds = ds.map_batches(
        _ChunkEmbedActor,
        fn_constructor_args=(
            _settings_env(settings),
            max(1, (os.cpu_count() or 1) // options.embed_actors),
            tokenizer_path,
            options.max_tokens,
        ),
        batch_size=work.docs_per_call,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=options.embed_actors),
        num_cpus=min(1.0, settings.ingest_cpus / (options.embed_actors + 1)),
    )
    return iter(ds.iter_rows())  # run in the child: the pipe copies each row out


BYTES_PER_READ_BLOCK = 4 * 1024 * 1024
CHUNKS_PER_CALL = 128  # chunks an embedding actor chunks and encodes per call, on average


@dataclass(frozen=True)
class RayWork:
    """What the Ray pipeline reads (path and hash per document, never the text), in how many
    blocks (at least 8, or one per document; more for a large corpus, so each block's chunks
    stay a few MiB and the streaming executor can hold back reading while the embedder
    catches up), and how many documents an actor takes per call."""

    items: list[dict[str, str]]
    blocks: int
    docs_per_call: int

    @classmethod
    def of(cls, docs: Sequence[PreparedSource], chunks: int) -> RayWork:
        items = [
            {"source": d.source, "path": str(d.path), "content_hash": d.content_hash} for d in docs
        ]
        corpus = sum(_size(d) for d in docs)
        blocks = max(1, min(len(docs), max(8, corpus // BYTES_PER_READ_BLOCK)))
        chunks_per_doc = max(1.0, chunks / max(1, len(docs)))
        return cls(items, blocks, max(1, round(CHUNKS_PER_CALL / chunks_per_doc)))


def _size(doc: PreparedSource) -> int:
    try:
        return doc.path.stat().st_size if doc.path else len(doc.body)
    except OSError:
        return 0  # gone since it was hashed: its read fails the run with a clear message


def _text(doc: PreparedSource) -> str:
    """A pending document's text: dropped once counted, read again (and checked) here."""
    if doc.body or doc.path is None:
        return doc.body
    return read_body(doc.path, doc.source, doc.content_hash)


ROWS_PER_MESSAGE = 64  # rows the Ray process sends the writer at once


class RayPipelineLost(RuntimeError):
    """The process running the Ray pipeline ended before its last row (its Ray node died:
    Ray then ends the process itself, where no Python handler runs)."""

    def __init__(self, exit_code: int | None) -> None:
        super().__init__(
            f"the Ray pipeline's process ended (exit code {exit_code}) before all rows "
            "arrived; Ray's own logs are under /tmp/ray/session_latest/logs"
        )


def _iter_ray_isolated(
    docs: Sequence[PreparedSource],
    chunks: int,
    settings: Settings,
    tokenizer_path: str | None,
    options: IngestOptions,
) -> Iterator[dict[str, Any]]:
    """``_iter_ray`` in a child process that sends its rows over a pipe. A Ray node that
    dies takes down the driver connected to it with a bare ``exit(1)``; here that is the
    child, and this process, which writes the documents, reports what failed and what the
    store holds. The pipe is the backpressure: the child blocks while the writer lags."""
    context = multiprocessing.get_context("spawn")  # no forked copy of this process's threads
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_ray_child,
        args=(RayWork.of(docs, chunks), settings, tokenizer_path, options, sender),
        name="ingest-ray",
        daemon=True,
    )
    child.start()
    sender.close()
    return _child_rows(child, receiver)


def _ray_child(
    work: RayWork,
    settings: Settings,
    tokenizer_path: str | None,
    options: IngestOptions,
    sender: Connection,
) -> None:
    # The rows go over the pipe; anything Ray prints (a dying node's last words) goes to
    # stderr, so the parent's stdout stays its report (``--json``, ``--json-lines``).
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        batch: list[dict[str, Any]] = []
        for row in _iter_ray(work, settings, tokenizer_path, options):
            batch.append(row)
            if len(batch) >= ROWS_PER_MESSAGE:
                sender.send(("rows", batch))
                batch = []
        sender.send(("rows", batch))
        sender.send(("done", None))
    except BaseException as exc:  # reported to the writer, which fails loudly with counts
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


def _child_rows(child: BaseProcess, receiver: Connection) -> Iterator[dict[str, Any]]:
    try:
        while True:
            try:
                kind, payload = receiver.recv()
            except EOFError:
                child.join(timeout=10)
                raise RayPipelineLost(child.exitcode) from None
            if kind == "rows":
                yield from payload
            elif kind == "error":
                raise RuntimeError(payload)
            else:
                return
    finally:
        receiver.close()
        if child.is_alive():
            child.terminate()
        child.join(timeout=10)


def _iter_local(
    docs: Sequence[PreparedSource],
    embedder: Embedder,
    tokenizer_path: str | None,
    options: IngestOptions,
) -> Iterator[dict[str, Any]]:
    counter = token_counter(tokenizer_path) if tokenizer_path else embedder.count_tokens
    rows: list[dict[str, Any]] = []
    for doc in docs:
        with_text = dataclasses.replace(doc, body=_text(doc))
        rows.extend(chunk_rows(with_text, counter, options.max_tokens))
        while len(rows) >= options.batch_size:
            batch, rows = rows[: options.batch_size], rows[options.batch_size :]
            yield from _embed_rows(batch, embedder)
    if rows:
        yield from _embed_rows(rows, embedder)


def _embed_rows(rows: list[dict[str, Any]], embedder: Embedder) -> Iterator[dict[str, Any]]:
    vectors = embedder.encode([embedding_input(r["section"], r["text"]) for r in rows])
    for row, vec in zip(rows, vectors, strict=True):
        yield {**row, "embedding": vec}


class _RowFeed:
    """Drains a blocking iterator on a thread so the async writer keeps going meanwhile."""

    _DONE = object()

    def __init__(self, iterator: Iterator[dict[str, Any]]) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=256)
        self._iterator = iterator
        threading.Thread(target=self._run, name="ingest-rows", daemon=True).start()

    def _run(self) -> None:
        try:
            for row in self._iterator:
                self._queue.put(row)
        except BaseException as exc:
            self._queue.put(exc)
        finally:
            self._queue.put(self._DONE)

    async def rows(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            item = await asyncio.to_thread(self._queue.get)
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, dict)
            yield item


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


async def run_ingest(
    store: DocumentStore,
    settings: Settings,
    options: IngestOptions,
    *,
    embedder: Embedder | None = None,
    progress: ProgressCallback | None = None,
) -> IngestReport:
    """Bring the store in line with the sources under ``options.roots``.

    Traced as its own trace (an ``ingest.run`` root, whatever the caller's context), with
    ``ingest.discover``, ``ingest.embed`` (chunking and embedding, Ray Data or in-process) and
    one ``ingest.write`` per document."""
    with tracer().start_as_current_span(
        "ingest.run",
        context=otel_context.Context(),
        attributes={attr.LANGFUSE_TYPE: "span", "ingest.executor": options.executor},
    ) as span:
        report = await _run_ingest(store, settings, options, embedder=embedder, progress=progress)
        for key, value in report.as_dict().items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                span.set_attribute(f"ingest.{key}", value)
        return report


async def _run_ingest(
    store: DocumentStore,
    settings: Settings,
    options: IngestOptions,
    *,
    embedder: Embedder | None,
    progress: ProgressCallback | None,
) -> IngestReport:
    started = time.perf_counter()
    report = IngestReport()
    notify = progress or (lambda event, done, total: None)

    with tracer().start_as_current_span("ingest.discover") as span:
        files: list[SourceFile] = discover(options.roots)
        report.discovered = len(files)
        stored = await store.documents()
        span.set_attribute("ingest.discovered", len(files))
    embedder_name = settings.embedding_model if embedder is None else embedder.name
    if embedder_name in {"sentence-transformers/all-MiniLM-L6-v2"}:
        embedder_name = "all-MiniLM-L6-v2"

    tokenizer_path = (
        resolve_local_model(settings.embedding_model)
        if settings.embedding_backend == "sentence-transformers"
        else None
    )
    counter = token_counter(tokenizer_path)
    # The text is dropped once counted: memory holds one document's text, not the corpus
    # (the executors read each file again, and check it is the one hashed here).
    pending: dict[str, PreparedSource] = {}
    empty: list[PreparedSource] = []  # no chunks (an empty page): never reach the executors
    chunks = 0
    for file in files:
        prepared = prepare(file, embedder_name=embedder_name, max_tokens=options.max_tokens)
        if isinstance(prepared, SkippedSource):
            report.skipped += 1
            report.skip_reasons.append(prepared.reason)
            log.warning("%s", prepared.reason)
            continue
        old = stored.get(prepared.source)
        if old is not None and old.fingerprint == prepared.fingerprint:
            report.unchanged += 1
            continue
        rows = chunk_rows(prepared, counter, options.max_tokens) if prepared.body.strip() else []
        chunks += len(rows)
        light = dataclasses.replace(prepared, body="")
        if rows:
            pending[prepared.source] = light
        else:
            empty.append(light)

    total = len(pending) + len(empty)
    notify("start", 0, total)

    async def write(doc: PreparedSource, rows: list[dict[str, Any]]) -> None:
        with tracer().start_as_current_span(
            "ingest.write", attributes={"ingest.source": doc.source, "ingest.chunks": len(rows)}
        ) as span:
            outcome = await store.write_document(_record(doc, rows))
            span.set_attribute("ingest.outcome", outcome)
        if outcome == "new":
            report.new += 1
        else:
            report.replaced += 1
        report.chunks_written += len(rows)
        notify("document", report.new + report.replaced, total)

    for doc in empty:
        await write(doc, [])

    if pending:
        docs = list(pending.values())
        report.executor = choose_executor(options.executor, chunks, settings)
        log.info("embedding %d chunks of %d documents (%s)", chunks, len(docs), report.executor)
        if report.executor == "ray":
            iterator = _iter_ray_isolated(docs, chunks, settings, tokenizer_path, options)
        else:
            iterator = _iter_local(
                docs, embedder or build_embedder(settings), tokenizer_path, options
            )
        # keyed by ordinal: a Ray task retried after its worker died may repeat rows
        rows_by_source: dict[str, dict[int, dict[str, Any]]] = {}
        embed_span = tracer().start_span(
            "ingest.embed",
            attributes={
                attr.LANGFUSE_TYPE: "embedding",
                attr.GEN_AI_OPERATION: "embeddings",
                attr.GEN_AI_REQUEST_MODEL: settings.embedding_model,
                "ingest.documents": len(pending),
            },
        )
        try:
            async for item in _RowFeed(iterator).rows():
                source = str(item["source"])
                if source not in pending:
                    continue  # a repeat of a document already written
                bucket = rows_by_source.setdefault(source, {})
                bucket[int(item["ordinal"])] = item
                if len(bucket) == int(item["n_chunks"]):
                    await write(pending.pop(source), list(rows_by_source.pop(source).values()))
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
