"""Where an ingestion run's time and CPU go: pipeline runs between raw encodes, phase by phase.

    python -m bench.ingest_phases [--corpus 10000] [--order raw,ray,raw,local,raw] [--actors 1]

The corpus is one of ``bench.ingest``'s (``sample``, ``samplexN`` or N docstring pages). The
runs go in ``--order``, one after another: ``raw`` is the raw sorted encode of the corpus's
chunks (``bench.ingest.raw_encode_seconds``); ``local`` and ``ray`` are pipeline runs, each
into a fresh database (the embedder warm; Ray joined to one started here, its start not
counted). Each pipeline run is compared with the raw encodes just before and just after it:
the host's own speed moves several percent within minutes, so a ratio to one raw is not
enough.

A run's phases come from its own spans (``ingest.run``, ``ingest.embed``, the first
``ingest.write``, ``ingest.index``), taken by a span processor that reads every process's CPU
time from ``/proc`` at each edge (Linux). Each phase then lists the processes that used the
CPU in it: the driver, the Ray actor, Ray's own processes, PostgreSQL. A process that ended
before its phase's end is not listed (PostgreSQL's parallel index-build worker, for one).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from bench.ingest import build_corpus, chunk_texts, pipeline_run, raw_encode_seconds
from bench.text_corpus import build_texts
from foundation.database import resolve_database_url, with_database
from foundation.observability.setup import build_provider
from foundation.settings import Settings, load_settings
from ingest_jobs.pipeline import Executor, effective_max_tokens
from ingest_jobs.ray_executor import start_ray
from ingest_jobs.sources import discover
from retrieval.embedders import Embedder, build_embedder
from serve_app.wiring import embedder_config, ingest_config

# pid -> (CPU seconds so far, user and system; the command line, cut short)
ProcessCpu = dict[int, tuple[float, str]]


def read_process_cpu(proc: Path = Path("/proc")) -> ProcessCpu:
    """Every process's CPU time so far (``/proc/PID/stat``); a process gone meanwhile is left
    out."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: ProcessCpu = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Fields after the command name, which may hold spaces: utime and stime are 14 and 15.
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / ticks
        found[int(entry.name)] = (seconds, command.strip()[:80] or f"[{entry.name}]")
    return found


def cpu_used(before: ProcessCpu, after: ProcessCpu, floor: float = 0.2) -> list[tuple[float, str]]:
    """The CPU seconds each process used between two readings, most first; processes under
    ``floor`` seconds are left out. A process started in between counts from zero."""
    used = []
    for pid, (seconds, command) in after.items():
        spent = seconds - before.get(pid, (0.0, ""))[0]
        if spent >= floor:
            used.append((spent, f"{command} (pid {pid})"))
    return sorted(used, reverse=True)


@dataclass
class Mark:
    """A phase edge: what happened, when (``time.perf_counter``) and every process's CPU."""

    label: str
    at: float
    cpu: ProcessCpu


class PhaseMarks(SpanProcessor):
    """Marks an ingestion run's phase edges from its spans: the run's start and end, the
    work's dispatch (``ingest.embed`` starts, after the count), the first rows written (the
    first ``ingest.write`` inside it), the last rows written (``ingest.embed`` ends) and each
    index build's start and end (``ingest.index``). ``reset`` before each run."""

    def __init__(self) -> None:
        self.marks: list[Mark] = []
        self._embedding = False  # inside ``ingest.embed``, before its first write

    def reset(self) -> None:
        self.marks.clear()
        self._embedding = False

    def _mark(self, label: str) -> None:
        self.marks.append(Mark(label, time.perf_counter(), read_process_cpu()))

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        if span.name == "ingest.run":
            self._mark("run starts")
        elif span.name == "ingest.embed":
            self._embedding = True
            self._mark("work sent")
        elif span.name == "ingest.write" and self._embedding:
            self._embedding = False  # only the first write inside the embed span
            self._mark("first rows written")
        elif span.name == "ingest.index":
            self._mark("index build starts")

    def on_end(self, span: ReadableSpan) -> None:
        if span.name == "ingest.embed":
            self._mark("last rows written")
        elif span.name == "ingest.index":
            self._mark("index build ends")
        elif span.name == "ingest.run":
            self._mark("run ends")

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def phases(marks: Sequence[Mark]) -> list[tuple[str, float, list[tuple[float, str]]]]:
    """Each stretch between consecutive marks: its name, seconds and the CPU each process
    used. A run too small to defer the vector index checks it first (``ingest.index`` at the
    start, a stretch of milliseconds when the index is there)."""
    return [
        (f"{a.label} -> {b.label}", b.at - a.at, cpu_used(a.cpu, b.cpu))
        for a, b in itertools.pairwise(marks)
    ]


def ratios(seconds: float, before: float | None, after: float | None) -> str:
    """A pipeline run against the raw encodes around it: to each, and to their mean."""
    parts = [f"{raw / seconds:.3f}" if raw else "-" for raw in (before, after)]
    known = [raw for raw in (before, after) if raw]
    mean = f"{sum(known) / len(known) / seconds:.3f}" if known else "-"
    return f"{parts[0]} / {parts[1]} / {mean}"


@dataclass
class Run:
    kind: str  # raw, local or ray
    seconds: float
    chunks: int
    cpu_seconds: float = 0.0  # raw: this process's CPU
    stretches: list[tuple[str, float, list[tuple[float, str]]]] = field(default_factory=list)


async def run_order(
    order: Sequence[str],
    roots: list[tuple[Path, list[str]]],
    settings: Settings,
    embedder: Embedder,
    actors: int,
    clock: PhaseMarks,
) -> list[Run]:
    """The runs of ``order``, one after another, each printed as it ends."""
    admin_url = with_database(await resolve_database_url(settings), "postgres")
    max_tokens = effective_max_tokens(ingest_config(settings), embedder.max_tokens)
    texts = chunk_texts(discover(roots), embedder.name, max_tokens)
    print(f"{len(texts)} chunks", flush=True)
    runs: list[Run] = []
    for kind in order:
        if kind == "raw":
            cpu = time.process_time()
            seconds = raw_encode_seconds(embedder, texts)
            runs.append(Run(kind, seconds, len(texts), time.process_time() - cpu))
        else:
            executor: Executor = "ray" if kind == "ray" else "local"
            clock.reset()
            report = await pipeline_run(
                admin_url,
                settings,
                roots,
                executor,
                embedder=embedder,
                actors=actors,
                max_tokens=max_tokens,
            )
            runs.append(
                Run(kind, report.seconds, report.chunks_written, stretches=phases(clock.marks))
            )
        _print_run(runs[-1])
    return runs


def _print_run(run: Run) -> None:
    rate = run.chunks / run.seconds
    cpu = f", {run.cpu_seconds:.1f} s of CPU" if run.cpu_seconds else ""
    print(f"{run.kind}: {run.seconds:.1f} s, {rate:.1f} chunks/s{cpu}", flush=True)
    for name, seconds, used in run.stretches:
        print(f"  {name}: {seconds:.1f} s", flush=True)
        for spent, process in used[:8]:
            print(f"    {spent:7.2f} s  {process}", flush=True)


def table(runs: Sequence[Run]) -> list[str]:
    """The summary: each run, and each pipeline run against the raw encodes around it."""
    lines = [
        "| run | seconds | chunks/s | ratio to the raw before / after / their mean |",
        "|---|---:|---:|---|",
    ]
    for i, run in enumerate(runs):
        rate = f"{run.chunks / run.seconds:.1f}"
        if run.kind == "raw":
            lines.append(f"| raw encode (sorted) | {run.seconds:.1f} s | {rate} | |")
            continue
        before = next((r.seconds for r in reversed(runs[:i]) if r.kind == "raw"), None)
        after = next((r.seconds for r in runs[i + 1 :] if r.kind == "raw"), None)
        name = "Ray Data" if run.kind == "ray" else "in-process"
        lines.append(
            f"| {name} | {run.seconds:.1f} s | {rate} | {ratios(run.seconds, before, after)} |"
        )
    return lines


async def main_async(corpus: str, order: list[str], actors: int) -> None:
    settings = load_settings()
    clock = PhaseMarks()
    trace.set_tracer_provider(build_provider(settings, "bench", processor=clock))
    embedder = build_embedder(embedder_config(settings))
    if "ray" in order:
        import ray

        start_ray(ingest_config(settings))
        # The pipeline's Ray process joins this Ray: its start stays out of the runs.
        address = ray.get_runtime_context().gcs_address
        os.environ["RAY_ADDRESS"] = address
        settings = settings.model_copy(update={"ray_address": address})
    paragraphs = build_texts(int(corpus), 0, seed=15)[0] if corpus.isdigit() else []
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-phases-"))
    try:
        roots = build_corpus(tmp, corpus, paragraphs)
        runs = await run_order(order, roots, settings, embedder, actors, clock)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("\n".join(table(runs)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", default="10000", help="sample, samplexN or N pages")
    parser.add_argument("--order", default="raw,ray,raw,local,raw")
    parser.add_argument("--actors", type=int, default=1)
    args = parser.parse_args()
    order = [kind.strip() for kind in args.order.split(",") if kind.strip()]
    unknown = sorted(set(order) - {"raw", "local", "ray"})
    if unknown:
        parser.error(f"--order: unknown run kinds {', '.join(unknown)} (raw, local, ray)")
    asyncio.run(main_async(args.corpus, order, args.actors))


if __name__ == "__main__":
    main()
