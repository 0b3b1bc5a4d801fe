"""A fork server for the many-seed crash test (``test_kill.py``).

It imports what ``agent-service ingest`` imports, once, then serves one JSON command per line
on stdin and answers one JSON line on stdout:

* ``{"op": "spawn", "argv": [...], "env": {...}, "stdout": PATH, "stderr": PATH}``: fork a
  child that runs ``serve_app.cli.main(argv)`` - the CLI's own code path, in a fresh process
  with its own event loop and database connections - with exactly ``env`` as its
  environment; answers ``{"pid": N}``. The test kills the child with ``kill -9 N``.
* ``{"op": "poll", "pid": N}``: ``{"exit": CODE}`` once it has ended (``-9`` when killed),
  else ``{"exit": null}``.
* ``{"op": "wait", "pid": N}``: blocks until it ends; ``{"exit": CODE}``.

Only the interpreter start-up and imports (about two seconds a run on a loaded 2-core
machine) are saved; the kill lands in a real process doing real I/O.

Run as ``python -m tests.ingest_jobs.forkserver`` from the project root.
"""

from __future__ import annotations

import json
import os
import sys


def _preload() -> None:
    import alembic.command  # noqa: F401
    import asyncpg  # noqa: F401
    import openai  # noqa: F401
    import psycopg  # noqa: F401
    import rich.progress  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

    import foundation.observability.setup  # noqa: F401
    import ingest_jobs.pipeline  # noqa: F401
    import retrieval.embedders  # noqa: F401
    import serve_app.cli
    import serve_app.wiring  # noqa: F401


def _child(request: dict[str, object]) -> None:
    code = 70
    try:
        os.environ.clear()
        os.environ.update(request["env"])  # type: ignore[arg-type]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, key in ((1, "stdout"), (2, "stderr")):
            target = os.open(str(request[key]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
        from serve_app.cli import main

        code = main(list(request["argv"]))  # type: ignore[call-overload]
    except BaseException as exc:  # the report below is all a dying child can do
        print(f"forkserver child: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "spawn":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(request)
            answer: dict[str, object] = {"pid": pid}
        elif op in ("poll", "wait"):
            flags = os.WNOHANG if op == "poll" else 0
            done, status = os.waitpid(int(request["pid"]), flags)
            answer = {"exit": os.waitstatus_to_exitcode(status) if done else None}
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
