"""``agent-service eval``: golden datasets against the running service (``evals.command``)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from foundation.settings import Settings
from serve_app.cli.common import CliError


def cmd_eval(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from evals.command import EvalOptions, EvalUsageError, run_eval_command
    from serve_app.wiring import opened_retriever

    try:
        return run_eval_command(
            EvalOptions.from_namespace(args), settings, out, open_retriever=opened_retriever
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
