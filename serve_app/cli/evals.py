"""``agent-service eval``: golden datasets against the running service (``evals.command``);
``agent-service eval export-feedback``: users' rated turns as golden-row candidates
(``evals.feedback_export``), read straight from the database."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from foundation.settings import Settings
from serve_app.cli.common import EXIT_OK, CliError

EXPORT_FEEDBACK = "export-feedback"
EXPORT_ONLY = "--out, --rating and --since go with `agent-service eval export-feedback`"
_AGO = re.compile(r"^(\d+)([dh])$")


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """``--since``: an ISO date or time (UTC unless it says otherwise), or ``7d``/``24h``
    ago."""
    ago = _AGO.fullmatch(text.strip())
    if ago:
        amount = int(ago.group(1))
        delta = timedelta(days=amount) if ago.group(2) == "d" else timedelta(hours=amount)
        return (now or datetime.now(UTC)) - delta
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(
            f"--since {text!r}: give an ISO date or time (2026-12-01, 2026-12-01T08:00) "
            "or an age (7d, 24h)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def cmd_export_feedback(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Rated turns of every user -> golden-row candidates (YAML) in FILE or on stdout."""
    import asyncpg

    from conversations.feedback import PgFeedbackStore, RatedTurn, Rating
    from evals.feedback_export import export_candidates
    from foundation.database import DatabaseError, resolve_database_url

    if len(args.datasets) > 1:
        raise CliError(f"{EXPORT_FEEDBACK} takes no dataset: {' '.join(args.datasets[1:])}")
    rating = args.rating or "down"
    by_name: dict[str, Rating] = {"up": "up", "down": "down"}  # "all": no filter
    since = parse_since(args.since) if args.since else None

    async def read() -> list[RatedTurn]:
        store = await PgFeedbackStore.connect(
            await resolve_database_url(settings), min_size=1, max_size=1
        )
        try:
            return await store.rated(rating=by_name.get(rating), since=since)
        finally:
            await store.close()

    try:
        turns = asyncio.run(read())
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseError(f"cannot read the feedback: {type(exc).__name__}: {exc}") from None
    export = export_candidates(turns)
    if args.out:
        Path(args.out).write_text(export.text, encoding="utf-8")
        where, report = f"to {args.out}", out
    else:
        out.write(export.text)
        where, report = "above", sys.stderr
    print(
        f"{export.rows} golden-row candidate(s) from {len(turns)} rated turn(s) "
        f"(rating: {rating}{f', since {since.isoformat()}' if since else ''}) {where}; "
        "review them before adding them to a dataset",
        file=report,
    )
    for ident, why in export.skipped:
        print(f"  left out {ident}: {why}", file=report)
    return EXIT_OK


def cmd_eval(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    if args.datasets[:1] == [EXPORT_FEEDBACK]:
        return cmd_export_feedback(args, settings, out)
    if args.out or args.rating or args.since:
        raise CliError(EXPORT_ONLY)

    from evals.command import EvalOptions, EvalUsageError, run_eval_command
    from serve_app.wiring import eval_config, judge_config, opened_retriever

    try:
        return run_eval_command(
            EvalOptions.from_namespace(args),
            eval_config(settings),
            out,
            judge=lambda: judge_config(settings),
            open_retriever=lambda: opened_retriever(settings),
        )
    except EvalUsageError as exc:
        raise CliError(str(exc)) from None


def add_parsers(sub: Any) -> None:
    """The ``eval`` command."""
    ev = sub.add_parser(
        "eval",
        help="run golden datasets against the running service and score them "
        "(exit 0: all non-xfail rows pass, 1: a failure, 2: usage/config/dataset error)",
        description="Asks every row over HTTP with an eval token minted from EVAL_JWT_SECRET "
        "for the row's user, scores its expectations (a judge model, JUDGE_MODEL, grades "
        "'declined' and 'rubric'), prints a summary, and writes JUnit XML and a Markdown "
        "report. --models runs one Ray task per model and compares them; --retrieval measures "
        "recall@k and MRR of the documentation search alone. `agent-service eval "
        "export-feedback [--out FILE] [--rating down|up|all] [--since WHEN]` instead writes "
        "the turns users rated (POST /feedback) as golden-row candidates to review (read from "
        "the database; no service needed). Rows are split into dev (fitted on; the default) "
        "and test (frozen; --split test is the run of record). See evals/README.md.",
    )
    ev.add_argument(
        "datasets",
        nargs="*",
        metavar="DATASET",
        help="YAML files (default: golden.yaml and test.yaml); or `export-feedback`",
    )
    ev.add_argument(
        "--split",
        choices=("dev", "test", "all"),
        help="which rows: dev (the default; may be fitted on), test (frozen: the run of "
        "record) or all; a --rescore defaults to the saved run's split",
    )
    ev.add_argument(
        "--world",
        action="append",
        metavar="NAME",
        help="only rows of this world (their world:<name> tag; untagged rows are the sample "
        "world); repeatable or comma-separated; default every world",
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
    export = ev.add_argument_group("export-feedback")
    export.add_argument("--out", metavar="FILE", help="write the candidates here (default stdout)")
    export.add_argument(
        "--rating",
        choices=("down", "up", "all"),
        help="which ratings to export (default down)",
    )
    export.add_argument(
        "--since",
        metavar="WHEN",
        help="only turns rated since: an ISO date/time (UTC by default) or an age (7d, 24h)",
    )
    ev.set_defaults(handler=cmd_eval)
