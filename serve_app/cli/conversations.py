"""``agent-service conversations``: a caller's conversations through the running service
(``list``, ``show``, ``delete``: the HTTP API as ``--as`` or ``--sub``/``--roles``/
``--domains``, like ``ask``), and ``prune``: the retention job, straight on the database
(every owner's conversations inactive for more than ``CONVERSATION_TTL_DAYS``)."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from typing import Any, TextIO

from foundation.settings import Settings
from serve_app.ask_output import written_by
from serve_app.cli.ask import add_caller_arguments, api_base, caller_headers
from serve_app.cli.common import EXIT_OK, CliError

KEPT_FOREVER = "CONVERSATION_TTL_DAYS is 0: conversations are kept forever; nothing deleted"


def _call(
    args: argparse.Namespace,
    settings: Settings,
    method: str,
    path: str,
    params: dict[str, Any] | None = None,
) -> Any:
    """One request to the service as the caller; its JSON (None for an empty body). An error
    envelope is a ``CliError`` carrying its message."""
    import httpx

    base = api_base(args, settings)
    try:
        with httpx.Client(timeout=httpx.Timeout(30, connect=10)) as client:
            resp = client.request(
                method, f"{base}{path}", headers=caller_headers(args, settings), params=params
            )
    except httpx.HTTPError as exc:
        raise CliError(f"could not reach {base} ({type(exc).__name__}); is it running?") from None
    if resp.status_code >= 400:
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text
        raise CliError(f"HTTP {resp.status_code}: {message}")
    return resp.json() if resp.content else None


def cmd_list(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.cursor:
        params["cursor"] = args.cursor
    page = _call(args, settings, "GET", "/conversations", params)
    if args.json:
        print(json.dumps(page, indent=2), file=out)
        return EXIT_OK
    if not page["conversations"]:
        print("no conversations", file=out)
    for c in page["conversations"]:
        turns = f"{c['turn_count']} turn{'s' if c['turn_count'] != 1 else ''}"
        print(f"{c['id']}  {c['updated_at']}  {turns:>9}  {c['title']}", file=out)
    if page["next_cursor"]:
        print(f"more: agent-service conversations list --cursor {page['next_cursor']}", file=out)
    return EXIT_OK


def cmd_show(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    thread = _call(args, settings, "GET", f"/conversations/{args.id}")
    if args.json:
        print(json.dumps(thread, indent=2), file=out)
        return EXIT_OK
    print(f"{thread['id']}  {thread['title']}  ({thread['turn_count']} turns)", file=out)
    for turn in thread["turns"]:
        print(f"\n[{turn['turn']}] {turn['created_at']}  Q: {turn['question']}", file=out)
        print(f"    A: {turn['answer']}", file=out)
        for cite in turn["citations"]:
            print(f"    [^{cite['chunk_id']}] {cite['source']} > {cite['section'] or ''}", file=out)
        tools = ", ".join(call["name"] for call in turn["tool_calls"])
        author = written_by(turn)  # None for a turn stored before it was recorded
        print(
            f"    [decision: {turn['decision']}, model: {turn['model']}"
            + (f", written by {author}" if author else "")
            + (f", tools: {tools}" if tools else "")
            + "]",
            file=out,
        )
    return EXIT_OK


def cmd_delete(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    if args.all == (args.id is not None):
        raise CliError("give a conversation ID or --all (every conversation of --sub)")
    if args.all:
        deleted = _call(args, settings, "DELETE", "/conversations")["deleted"]
        print(f"deleted {deleted} conversation{'s' if deleted != 1 else ''}", file=out)
    else:
        _call(args, settings, "DELETE", f"/conversations/{args.id}")
        print(f"deleted {args.id}", file=out)
    return EXIT_OK


async def _prune(settings: Settings, batch_size: int, dry_run: bool) -> dict[str, Any]:
    from conversations.store import PgConversationStore
    from foundation.database import redact, resolve_database_url
    from serve_app.wiring import conversations_config

    config = conversations_config(settings)
    assert config.ttl is not None  # cmd_prune: CONVERSATION_TTL_DAYS=0 prunes nothing
    url = await resolve_database_url(settings)
    store = await PgConversationStore.open(url, replace(config, min_size=1, max_size=1))
    try:
        report = await store.prune(config.ttl, batch_size=batch_size, dry_run=dry_run)
    finally:
        await store.close()
    return {
        "database": redact(url),
        "ttl_days": settings.conversations.ttl_days,
        "cutoff": report.cutoff.isoformat(),
        "dry_run": report.dry_run,
        "conversations": report.conversations,
        "turns": report.turns,
        "batches": report.batches,
    }


def cmd_prune(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    if args.batch_size < 1:
        raise CliError("--batch-size must be at least 1")
    if settings.conversations.ttl_days == 0:
        result: dict[str, Any] = {
            "ttl_days": 0,
            "conversations": 0,
            "turns": 0,
            "batches": 0,
            "note": KEPT_FOREVER,
        }
    else:
        result = asyncio.run(_prune(settings, args.batch_size, args.dry_run))
    print(json.dumps(result), file=out)
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """The ``conversations`` command and its actions."""
    conv = sub.add_parser(
        "conversations",
        help="a caller's conversations (list, show, delete: over HTTP, like ask) and the "
        "retention job (prune: CONVERSATION_TTL_DAYS, on the database)",
        description="list/show/delete call the running service's /conversations routes as "
        "--sub/--roles/--domains (the x-gateway-claims header, as ask sends it). prune deletes "
        "every owner's conversations whose latest turn is older than CONVERSATION_TTL_DAYS, "
        "straight on the database (DATABASE_URL or the embedded one), in batches of their own "
        "transactions, and prints the counts as JSON; with CONVERSATION_TTL_DAYS=0 it "
        "deletes nothing.",
    )
    actions = conv.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="your conversations, most recently active first")
    add_caller_arguments(listing)
    listing.add_argument("--limit", type=int, default=20, help="per page (1-100, default 20)")
    listing.add_argument("--cursor", help="the next page (printed after a full page)")
    listing.add_argument("--json", action="store_true", help="print the response JSON")
    listing.set_defaults(handler=cmd_list)

    show = actions.add_parser("show", help="one conversation with its turns")
    show.add_argument("id", metavar="ID")
    add_caller_arguments(show)
    show.add_argument("--json", action="store_true", help="print the response JSON")
    show.set_defaults(handler=cmd_show)

    delete = actions.add_parser("delete", help="delete one conversation, or --all of yours")
    delete.add_argument("id", metavar="ID", nargs="?")
    delete.add_argument("--all", action="store_true", help="every conversation of --sub")
    add_caller_arguments(delete)
    delete.set_defaults(handler=cmd_delete)

    prune = actions.add_parser(
        "prune", help="delete conversations inactive for over CONVERSATION_TTL_DAYS (JSON counts)"
    )
    prune.add_argument(
        "--batch-size", type=int, default=1000, help="conversations per transaction (default 1000)"
    )
    prune.add_argument("--dry-run", action="store_true", help="count them, delete nothing")
    prune.set_defaults(handler=cmd_prune)
