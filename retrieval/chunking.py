"""Markdown-aware chunking of knowledge-base sources (pure Python, no I/O).

Three steps, each usable on its own:

``decode_source(data, source)``
    UTF-8 only (a leading BOM is dropped); CRLF and lone CR become ``\\n``. Anything that is
    not valid UTF-8 raises :class:`SourceDecodeError` naming the source, the offending byte and
    its offset in ``data``, so the ingest job can log it and skip the file.

``parse_source(text, source)``
    YAML front matter sits between a first line ``---`` and the next line that is ``---``
    (trailing whitespace allowed on both). It is parsed with ``yaml.safe_load`` and never
    becomes part of the body. ``title`` must be a string and ``permissions`` a list of strings
    (kept raw; :func:`foundation.acl.parse_acl` validates the entries); ``permissions: null``
    counts as a wrong type rather than "absent", so a half-written ACL is never silently
    replaced by the folder default. The front matter must be a mapping; an opening ``---``
    with no closing line is an error too (better than indexing an ACL as text). Other keys go
    to ``metadata`` untouched (YAML dates stay ``datetime.date``; non-string keys are turned
    into strings). Without a front-matter title, the first non-empty H1 outside fenced code
    is the title.

``chunk_markdown(body, count_tokens, max_tokens)``
    The body is read as a sequence of blocks:

    * ATX headings (``#`` .. ``######`` after at most three spaces, then a space, a tab or
      the end of the line; an optional closing ``#`` run is dropped). They start sections and
      never appear in chunk text. The section path is the stack of heading texts joined with
      ``" > "``; a heading pops every open heading of the same or a deeper level. Setext
      headings (a line underlined by ``===``/``---``) are not recognised: they stay prose.
    * Fenced code: a line made of at least three backticks or tildes (plus an info string;
      a backtick fence's info string may not contain a backtick) up to a line made only of
      the same character, at least as long. Fences are recognised at any indentation, so a
      fence nested in a list item stays whole. An unclosed fence runs to the end of the body
      (its trailing blank lines dropped). Nothing inside a fence is a heading or a table.
    * Tables: a run of lines starting with ``|``, or a GFM table (a header line containing
      ``|`` followed by a delimiter row such as ``--- | :---:`` with the same number of
      cells). After a delimiter row, rows need not start with ``|`` but must contain one.
      A table ends at a blank line, a heading or a fence.
    * Prose paragraphs: everything else, separated by blank (or whitespace-only) lines.

    Chunking rules:

    * A chunk never spans two sections; an empty section yields no chunk, and a blank body
      yields ``[]``.
    * Atomic blocks (a fence or a table) are always a chunk of their own, never split and
      never packed with prose, so ``kind`` is meaningful ("code" / "table"). One larger than
      ``max_tokens`` is still emitted whole, with ``oversized=True``.
    * Consecutive prose paragraphs of a section (between atomic blocks) are joined with
      ``"\\n\\n"`` and packed greedily up to ``max_tokens``, measured with ``count_tokens``
      on the exact chunk text. A paragraph that does not fit alone is cut at sentence
      boundaries (after ``.``, ``!``, ``?`` or ``…`` followed by whitespace, and before a
      list item starting a new line), a sentence that does not fit at word boundaries, and
      — last resort, e.g. for a long base64 blob — a word at character boundaries. Pieces
      keep their original spacing. A piece that has to be cut starts a new chunk; its last
      part is packed greedily with what follows.
    * Nothing is dropped but whitespace between chunks: every non-heading, non-blank line
      of the body appears in some chunk. ``oversized`` is exactly ``token_count >
      max_tokens``; for prose that can only happen when a single character is over budget.
    * Pure and deterministic. ``count_tokens`` is called O(log n) times per chunk on texts at
      most about twice the chunk size (galloping search), never once per word.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Literal

import yaml

__all__ = [
    "Chunk",
    "ChunkKind",
    "FrontMatterError",
    "ParsedSource",
    "SourceDecodeError",
    "chunk_markdown",
    "decode_source",
    "parse_source",
]

ChunkKind = Literal["prose", "code", "table"]


@dataclass(frozen=True)
class Chunk:
    """One retrievable piece of a document."""

    ordinal: int
    """0-based position in the document."""
    text: str
    """Markdown text; heading lines are not repeated; fences keep their fence lines."""
    section: str
    """Heading path, e.g. ``"Alerts > Thresholds > Cooldown"``; ``""`` before any heading."""
    kind: ChunkKind
    """``"code"`` for one fenced block, ``"table"`` for one table, else ``"prose"``."""
    token_count: int
    """``count_tokens(text)``."""
    oversized: bool
    """True when ``token_count > max_tokens`` (an unsplittable block over budget)."""


@dataclass(frozen=True)
class ParsedSource:
    """A decoded source split into front matter and Markdown body."""

    title: str | None
    permissions: list[str] | None
    metadata: dict[str, object]
    body: str


class SourceDecodeError(ValueError):
    """The source bytes are not valid UTF-8."""


class FrontMatterError(ValueError):
    """The YAML front matter is malformed or has a field of the wrong type."""


# --------------------------------------------------------------------------- decoding

_BOM = b"\xef\xbb\xbf"


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def decode_source(data: bytes, source: str) -> str:
    """Decode UTF-8 ``data`` (dropping a BOM) and normalise newlines to ``\\n``."""
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        text = data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = exc.start + skip
        raise SourceDecodeError(
            f"{source}: not valid UTF-8 (byte 0x{data[offset]:02x} at offset {offset}); skipped"
        ) from None
    return _normalise_newlines(text)


# --------------------------------------------------------------------------- front matter


def _is_front_matter_fence(line: str) -> bool:
    return line.rstrip() == "---"


def parse_source(text: str, source: str) -> ParsedSource:
    """Split ``text`` into parsed YAML front matter and the Markdown body."""
    text = _normalise_newlines(text.removeprefix("\ufeff"))
    lines = text.split("\n")
    raw: object = None
    body = text
    if lines and _is_front_matter_fence(lines[0]):
        end = next((i for i in range(1, len(lines)) if _is_front_matter_fence(lines[i])), None)
        if end is None:
            raise FrontMatterError(
                f"{source}: front matter opened by '---' on line 1 is never closed"
            )
        try:
            raw = yaml.safe_load("\n".join(lines[1:end]))
        except yaml.YAMLError as exc:
            raise FrontMatterError(
                f"{source}: malformed YAML front matter: {_describe_yaml_error(exc)}"
            ) from None
        body = "\n".join(lines[end + 1 :])

    if raw is None:
        front: dict[str, object] = {}
    elif isinstance(raw, dict):
        front = {str(key): value for key, value in raw.items()}
    else:
        raise FrontMatterError(
            f"{source}: front matter must be a YAML mapping, got {type(raw).__name__}"
        )

    title: str | None = None
    if "title" in front:
        value = front.pop("title")
        if value is not None:
            if not isinstance(value, str):
                raise FrontMatterError(
                    f"{source}: front matter 'title' must be a string, got {type(value).__name__}"
                )
            title = value.strip() or None

    permissions: list[str] | None = None
    if "permissions" in front:
        value = front.pop("permissions")
        if not isinstance(value, list):
            raise FrontMatterError(
                f"{source}: front matter 'permissions' must be a list of strings, "
                f"got {'null' if value is None else type(value).__name__}"
            )
        bad = [item for item in value if not isinstance(item, str)]
        if bad:
            raise FrontMatterError(
                f"{source}: front matter 'permissions' must be a list of strings, "
                f"found {bad[0]!r} ({type(bad[0]).__name__})"
            )
        permissions = [str(item) for item in value]

    if title is None:
        title = _first_h1(body)
    return ParsedSource(title=title, permissions=permissions, metadata=front, body=body)


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = exc.problem or exc.context or "invalid YAML"
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            # +2: the mark is 0-based and the front matter starts on line 2 of the file.
            return f"{problem} (line {mark.line + 2}, column {mark.column + 1})"
        return problem
    return str(exc) or type(exc).__name__


def _first_h1(body: str) -> str | None:
    for block in _scan(body.split("\n")):
        if isinstance(block, _Heading) and block.level == 1 and block.text:
            return block.text
    return None


# --------------------------------------------------------------------------- block scanner

_HEADING_RE = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*")
_CLOSING_HASHES_RE = re.compile(r"(?:^|[ \t]+)#+$")
_FENCE_OPEN_RE = re.compile(r"[ \t]*(`{3,}|~{3,})(.*)")
_FENCE_CLOSE_RE = re.compile(r"[ \t]*(`{3,}|~{3,})[ \t]*")
_DELIMITER_CELL_RE = re.compile(r":?-+:?")
_CELL_SPLIT_RE = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class _Heading:
    level: int
    text: str


@dataclass(frozen=True)
class _Block:
    kind: ChunkKind
    text: str


def _heading(line: str) -> _Heading | None:
    match = _HEADING_RE.fullmatch(line)
    if match is None:
        return None
    text = _CLOSING_HASHES_RE.sub("", (match.group(2) or "").strip()).strip()
    return _Heading(level=len(match.group(1)), text=text)


def _fence_open(line: str) -> str | None:
    """The fence marker when ``line`` opens a fenced code block."""
    match = _FENCE_OPEN_RE.fullmatch(line)
    if match is None:
        return None
    marker = match.group(1)
    if marker[0] == "`" and "`" in match.group(2):
        return None  # ```inline``` code span, not a fence
    return marker


def _closes(line: str, marker: str) -> bool:
    match = _FENCE_CLOSE_RE.fullmatch(line)
    if match is None:
        return False
    found = match.group(1)
    return found[0] == marker[0] and len(found) >= len(marker)


def _cells(line: str) -> list[str]:
    row = line.strip()
    row = row.removeprefix("|")
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [cell.strip() for cell in _CELL_SPLIT_RE.split(row)]


def _is_delimiter_row(line: str) -> bool:
    if "-" not in line:
        return False
    cells = _cells(line)
    return all(_DELIMITER_CELL_RE.fullmatch(cell) for cell in cells) and (
        "|" in line or len(cells) > 1
    )


def _table_start(lines: list[str], i: int) -> bool | None:
    """None when no table starts at ``lines[i]``, else whether it has a delimiter row."""
    line = lines[i]
    has_delimiter = i + 1 < len(lines) and _is_delimiter_row(lines[i + 1])
    if line.lstrip().startswith("|"):
        return has_delimiter and len(_cells(line)) == len(_cells(lines[i + 1]))
    if (
        has_delimiter
        and _CELL_SPLIT_RE.search(line) is not None
        and len(_cells(line)) == len(_cells(lines[i + 1]))
    ):
        return True
    return None


def _scan(lines: list[str]) -> Iterator[_Heading | _Block]:
    """Headings, fences, tables and prose paragraphs of ``lines``, in order."""
    paragraph: list[str] = []

    def flush() -> Iterator[_Block]:
        if paragraph:
            yield _Block("prose", "\n".join(paragraph))
            paragraph.clear()

    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            yield from flush()
            i += 1
            continue

        marker = _fence_open(line)
        if marker is not None:
            yield from flush()
            j = i + 1
            while j < n and not _closes(lines[j], marker):
                j += 1
            if j < n:
                block = lines[i : j + 1]
            else:  # unclosed: runs to the end of the body
                block = lines[i:]
                while not block[-1].strip():
                    block.pop()
            yield _Block("code", "\n".join(block))
            i = j + 1
            continue

        heading = _heading(line)
        if heading is not None:
            yield from flush()
            yield heading
            i += 1
            continue

        has_delimiter = _table_start(lines, i)
        if has_delimiter is not None:
            yield from flush()
            j = i + 1
            while j < n:
                row = lines[j]
                if (
                    not row.strip()
                    or _fence_open(row) is not None
                    or _heading(row) is not None
                    or not (
                        row.lstrip().startswith("|")
                        or (has_delimiter and _CELL_SPLIT_RE.search(row) is not None)
                    )
                ):
                    break
                j += 1
            yield _Block("table", "\n".join(lines[i:j]))
            i = j
            continue

        paragraph.append(line)
        i += 1
    yield from flush()


# --------------------------------------------------------------------------- prose packing

# Split levels of a prose atom: a paragraph is cut into sentences, a sentence into words, a
# word into characters; a single character cannot be cut.
_PARAGRAPH, _SENTENCE, _WORD, _CHAR = range(4)
_SENTENCE_END_RE = re.compile(r"[.!?…][\"'”’)\]]*(?=\s)")
_LIST_ITEM_START_RE = re.compile(r"\n(?=[ \t]*(?:[-*+]|\d{1,9}[.)])[ \t])")
_WORD_RE = re.compile(r"\S+")

_Span = tuple[int, int, int]  # start, end, level


def _split(text: str, start: int, end: int, level: int) -> list[_Span]:
    """Cut ``text[start:end]`` into non-blank pieces one level finer (possibly several)."""
    while level < _CHAR:
        level += 1
        piece = text[start:end]
        if level == _SENTENCE:
            cuts = {m.end() for m in _SENTENCE_END_RE.finditer(piece)}
            cuts |= {m.start() for m in _LIST_ITEM_START_RE.finditer(piece)}
            bounds = [0, *sorted(cuts), len(piece)]
            spans: list[_Span] = []
            for a, b in itertools.pairwise(bounds):
                part = piece[a:b]
                stripped = part.strip()
                if stripped:
                    lead = len(part) - len(part.lstrip())
                    s = start + a + lead
                    spans.append((s, s + len(stripped), level))
        elif level == _WORD:
            spans = [(start + m.start(), start + m.end(), level) for m in _WORD_RE.finditer(piece)]
        else:
            spans = [(k, k + 1, level) for k in range(start, end) if not text[k].isspace()]
        if len(spans) > 1:
            return spans
    return []


def _gallop(available: int, group_fits: Callable[[int], bool]) -> int:
    """Largest k in 1..available with ``group_fits(k)``, assuming k = 1 fits.

    Galloping then binary search: O(log k) probes. Only measured sizes are accepted, so the
    answer fits even if the token count is not perfectly monotonic in k.
    """
    good, bad = 1, available + 1
    probe = 2
    while probe <= available:
        if group_fits(probe):
            good = probe
            probe *= 2
        else:
            bad = probe
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        if group_fits(mid):
            good = mid
        else:
            bad = mid
    return good


def _prefix_fits(
    fits: Callable[[int, int], bool], start: int, pending: list[_Span], k: int
) -> bool:
    """Whether the atom at ``start`` and the next ``k - 1`` pending atoms fit together."""
    return fits(start, pending[-(k - 1)][1])


def _pack_prose(paragraphs: list[str], count: Callable[[str], int], max_tokens: int) -> list[str]:
    """Greedily pack paragraphs (cut finer where needed) into texts of at most max_tokens."""
    text = "\n\n".join(paragraphs)

    def fits(start: int, end: int) -> bool:
        return count(text[start:end]) <= max_tokens

    # ``pending`` is a stack: the next atom is at the end.
    pending: list[_Span] = []
    offset = len(text)
    for paragraph in reversed(paragraphs):
        offset -= len(paragraph)
        pending.append((offset, offset + len(paragraph), _PARAGRAPH))
        offset -= 2

    out: list[str] = []
    while pending:
        start, end, level = pending.pop()
        if not fits(start, end):
            parts = _split(text, start, end, level)
            if parts:
                pending.extend(reversed(parts))
            else:
                out.append(text[start:end])  # a single character over budget
            continue

        good = _gallop(len(pending) + 1, partial(_prefix_fits, fits, start, pending))
        if good > 1:
            end = pending[-(good - 1)][1]
            del pending[-(good - 1) :]
        out.append(text[start:end])
    return out


# --------------------------------------------------------------------------- chunking


def chunk_markdown(body: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[Chunk]:
    """Chunk a Markdown body by section; see the module docstring for the rules."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")

    cache: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in cache:
            cache[text] = count_tokens(text)
        return cache[text]

    chunks: list[Chunk] = []
    stack: list[_Heading] = []
    section = ""
    paragraphs: list[str] = []

    def emit(text: str, kind: ChunkKind) -> None:
        tokens = count(text)
        chunks.append(
            Chunk(
                ordinal=len(chunks),
                text=text,
                section=section,
                kind=kind,
                token_count=tokens,
                oversized=tokens > max_tokens,
            )
        )

    def flush_prose() -> None:
        if paragraphs:
            for text in _pack_prose(paragraphs, count, max_tokens):
                emit(text, "prose")
            paragraphs.clear()
            cache.clear()  # keep memory bounded to one prose run

    for block in _scan(_normalise_newlines(body).split("\n")):
        if isinstance(block, _Heading):
            flush_prose()
            while stack and stack[-1].level >= block.level:
                stack.pop()
            stack.append(block)
            section = " > ".join(h.text for h in stack if h.text)
        elif block.kind == "prose":
            paragraphs.append(block.text)
        else:
            flush_prose()
            emit(block.text, block.kind)
    flush_prose()
    return chunks
