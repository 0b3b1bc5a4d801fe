"""Count what a client sends to PostgreSQL, message by message, from the wire.

``WireLog.attach(conn)`` wraps the write side of one asyncpg connection's transport and parses
the frontend protocol (each message: a type byte, an int32 length, the body). It groups the
messages into *round trips*: every point where the client stops and waits for the server.
asyncpg waits after

* ``Parse + Describe + Flush``: preparing a statement (a statement-cache miss),
* ``Bind + Execute + Sync``: running a prepared statement,
* ``Query``: a simple query (``BEGIN``, ``COMMIT``, the pool's reset on release, ``COPY ...
  FROM STDIN`` up to the server's CopyInResponse),
* ``CopyData* + CopyDone``: the rows of a COPY, until its CommandComplete.

Counting on the wire catches every kind of extra trip: a second statement, a lost statement
cache (prepare + execute instead of execute), a type introspection query, a COPY turned into
INSERTs. asyncpg's public ``add_query_logger`` would miss the prepares, the introspection and
COPY, so it cannot tell one round trip from three.

(``Connection._transport`` is asyncpg's own attribute, stable since its first releases; the
protocol writes through ``transport.write`` / ``transport.writelines``.)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

# Messages after which asyncpg waits for the server.
_WAITS = {b"S", b"H", b"Q", b"c"}


@dataclass(frozen=True)
class RoundTrip:
    kind: str  # "prepare" | "execute" | "query" | "copy_data" | "sync"
    sql: str  # the statement's text (for copy_data: the COPY it belongs to)
    messages: str = ""  # the message types sent, e.g. "BES"


def _cstr(body: bytes, start: int) -> tuple[str, int]:
    end = body.index(b"\0", start)
    return body[start:end].decode(), end + 1


@dataclass
class WireLog:
    trips: list[RoundTrip] = field(default_factory=list)
    _buffer: bytearray = field(default_factory=bytearray)
    _pending: list[tuple[bytes, bytes]] = field(default_factory=list)
    _statements: dict[str, str] = field(default_factory=dict)  # prepared name -> SQL
    _last_copy: str = ""

    # --- attaching --------------------------------------------------------------------------

    def attach(self, conn: Any) -> None:
        """Log everything ``conn`` (an asyncpg connection or pool proxy) sends from now on."""
        transport = conn._transport
        write, writelines = transport.write, transport.writelines

        def counting_write(data: Any) -> None:
            self.feed(bytes(data))
            write(data)

        def counting_writelines(items: Any) -> None:
            items = list(items)
            for item in items:
                self.feed(bytes(item))
            writelines(items)

        transport.write = counting_write
        transport.writelines = counting_writelines

    def clear(self) -> None:
        self.trips.clear()

    # --- reading ----------------------------------------------------------------------------

    def labels(self, *, setup: bool = True) -> list[str]:
        """``label`` of each round trip; ``setup=False`` leaves out the per-connection ones
        (preparing a statement on a statement-cache miss, closing a discarded statement)."""
        return [label(t) for t in self.trips if setup or t.kind not in SETUP_KINDS]

    def setup_trips(self) -> list[RoundTrip]:
        return [t for t in self.trips if t.kind in SETUP_KINDS]

    # --- parsing ----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 5:
            kind = bytes(self._buffer[:1])
            (length,) = struct.unpack("!i", self._buffer[1:5])
            if len(self._buffer) < 1 + length:
                return
            body = bytes(self._buffer[5 : 1 + length])
            del self._buffer[: 1 + length]
            self._message(kind, body)

    def _message(self, kind: bytes, body: bytes) -> None:
        if kind == b"X":  # Terminate: no reply expected
            return
        self._pending.append((kind, body))
        if kind in _WAITS:
            messages, self._pending = self._pending, []
            self.trips.append(self._trip(messages))

    def _trip(self, messages: list[tuple[bytes, bytes]]) -> RoundTrip:
        kinds = [k for k, _ in messages]
        sql = ""
        for kind, body in messages:
            if kind == b"P":  # Parse: name, query, ...
                name, at = _cstr(body, 0)
                sql, _ = _cstr(body, at)
                self._statements[name] = sql
            elif kind == b"B":  # Bind: portal, statement name, ...
                _, at = _cstr(body, 0)
                name, _ = _cstr(body, at)
                sql = self._statements.get(name, sql)
            elif kind == b"Q":
                sql, _ = _cstr(body, 0)
                if sql.lstrip().upper().startswith("COPY"):
                    self._last_copy = sql
        sent = b"".join(kinds).decode()
        if b"Q" in kinds:
            return RoundTrip("query", sql, sent)
        if b"c" in kinds:
            return RoundTrip("copy_data", self._last_copy, sent)
        if b"E" in kinds:
            return RoundTrip("execute", sql, sent)
        if b"P" in kinds:
            return RoundTrip("prepare", sql, sent)
        return RoundTrip("sync", sql, sent)


SETUP_KINDS = frozenset({"prepare", "sync"})

# --- what PgDocumentStore sends, once its statement cache is warm (``labels(setup=False)``) ---

# hybrid_candidates: the one hybrid statement, then asyncpg's reset when the pool gets the
# connection back (every pool checkout ends with it). Kept on purpose: it guarantees that a
# SET on a pooled connection cannot leak into the next caller (a local round trip, ~0.3 ms).
SEARCH = ["execute: WITH vec", "query: pool reset"]

# write_document, one document: BEGIN, the per-source lock, DELETE the old version, INSERT the
# document row, COPY its chunks (the command, then all the rows: two waits), COMMIT, reset.
WRITE_DOCUMENT = [
    "query: BEGIN;",
    "execute: SELECT pg_advisory_xact_lock",
    "execute: DELETE FROM",
    "execute: INSERT INTO",
    'query: COPY "chunks"',
    'copy_data: COPY "chunks"',
    "query: COMMIT;",
    "query: pool reset",
]
WRITE_EMPTY_DOCUMENT = [t for t in WRITE_DOCUMENT if "COPY" not in t]  # no chunks, no COPY

# documents(): the fingerprints of everything stored, one statement.
LIST_DOCUMENTS = ["execute: SELECT source,", "query: pool reset"]

# build_vector_index() when the index is there: one statement.
FIND_VECTOR_INDEX = ["execute: SELECT to_regclass", "query: pool reset"]


def label(trip: RoundTrip) -> str:
    """``kind: first two words`` (each cut at a parenthesis), e.g. ``execute: DELETE FROM``,
    ``query: COPY "chunks"``; asyncpg's reset on pool release is ``query: pool reset``."""
    if is_pool_reset(trip.sql):
        return f"{trip.kind}: pool reset"
    words = [w.split("(")[0] for w in trip.sql.split()[:2]]
    return f"{trip.kind}: {' '.join(words)}".rstrip()


def is_pool_reset(sql: str) -> bool:
    """asyncpg's ``Connection.get_reset_query()``, run when a pool connection is released."""
    return "RESET ALL" in sql and "pg_advisory_unlock_all" in sql


async def log_pool(pool: Any) -> WireLog:
    """A ``WireLog`` on the one connection of ``pool`` (an asyncpg pool with ``max_size=1``,
    so every statement the pool runs goes through it), empty when returned."""
    assert pool.get_max_size() == 1, "log a one-connection pool: every query then shows"
    wire = WireLog()
    async with pool.acquire() as conn:
        wire.attach(conn)
    wire.clear()  # the release's reset
    return wire
