"""The single-process server: the whole API in one FastAPI process, no Ray.

This is the spec's FastAPI-only architecture, kept as the baseline the Serve application is
benchmarked against. Run it with uvicorn::

    uvicorn --factory serve_app.api.single_process:create_single_process_app --port 3000

or ``python -m serve_app.api.single_process --port 3000``. Settings come from the environment
(and ``.env``), exactly as for the Serve application.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from foundation.observability.setup import configure_observability
from foundation.settings import Settings, SettingsError, load_settings
from serve_app.api.app import create_app
from serve_app.authz import CedarAuthorizer, load_authorizer
from serve_app.local_backend import LocalBackend
from serve_app.wiring import build_local_backend


def create_single_process_app(
    settings: Settings | None = None,
    *,
    backend: LocalBackend | None = None,
    authorizer: CedarAuthorizer | None = None,
) -> FastAPI:
    """The API over an in-process ``LocalBackend``. The app's lifespan opens the database
    (if it is there) at startup and closes the backend at shutdown, on the server's loop."""
    settings = settings or load_settings()
    authorizer = authorizer or load_authorizer()
    local = backend or build_local_backend(settings, authorizer=authorizer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await local.start()
        try:
            yield
        finally:
            await local.close()

    return create_app(local, settings, authorizer, lifespan=lifespan)


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m serve_app.api.single_process",
        description="Serve the agent-service API from one process (no Ray).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"agent-service: {exc}", file=sys.stderr)
        return 2
    configure_observability(settings, "single-process")
    uvicorn.run(create_single_process_app(settings), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
