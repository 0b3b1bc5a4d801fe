"""The Ray Data executor of the ingestion job.

One actor stage reads, chunks and embeds a batch of documents (the driver sends paths and
hashes, never the text, so the corpus streams through the object store), in a child process
that sends its rows to the writer over a pipe: a Ray node that dies ends only that child, and
the run fails with its counts (:class:`RayPipelineLost`). The child (:class:`RayChild`) may
be started before its work is known: it joins Ray while the driver counts the corpus.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from ingest_jobs.config import IngestConfig
from ingest_jobs.sources import PreparedSource, chunk_rows, read_body
from ingest_jobs.token_counts import token_counter
from retrieval.embedders import (
    EmbedderConfig,
    build_embedder,
    set_torch_threads,
    stream_count,
    streams_pay,
)
from retrieval.search import embedding_input


class _ChunkEmbedActor:
    """Ray Data actor-pool callable: a batch of documents (path and hash each) -> their
    embedded chunk rows. The worker reads each file itself, so the corpus streams through the
    object store, and chunks it beside the encode, as the in-process path does: one stage, no
    second process competing for the 2 cores and no extra hop through the object store."""

    def __init__(
        self,
        embedder: EmbedderConfig,
        threads: int,
        tokenizer_path: str | None,
        budget: int,
        streams: int = 1,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # Ray sets OMP_NUM_THREADS to the actor's CPU request (1), which halves torch's encode
        # rate on 2 cores; the actors share the machine's cores between them instead.
        set_torch_threads(threads)
        self.embedder = build_embedder(embedder)
        self.count_tokens = token_counter(tokenizer_path)
        self.budget = budget
        # ``streams`` calls run side by side (Ray Data's threaded actor), each on its share of
        # the threads: as in-process, one busy core then slows one call, not every layer.
        self.call_threads = max(1, threads // streams)
        self.embedder.encode(["warm-up"])  # the tokenizer set up before calls share it

    def __call__(self, batch: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        set_torch_threads(self.call_threads)  # Ray Data calls on threads of its own
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


def start_ray(config: IngestConfig) -> None:
    """Join ``RAY_ADDRESS`` or start a private local Ray, on the CALLING thread.

    Ray's local processes (raylet, GCS) die with the thread that started them: it forks them
    with ``PR_SET_PDEATHSIG=SIGKILL``, which Linux fires when the creating *thread* exits.
    Started from the row feed's thread, they were killed the moment the last row had been
    fetched, and the driver with them (exit 1, nothing printed, the rest of the documents
    never written: 732 of 974 tiny pages)."""
    import ray

    if ray.is_initialized():
        return
    address = config.ray_address
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    # On 2 cores the default CPU requests deadlock (a stage waits for a CPU held by the actor
    # pool): give the local Ray logical CPUs that fit the fractional asks. address="local": a
    # private Ray for this run, never a stale cluster named in /tmp/ray/ray_current_cluster.
    # On a cluster, `ray job submit` sets RAY_ADDRESS.
    ray.init(
        address="local",
        num_cpus=config.cpus,
        object_store_memory=config.object_store_mb * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )


def iter_ray(
    work: RayWork,
    config: IngestConfig,
    tokenizer_path: str | None,
) -> Iterator[dict[str, Any]]:
    """The embedded chunk rows of ``work`` from the Ray Data pipeline. Ray is started here, on
    the caller's thread (``start_ray``); the rows may then be drained on any thread."""
    import ray.data
    from ray.data import ActorPoolStrategy, DataContext

    start_ray(config)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.verbose_progress = False

    threads = max(1, (os.cpu_count() or 1) // work.embed_actors)
    streams = stream_count(config.embedder.streams, threads) if streams_pay(work.chunks) else 1
    ds: Any = ray.data.from_items(work.items, override_num_blocks=work.blocks)
    ds = ds.map_batches(
        _ChunkEmbedActor,
        fn_constructor_args=(
            config.embedder,
            threads,
            tokenizer_path,
            work.max_tokens,
            streams,
        ),
        batch_size=None,  # one block a call (``RayWork``)
        batch_format="numpy",
        compute=ActorPoolStrategy(
            size=work.embed_actors,
            max_concurrent_calls_per_actor=streams,
            enable_true_multi_threading=streams > 1,
        ),
        num_cpus=min(1.0, config.cpus / (work.embed_actors + 1)),
    )
    return iter(ds.iter_rows())  # run in the child: the pipe copies each row out


TEXT_PER_READ_BLOCK = 4 * 1024 * 1024  # characters of page text per block
# Chunks an embedding actor chunks and encodes in one call (a block, ``RayWork``), on average:
# one encode call each, which sentence-transformers sorts by length (the driver sends
# documents shortest first). 10,000 docstring pages on 2 cores: 77.9 chunks/s at 128, 89.9/s
# at 512 (bench/RESULTS.md).
CHUNKS_PER_CALL = 512


@dataclass(frozen=True)
class RayWork:
    """What the Ray pipeline reads (path and hash per document, never the text), in how many
    blocks. An actor takes one block per call, so a block holds at most ``CHUNKS_PER_CALL``
    chunks on average: the last calls of a run are short, and a stream never runs alone for
    long at the end while the other has nothing left. At least 8 blocks, or one per
    document; more for a large text, so each block stays a few MiB and the streaming
    executor can hold back reading while the embedder catches up."""

    items: list[dict[str, str]]
    blocks: int
    max_tokens: int  # the chunk budget
    embed_actors: int
    chunks: int = 0  # to embed, as the driver counted them

    @classmethod
    def of(
        cls,
        docs: Sequence[PreparedSource],
        chunks: int,
        text_chars: int,
        max_tokens: int,
        embed_actors: int,
    ) -> RayWork:
        """``chunks`` and ``text_chars``: the totals the driver counted while hashing."""
        items = [
            {"source": d.source, "path": str(d.path), "content_hash": d.content_hash} for d in docs
        ]
        calls = math.ceil(chunks / CHUNKS_PER_CALL)
        blocks = max(1, min(len(docs), max(8, calls, text_chars // TEXT_PER_READ_BLOCK)))
        return cls(items, blocks, max_tokens, embed_actors, chunks)


ROWS_PER_MESSAGE = 64  # rows the Ray process sends the writer at once


class RayPipelineLost(RuntimeError):
    """The process running the Ray pipeline ended before its last row (its Ray node died:
    Ray then ends the process itself, where no Python handler runs)."""

    def __init__(self, exit_code: int | None, *, started: bool = True) -> None:
        if started:
            where = "before all rows arrived; Ray's own logs are under /tmp/ray/session_latest/logs"
        else:  # it never got as far as Ray: its own error is on stderr
            where = "before it read its work (its error, if any, is on stderr above)"
        super().__init__(f"the Ray pipeline's process ended (exit code {exit_code}) {where}")


ChildMain = Callable[[IngestConfig, str | None, Connection, Connection], None]


class RayChild:
    """The process that runs the Ray pipeline (``start_ray_child``): it joins Ray as soon as
    it starts, then waits for its work (``rows``); ``close`` ends it."""

    def __init__(self, process: BaseProcess, receiver: Connection, work_writer: Connection) -> None:
        self._process = process
        self._receiver = receiver
        self._work_writer = work_writer
        self._given_work = False
        self._sent_all = False  # its last row arrived: it is leaving Ray on its own

    def rows(self, work: RayWork) -> Iterator[dict[str, Any]]:
        """The embedded rows of ``work`` (sent to the process when iteration begins)."""
        self._given_work = True
        return self._rows(work)

    def close(self) -> None:
        """End the process. Never given work: tell it there is none. Past its last row: wait
        for it to leave Ray (the rows' iterator does not wait for that, ~0.8 s: the writer
        builds the vector index meanwhile). Stopped short (the writer failed): end it now."""
        if not self._given_work:
            self._given_work = True
            with contextlib.suppress(OSError):  # already gone: nothing to tell it
                self._work_writer.send(None)
            self._work_writer.close()
            self._receiver.close()
            _end(self._process, grace=True)
        else:
            _end(self._process, grace=self._sent_all)

    def _rows(self, work: RayWork) -> Iterator[dict[str, Any]]:
        child, receiver = self._process, self._receiver
        try:
            # The work (every path and hash: megabytes for a large corpus) goes over a pipe
            # of its own, not as the process's arguments: a child that dies before reading
            # them left ``Process.start`` blocked on a full pipe for ever (its read end is
            # held open by this process); here the write fails and the run reports it.
            try:
                self._work_writer.send(work)
            except OSError:
                _raise_its_error(receiver)  # it failed to join Ray, and said why
                child.join(timeout=10)
                raise RayPipelineLost(child.exitcode, started=False) from None
            finally:
                self._work_writer.close()
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
                    self._sent_all = True
                    return
        finally:
            receiver.close()
            if not self._sent_all:  # one that sent its last row leaves Ray on its own
                _end(child, grace=False)


def start_ray_child(
    config: IngestConfig, tokenizer_path: str | None, *, child_main: ChildMain | None = None
) -> RayChild:
    """Start the process that runs ``iter_ray`` and sends its rows over a pipe. A Ray node
    that dies takes down the driver connected to it with a bare ``exit(1)``; here that is
    the child, and this process, which writes the documents, reports what failed and what
    the store holds. The pipe is the backpressure: the child blocks while the writer lags.
    ``child_main``: what the child runs (tests: a child that dies at once)."""
    context = multiprocessing.get_context("spawn")  # no forked copy of this process's threads
    receiver, sender = context.Pipe(duplex=False)
    work_reader, work_writer = context.Pipe(duplex=False)
    child = context.Process(
        target=child_main or _ray_child,
        args=(config, tokenizer_path, work_reader, sender),
        name="ingest-ray",
        daemon=True,
    )
    child.start()
    sender.close()
    work_reader.close()
    return RayChild(child, receiver, work_writer)


def _ray_child(
    config: IngestConfig,
    tokenizer_path: str | None,
    work_reader: Connection,
    sender: Connection,
) -> None:
    # The rows go over the pipe; anything Ray prints (a dying node's last words) goes to
    # stderr, so the parent's stdout stays its report (``--json``, ``--json-lines``).
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        arrived = _work_when_it_arrives(work_reader)
        start_ray(config)  # while the driver still counts the corpus
        work = arrived.get()
        if isinstance(work, BaseException):
            raise work
        batch: list[dict[str, Any]] = []
        for row in iter_ray(work, config, tokenizer_path):
            batch.append(row)
            if len(batch) >= ROWS_PER_MESSAGE:
                sender.send(("rows", batch))
                batch = []
        sender.send(("rows", batch))
        sender.send(("done", None))
    except BaseException as exc:  # reported to the writer, which fails loudly with counts
        with contextlib.suppress(OSError):  # a parent that closed the pipe wants nothing
            sender.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


def _work_when_it_arrives(work_reader: Connection) -> queue.Queue[RayWork | BaseException]:
    """The child's work, read on a thread of its own while the main thread joins Ray. No work
    (``RayChild.close``: nothing changed) ends the process at once, even mid-join: Ray's
    shutdown and its SIGTERM handler would cost seconds and print a stack to stderr. A
    private Ray's processes die with the main thread (``start_ray``)."""
    arrived: queue.Queue[RayWork | BaseException] = queue.Queue(maxsize=1)

    def read() -> None:
        try:
            work = work_reader.recv()
        except (EOFError, OSError):
            work = None  # the parent is gone
        except BaseException as exc:  # e.g. work that does not unpickle: the main thread says so
            work = exc
        work_reader.close()
        if work is None:
            os._exit(0)
        arrived.put(work)

    threading.Thread(target=read, name="ingest-ray-work", daemon=True).start()
    return arrived


CHILD_EXIT_GRACE_S = 10.0  # a child that sent its last row disconnects from Ray, then exits


def _raise_its_error(receiver: Connection) -> None:
    """Raise the error the child sent before it ended, if it sent one."""
    with contextlib.suppress(EOFError, OSError):
        if receiver.poll(1.0):
            kind, payload = receiver.recv()
            if kind == "error":
                raise RuntimeError(payload)


def _end(child: BaseProcess, *, grace: bool) -> None:
    """Wait for ``child`` to end; ``grace``: it is leaving Ray on its own (a SIGTERM
    mid-shutdown prints Ray's traceback), so give it ``CHILD_EXIT_GRACE_S`` first."""
    if grace:
        child.join(timeout=CHILD_EXIT_GRACE_S)
    if child.is_alive():
        child.terminate()
    child.join(timeout=10)
