"""``agent-service ingest`` (the documentation into the knowledge base) and ``agent-service
search`` (a hybrid search as a given caller)."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from foundation.settings import Settings
from serve_app.cli.common import EXIT_FAILURE, EXIT_OK, CliError, csv_list, logs_to_file

if TYPE_CHECKING:
    from ingest_jobs.pipeline import IngestProgress


def cmd_ingest(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from foundation.observability.setup import configure_observability, flush_observability

    if not args.verbose:
        # The run's own progress display replaces the model loader's bars.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # The run is its own trace (ingest.run); exported before the process exits.
    configure_observability(settings, "ingest")
    atexit.register(flush_observability)
    # Log and span lines go to <home>/logs/ingest.log; the terminal shows the progress.
    with logs_to_file(settings, "ingest", verbose=args.verbose) as log_path:
        try:
            code = _ingest(args, settings, out)
        finally:
            flush_observability()  # the spans still buffered, into the log file
        if code != EXIT_OK:
            print(f"agent-service: the run's log: {log_path}", file=sys.stderr)
        return code


def _ingest(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from rich.console import Console

    from foundation.acl import parse_acl
    from ingest_jobs.pipeline import IngestFailed, IngestOptions, effective_max_tokens, run_ingest
    from retrieval.embedders import build_embedder
    from serve_app.wiring import ingest_config, open_store

    if args.root:
        acl = parse_acl(csv_list(args.acl))
        roots: list[tuple[Path, list[str]]] = [(Path(r), acl) for r in args.root]
    else:
        roots = [(p, list(a)) for p, a in settings.ingestion.doc_root_acls]
    for root, _ in roots:
        if not root.is_dir():
            raise CliError(f"documentation root {root} is not a directory")

    console = Console(file=sys.stderr)

    config = ingest_config(settings)

    async def run() -> dict[str, object]:
        store = await open_store(settings, migrate_first=True)
        try:
            # The local executor embeds in-process; the Ray one loads models in its actors
            # (auto: the pipeline builds the embedder itself if it runs in-process).
            embedder = build_embedder(config.embedder) if args.executor == "local" else None
            max_tokens = effective_max_tokens(
                config, embedder.max_tokens if embedder else _embedder_window(settings)
            )
            options = IngestOptions(
                roots=roots,
                prune=args.prune,
                executor=args.executor,
                embed_actors=args.actors or settings.ingestion.embed_actors,
                batch_size=settings.embedding.batch_size,
                max_tokens=max_tokens,
            )

            def progress(event: str, done: int, total: int) -> None:
                line = {"event": "progress", "done": done, "total": total}
                print(json.dumps(line), file=out, flush=True)

            with IngestDisplay(console, enabled=not (args.quiet or args.json_lines)) as display:
                report = await run_ingest(
                    store,
                    config,
                    options,
                    embedder=embedder,
                    progress=progress if args.json_lines else None,
                    detail=display.update,
                )
            return report.as_dict()
        finally:
            await store.close()

    try:
        result = asyncio.run(run())
    except IngestFailed as failed:
        # What failed and what is in the store, never a bare traceback or a silent exit.
        print(f"agent-service: {failed}", file=sys.stderr)
        if args.json or args.json_lines:
            report = {**failed.report.as_dict(), "failed": True, "error": str(failed)}
            report["not_ingested"] = failed.not_ingested
            print(
                json.dumps({"event": "report", **report} if args.json_lines else report), file=out
            )
        return EXIT_FAILURE
    for reason in result["skip_reasons"]:  # type: ignore[attr-defined]
        console.print(f"[yellow]skipped[/yellow] {reason}")
    if args.json_lines:
        print(json.dumps({"event": "report", **result}), file=out, flush=True)
    elif args.json:
        print(json.dumps(result, indent=2), file=out)
    else:
        print(
            "ingested: {new} new, {unchanged} unchanged, {replaced} replaced, {pruned} pruned, "
            "{skipped} skipped; {chunks_written} chunks written in {seconds}s".format(**result)
            + (f" ({result['executor']})" if result["executor"] else ""),
            file=out,
        )
    return EXIT_OK


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class IngestDisplay:
    """A run on the terminal (stderr): one line for what discovery found, then a bar over the
    chunks to embed, with the chunks embedded and the documents written so far. On a terminal
    the bar redraws in place; piped, it is printed once, when the run ends."""

    def __init__(self, console: Any, *, enabled: bool) -> None:
        from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

        self._console = console
        self._enabled = enabled
        self._progress = Progress(
            TextColumn("ingesting"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} chunks embedded,"),
            TextColumn("{task.fields[written]}/{task.fields[documents]} documents written"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self._found = False
        self._task: TaskID | None = None

    def __enter__(self) -> IngestDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._progress.stop()

    def update(self, now: IngestProgress) -> None:
        if not self._enabled:
            return
        if not self._found:  # the first update comes once the sources are counted
            self._found = True
            self._console.print(found_line(now), highlight=False)
        if self._task is None:
            if not now.documents:
                return
            self._progress.start()  # the bar only when there is something to ingest
            self._task = self._progress.add_task(
                "ingest", total=now.chunks, written=0, documents=now.documents
            )
        self._progress.update(
            self._task,
            completed=now.chunks_embedded,
            total=max(now.chunks, now.chunks_embedded),
            written=now.documents_written,
            documents=now.documents,
        )


def found_line(now: IngestProgress) -> str:
    """``found 26 documents: 3 to ingest (40 chunks), 23 unchanged``."""
    line = f"found {_count(now.discovered, 'document')}: "
    if now.documents:
        line += f"{now.documents} to ingest ({_count(now.chunks, 'chunk')}), "
        line += f"{now.unchanged} unchanged"
    else:
        line += f"nothing to ingest, {now.unchanged} unchanged"
    return line + (f", {now.skipped} skipped" if now.skipped else "")


def _embedder_window(settings: Settings) -> int:
    if settings.embedding.backend == "openai":
        return 8191
    from retrieval.embedders import MINILM_NAMES

    if settings.embedding.model in MINILM_NAMES:
        return 256
    from retrieval.embedders import build_embedder
    from serve_app.wiring import embedder_config

    return build_embedder(embedder_config(settings)).max_tokens


# --- search ---


def _hit_row(hit: Any) -> dict[str, object]:
    return {
        "chunk_id": hit.chunk_id,
        "source": hit.source,
        "section": hit.section,
        "text": hit.text,
        "score": round(hit.score, 6),
    }


def cmd_search(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from foundation.acl import caller_entries
    from serve_app.wiring import build_retriever, open_store

    if not args.query and not args.batch:
        raise CliError("give a QUERY or --batch FILE.jsonl")
    if args.top_k is not None and not 1 <= args.top_k <= 50:
        raise CliError("--top-k must be between 1 and 50")

    batch: list[dict[str, Any]] = []
    if args.batch:
        path = Path(args.batch)
        if not path.is_file():
            raise CliError(f"--batch {path}: no such file")
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CliError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(item, dict) or not isinstance(item.get("query"), str):
                raise CliError(f'{path}:{lineno}: expected {{"id": ..., "query": "..."}}')
            batch.append(item)

    async def run() -> list[tuple[Any, str, list[Any]]]:
        store = await open_store(settings)
        try:
            retriever = build_retriever(settings, store)
            results = []
            if batch:
                for item in batch:
                    acl = caller_entries(
                        item.get("roles", csv_list(args.roles)),
                        item.get("domains", csv_list(args.domains)),
                    )
                    hits = await retriever.search(item["query"], acl=acl, top_k=args.top_k)
                    results.append((item.get("id"), item["query"], hits))
            else:
                acl = caller_entries(csv_list(args.roles), csv_list(args.domains))
                hits = await retriever.search(args.query, acl=acl, top_k=args.top_k)
                results.append((None, args.query, hits))
            return results
        finally:
            await store.close()

    results = asyncio.run(run())
    if batch:
        for item_id, _, hits in results:
            print(json.dumps({"id": item_id, "results": [_hit_row(h) for h in hits]}), file=out)
        return EXIT_OK
    _, query, hits = results[0]
    if args.json:
        print(
            json.dumps({"query": query, "results": [_hit_row(h) for h in hits]}, indent=2), file=out
        )
        return EXIT_OK
    if not hits:
        print("no results visible to this caller", file=out)
    for rank, hit in enumerate(hits, start=1):
        sides = []
        if hit.vector_rank is not None:
            sides.append(f"vector #{hit.vector_rank}")
        if hit.keyword_rank is not None:
            sides.append(f"keyword #{hit.keyword_rank}")
        print(f"{rank}. [{hit.chunk_id}] {hit.source} > {hit.section or '(top)'}", file=out)
        print(f"   score {hit.score:.4f} ({', '.join(sides)})", file=out)
        snippet = " ".join(hit.text.split())
        print(f"   {snippet[:240]}{'...' if len(snippet) > 240 else ''}", file=out)
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """The ``ingest`` and ``search`` commands."""
    ingest = sub.add_parser(
        "ingest",
        help="ingest .qd/.md/.markdown documentation into the knowledge base (idempotent)",
        description="Discovers sources under the roots (DOC_ROOTS by default), skips unchanged "
        "ones (content hash, ACL, embedding model), chunks and embeds the rest with Ray Data, "
        "and writes each document in one transaction, replacing its older version. Under "
        "`ray job submit -- agent-service ingest` it runs on that cluster.",
    )
    ingest.add_argument(
        "--root", action="append", metavar="DIR", help="a documentation root (repeatable)"
    )
    ingest.add_argument(
        "--acl",
        metavar="ENTRIES",
        help="default ACL for --root pages without front-matter permissions, "
        "e.g. role:business_staff,domain:acme (empty: visible to all)",
    )
    ingest.add_argument(
        "--prune", action="store_true", help="delete documents whose source is gone"
    )
    ingest.add_argument(
        "--executor",
        choices=["auto", "ray", "local"],
        default="auto",
        help="auto (default): Ray Data on a running cluster (RAY_ADDRESS) or from "
        "INGEST_RAY_MIN_CHUNKS chunks, else in-process; ray: the Ray Data pipeline; local: "
        "the same stages in this process",
    )
    ingest.add_argument("--actors", type=int, help="embedding actors (INGEST_EMBED_ACTORS)")
    ingest.add_argument("--json", action="store_true", help="print the report as JSON")
    ingest.add_argument(
        "--quiet", action="store_true", help="no progress display (documents found, the bar)"
    )
    ingest.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # else `agent-service -v ingest` would be reset to False
        help="log and span lines on the terminal too (always in <home>/logs/ingest.log)",
    )
    ingest.add_argument(
        "--json-lines",
        action="store_true",
        help="machine-readable progress: one JSON line per document written, then the report",
    )
    ingest.set_defaults(handler=cmd_ingest)

    search = sub.add_parser(
        "search",
        help="hybrid search as a given caller: ranked chunks with sources and scores",
        description="Runs the same retrieval as the search_docs tool (vector + full-text, "
        "ACL-filtered in SQL, RRF, reranker). --batch FILE.jsonl reads "
        '{"id","query"[,"roles","domains"]} lines and writes one {"id","results":[...]} '
        "line each, loading models once.",
    )
    search.add_argument("query", nargs="?", help="the query text")
    search.add_argument("--top-k", type=int, help="results to return (default TOP_K_FINAL)")
    search.add_argument("--roles", help="caller roles, comma-separated (e.g. business_staff)")
    search.add_argument("--domains", help="caller domains, comma-separated (e.g. acme)")
    search.add_argument("--json", action="store_true", help="print JSON")
    search.add_argument("--batch", metavar="FILE", help="JSON-lines file of queries")
    search.set_defaults(handler=cmd_search)
