"""``agent-service serve`` and ``agent-service stop``: the whole service on this machine."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, TextIO

from foundation.settings import Settings
from serve_app.cli.common import EXIT_OK, CliError
from serve_app.cli.db import db_up


def cmd_serve(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from serve_app.runner import RunnerError, local_llm_settings, serve

    asyncio.run(db_up(settings))
    try:
        state = serve(
            settings,
            simulators=settings.serve.start_simulators and not args.no_simulators,
            local_llm=False if args.no_local_llm else (True if args.local_llm else None),
        )
    except RunnerError as exc:
        raise CliError(str(exc)) from None
    for note in state.notes:
        print(f"note: {note}", file=out)
    print(f"API        {state.api_url}  (docs: {state.api_url}/docs)", file=out)
    print(f"chat page  {state.api_url}/ui/  ({chat_sign_in(settings)})", file=out)
    print(f"dashboard  {state.dashboard_url}  (token: ~/.ray/auth_token)", file=out)
    if state.local_llm:
        models = ", ".join(local_llm_settings(settings).served_models)
        url = f"http://{settings.serve.host}:{settings.serve.port}/llm/v1"
        print(f"local LLM  {url}  (models: {models})", file=out)
    print("stop with: agent-service stop", file=out)
    return EXIT_OK


def chat_sign_in(settings: Settings) -> str:
    """How a person signs in to the chat page on this server."""
    from serve_app.ui.dev_users import dev_sign_in_enabled

    if dev_sign_in_enabled(settings):
        return "development sign-in: pick a local user"
    return "signed by the mesh's x-gateway-claims; set EVAL_JWT_SECRET for a local sign-in"


def cmd_stop(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from serve_app.runner import stop

    done = stop(settings)
    print("\n".join(done) if done else "nothing was running", file=out)
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """The ``serve`` and ``stop`` commands."""
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
