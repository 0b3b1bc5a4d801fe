"""Discover, read and fingerprint documentation sources; chunk one document.

These are the plain functions every executor runs (the Ray Data job and the in-process one),
so the two produce identical stores."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.acl import AclError, parse_acl
from retrieval.chunking import (
    FrontMatterError,
    SourceDecodeError,
    chunk_markdown,
    decode_source,
    parse_source,
)

SOURCE_SUFFIXES = (".qd", ".md", ".markdown")
# Bump when chunking changes in a way that should re-chunk every document.
CHUNKER_VERSION = "1"


@dataclass(frozen=True)
class SourceFile:
    path: Path
    source: str  # stable id stored in documents.source: the path as discovered
    default_acl: tuple[str, ...]


@dataclass(frozen=True)
class PreparedSource:
    """A source read and parsed, not yet chunked."""

    source: str
    title: str | None
    body: str
    content_hash: str
    fingerprint: str
    permissions: list[str]
    metadata: dict[str, object]
    path: Path | None = None  # where a Ray worker reads it again (``read_body``)


@dataclass(frozen=True)
class SkippedSource:
    source: str
    reason: str


def discover(roots: Iterable[tuple[Path, Sequence[str]]]) -> list[SourceFile]:
    """Every ``.qd``/``.md``/``.markdown`` file under each root, sorted; a root that does not
    exist is an error (a typo should not silently ingest nothing)."""
    found: dict[str, SourceFile] = {}
    for root, acl in roots:
        if not root.is_dir():
            raise FileNotFoundError(f"documentation root {root} is not a directory")
        # Sorted once, by name, at the end (sorting ``Path`` objects as well cost ~0.1 s of
        # 30,000 pages), and only a name with a source suffix is worth a ``stat``.
        for path in root.rglob("*"):
            if path.suffix.lower() in SOURCE_SUFFIXES and path.is_file():
                source = path.as_posix()
                found.setdefault(source, SourceFile(path, source, tuple(acl)))
    return [found[k] for k in sorted(found)]


def fingerprint(
    content_hash: str, permissions: Sequence[str], embedder_name: str, max_tokens: int
) -> str:
    """What decides "unchanged": content, effective ACL, embedding model, chunk budget."""
    payload = json.dumps(
        [content_hash, sorted(permissions), embedder_name, max_tokens, CHUNKER_VERSION]
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def prepare(
    file: SourceFile, *, embedder_name: str, max_tokens: int
) -> PreparedSource | SkippedSource:
    """Read, decode, parse front matter, hash. Bad files become a skip with a clear reason."""
    try:
        data = file.path.read_bytes()
    except OSError as exc:
        return SkippedSource(file.source, f"{file.source}: cannot read ({exc.strerror}); skipped")
    try:
        parsed = parse_source(decode_source(data, file.source), file.source)
        permissions = (
            parse_acl(parsed.permissions)
            if parsed.permissions is not None
            else list(file.default_acl)
        )
    except (SourceDecodeError, FrontMatterError) as exc:
        return SkippedSource(file.source, str(exc))
    except AclError as exc:
        return SkippedSource(file.source, f"{file.source}: front matter permissions: {exc}")
    metadata = {k: _jsonable(v) for k, v in parsed.metadata.items()}
    holder = _holds_nul(parsed.title, parsed.body, metadata)
    if holder is not None:
        # PostgreSQL text and jsonb cannot store U+0000: writing it would fail the whole run,
        # and every re-run again at the same file.
        return SkippedSource(
            file.source,
            f"{file.source}: {holder} contains a NUL character (U+0000), which the knowledge "
            "base cannot store; skipped",
        )
    content_hash = hashlib.sha256(data).hexdigest()
    return PreparedSource(
        source=file.source,
        title=parsed.title,
        body=parsed.body,
        content_hash=content_hash,
        fingerprint=fingerprint(content_hash, permissions, embedder_name, max_tokens),
        permissions=permissions,
        metadata=metadata,
        path=file.path,
    )


class SourceChanged(RuntimeError):
    """A source's bytes differ from the ones hashed when the run began."""


def read_body(path: Path, source: str, content_hash: str) -> str:
    """The Markdown body of a source already prepared, read again where the pipeline runs (a
    Ray worker): the driver sends paths, not text, so no corpus-sized object crosses the
    object store at once. A file that changed since it was hashed fails the run: its new
    text must not be stored under the old fingerprint."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != content_hash:
        raise SourceChanged(f"{source} changed while it was being ingested; run again")
    return parse_source(decode_source(data, source), source).body


def _holds_nul(title: str | None, body: str, metadata: dict[str, object]) -> str | None:
    """Which part of a parsed source holds U+0000 (a raw NUL byte, or a YAML ``\\0`` /
    ``\\x00`` / ``\\u0000`` escape in the front matter), if any."""
    if "\x00" in body:
        return "the text"
    if title is not None and "\x00" in title:
        return "the title"
    if _has_nul(metadata):
        return "the front matter"
    return None


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def _jsonable(value: object) -> object:
    try:
        json.dumps(value)
    except TypeError:
        return str(value)
    return value


def chunk_id(source: str, ordinal: int, text: str) -> str:
    """Short, stable id: what the model copies into a ``[^id]`` citation marker."""
    return hashlib.sha256(f"{source}\0{ordinal}\0{text}".encode()).hexdigest()[:12]


def chunk_rows(
    doc: PreparedSource, count_tokens: Callable[[str], int], max_tokens: int
) -> list[dict[str, Any]]:
    """One row per chunk, carrying what the writer needs to rebuild the document."""
    chunks = chunk_markdown(doc.body, count_tokens, max_tokens)
    return [
        {
            "source": doc.source,
            "n_chunks": len(chunks),
            "id": chunk_id(doc.source, ch.ordinal, ch.text),
            "ordinal": ch.ordinal,
            "text": ch.text,
            "section": ch.section,
            "kind": ch.kind,
            "token_count": ch.token_count,
            "oversized": ch.oversized,
        }
        for ch in chunks
    ]
