"""``agent-service ask``: a question to the running service over HTTP, as a given caller."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from foundation.settings import Settings
from local_world.world_file import WorldFileError, load_world_file
from serve_app.ask_output import StreamPrinter, parse_sse_lines, print_summary
from serve_app.cli.common import EXIT_OK, CliError, csv_list


def claims_header(sub: str, roles: list[str], domains: list[str]) -> str:
    """An ``x-gateway-claims`` value as the mesh sets it (memberships: domain x role)."""
    import base64

    memberships = [{"domain": d, "role": r} for d in (domains or [""]) for r in roles]
    payload = {"sub": sub, "memberships": memberships}
    return base64.b64encode(json.dumps(payload).encode()).decode()


def add_caller_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the service is and who is asking (``ask`` and ``conversations``)."""
    parser.add_argument("--url", help="API base URL (default: the local service)")
    parser.add_argument(
        "--as",
        dest="as_user",
        metavar="USER",
        help="ask as one of the local world's users (the `users` of LOCAL_WORLD_FILE, else "
        "of the sample world: the chat page's development users); --sub/--roles/--domains "
        "still override its fields",
    )
    parser.add_argument(
        "--sub", help="default: the local world's default caller (the sample's: demo-user)"
    )
    parser.add_argument(
        "--roles", help="comma-separated; default: the default caller's (business_staff)"
    )
    parser.add_argument(
        "--domains", help="comma-separated; default: the default caller's (northwind)"
    )


def caller_of(args: argparse.Namespace, settings: Settings) -> tuple[str, list[str], list[str]]:
    """``(sub, roles, domains)``: ``--as`` (a user of the local world) or the world's default
    caller, with each of ``--sub``/``--roles``/``--domains`` given replacing its part."""
    try:
        world = load_world_file(settings.serve.local_world_file)
    except WorldFileError as exc:
        raise CliError(f"LOCAL_WORLD_FILE: {exc}") from None
    if args.as_user:
        user = world.user(args.as_user)
        if user is None:
            known = ", ".join(u.id for u in world.users) or "none"
            raise CliError(
                f"--as {args.as_user}: the local world {world.name!r} has no such user "
                f"(its users: {known})"
            )
        sub, roles, domains = user.id, list(user.roles), list(user.domains)
    elif (default := world.caller) is not None:
        sub, roles, domains = default.sub, list(default.roles), list(default.domains)
    else:
        sub, roles, domains = "demo-user", ["business_staff"], [world.domains[0].id]
    if args.sub:
        sub = args.sub
    if args.roles:
        roles = csv_list(args.roles)
    if args.domains:
        domains = csv_list(args.domains)
    return sub, roles, domains


def api_base(args: argparse.Namespace, settings: Settings) -> str:
    url: str = args.url or (
        f"http://{settings.serve.host}:{settings.serve.port}{settings.http.api_prefix}"
    )
    return url


def caller_headers(args: argparse.Namespace, settings: Settings) -> dict[str, str]:
    """The ``x-gateway-claims`` header of the caller (``caller_of``)."""
    return {"x-gateway-claims": claims_header(*caller_of(args, settings))}


def where_stored(result: dict[str, Any]) -> str:
    """The line saying which conversation and turn the answer was stored as."""
    ident, turn = result.get("conversation_id"), result.get("turn")
    if ident is None or turn is None:
        where = f"conversation {ident}, " if ident else ""
        return f"  {where}turn not stored"
    return f"  conversation {ident}, turn {turn} (follow up: --conversation {ident})"


def cmd_ask(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    import httpx

    base = api_base(args, settings)
    headers = caller_headers(args, settings)
    # Streaming is the default (a person sees progress at once); --json prints the response
    # object exactly, so it asks for it whole.
    stream = not (args.no_stream or args.json)
    body: dict[str, Any] = {"question": args.question, "stream": stream}
    if args.top_k:
        body["top_k"] = args.top_k
    if args.model:
        body["model"] = args.model
    if args.conversation:
        body["conversation_id"] = args.conversation
    timeout = httpx.Timeout(settings.serve.ready_timeout_s, connect=10)
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
    print(where_stored(result), file=out)
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


def add_parsers(sub: Any) -> None:
    """The ``ask`` command."""
    ask = sub.add_parser(
        "ask",
        help="ask the running service a question over HTTP, as a given caller",
        description="POSTs to /ask with an x-gateway-claims header for --as USER or "
        "--sub/--roles/--domains (as the mesh would set it) and streams the answer: the "
        "answering model, a line per tool as it runs, a waiting indicator while the model "
        "is queued, the answer text, then citations, the decision, who wrote the answer (the "
        "model or the service) and the conversation and turn it was stored as "
        "(--conversation ID asks a follow-up in it). --json prints the response object "
        "instead.",
    )
    ask.add_argument("question")
    add_caller_arguments(ask)
    ask.add_argument(
        "--conversation",
        metavar="ID",
        help="continue this conversation of yours (its id, printed after every answer)",
    )
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
