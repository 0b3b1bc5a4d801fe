"""``agent-service``: the one command-line entry point.

Subcommands (one module of this package per group):
  db       start/stop the embedded PostgreSQL, migrate, show status          (db.py)
  ingest   load the documentation into the knowledge base (Ray Data job)      (ingest.py)
  search   run a hybrid search as a given caller (retrieval debugging)         (ingest.py)
  serve    start the whole service on this machine; stop: stop it              (serve.py)
  ask      ask the running service a question over HTTP                        (ask.py)
  conversations  list/show/delete a caller's conversations; prune  (conversations.py)
  eval     run the golden dataset against the running service                  (evals.py)
  train-reranker  train the cross-encoder reranker offline                     (reranker.py)
  bench    run a benchmark of bench/ (python -m bench.NAME) or list them       (bench.py)
  config   every setting: variable, default, value here (redacted), meaning    (config.py)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from foundation.settings import SettingsError, load_settings
from serve_app.cli import (
    ask,
    bench,
    config,
    conversations,
    db,
    evals,
    ingest,
    reranker,
    serve,
)
from serve_app.cli.ask import claims_header, cmd_ask
from serve_app.cli.bench import bench_command, bench_listing, bench_modules, bench_root, cmd_bench
from serve_app.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    configure_logging,
    log,
)
from serve_app.cli.db import cmd_db
from serve_app.cli.evals import cmd_eval
from serve_app.cli.ingest import cmd_ingest, cmd_search
from serve_app.cli.reranker import cmd_train_reranker
from serve_app.cli.serve import cmd_serve, cmd_stop

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "bench_command",
    "bench_listing",
    "bench_modules",
    "bench_root",
    "build_parser",
    "claims_header",
    "cmd_ask",
    "cmd_bench",
    "cmd_db",
    "cmd_eval",
    "cmd_ingest",
    "cmd_search",
    "cmd_serve",
    "cmd_stop",
    "cmd_train_reranker",
    "log",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-service",
        description="CrowdVision's tool-calling assistant on Ray Serve. Settings come from the "
        "environment (and .env); `agent-service config` lists every variable.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # In the order `--help` lists them.
    for group in (db, ingest, serve, ask, conversations, evals, reranker, bench, config):
        group.add_parsers(sub)
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
    configure_logging(settings, args.verbose)
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
