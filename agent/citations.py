"""Citation markers: validate ``[^<chunk-id>]`` footnotes against the chunks actually retrieved.

The system prompt asks the model to mark claims drawn from ``search_docs`` with
``[^<chunk-id>]``. After (or while) it answers:

* :func:`extract_citations` resolves each marker to a retrieved chunk (structured citations,
  de-duplicated in first-appearance order), reports unknown ids as hallucinated, and strips
  those invented markers from the displayed answer;
* :func:`strip_hallucinated` removes invented markers cleanly;
* :class:`CitationStreamFilter` does the same to a stream of text deltas: it holds back a
  possibly partial marker until it is complete or proven not to be one, and never emits an
  invented marker, however the text is split (its output always equals
  ``strip_hallucinated(whole text)``).

This proves a marker points at a real retrieved chunk; ``agent.citation_support`` then checks
that the chunk holds what the claim says.

Stripping rule (shared by both): an invented marker is deleted, and so are partial-marker
fragments (``[``, ``[^``, ``[^ab``) right before it, so a deletion can never glue the text
around it into a new marker (``[^a[^x]b]`` must not become ``[^ab]``). If the character right
after it (in the original text) is whitespace, closing punctuation or the end of the text, the
spaces/tabs right before it (in the output so far) are deleted too (alternating with fragments
until neither is left at the end). So ``"Foo [^x]. Bar"`` -> ``"Foo. Bar"``,
``"Foo [^x] bar"`` -> ``"Foo bar"``, ``"Foo [^ok][^x]."`` -> ``"Foo [^ok]."``; text around
the marker is otherwise untouched.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

MAX_ID_LENGTH = 64
SNIPPET_CHARS = 240
MARKER = re.compile(r"\[\^([A-Za-z0-9_-]{1,64})\]")
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_HELD_SPACE = frozenset(" \t")  # removable whitespace before an invented marker
_CLOSERS = frozenset(".,;:!?)]}\"'»”’…")  # characters a marker usually sits right before


@dataclass(frozen=True)
class ChunkInfo:
    source: str
    section: str | None
    text: str


@dataclass(frozen=True)
class Citation:
    chunk_id: str
    source: str
    section: str | None
    snippet: str


@dataclass(frozen=True)
class CitationResult:
    citations: list[Citation]
    hallucinated: list[str]
    answer: str  # the answer with invented markers removed


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """A whitespace-normalised excerpt of at most ``limit`` characters, cut at a word
    boundary when possible and ending with an ellipsis when cut."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def _drops_space_before(next_char: str) -> bool:
    return next_char == "" or next_char.isspace() or next_char in _CLOSERS


def _fragment_start(text: str) -> int | None:
    """Where a partial marker (``[``, ``[^``, ``[^`` + up to 64 id chars) ending ``text``
    starts, or None."""
    end = len(text)
    i = end
    while i > 0 and text[i - 1] in _ID_CHARS and end - i <= MAX_ID_LENGTH:
        i -= 1
    if end - i > MAX_ID_LENGTH:
        return None
    if i >= 2 and text[i - 1] == "^" and text[i - 2] == "[":
        return i - 2
    if i == end and i >= 1 and text[i - 1] == "[":
        return i - 1
    return None


def _clean_tail(text: str, drop_spaces: bool) -> str:
    """What is left before a deleted invented marker: trailing partial-marker fragments go
    (so nothing glues into a new marker) and, with ``drop_spaces``, trailing spaces/tabs,
    alternately, until neither ends the text."""
    while True:
        cleaned = text
        start = _fragment_start(cleaned)
        while start is not None:
            cleaned = cleaned[:start]
            start = _fragment_start(cleaned)
        if drop_spaces:
            cleaned = cleaned.rstrip(" \t")
        if cleaned == text:
            return cleaned
        text = cleaned


def strip_hallucinated(answer: str, valid_ids: Collection[str]) -> str:
    """``answer`` without the markers whose id is not in ``valid_ids`` (see the module
    docstring for what goes with them)."""
    out: list[str] = []
    pos = 0
    for match in MARKER.finditer(answer):
        out.append(answer[pos : match.start()])
        pos = match.end()
        if match.group(1) in valid_ids:
            out.append(match.group(0))
            continue
        out = [_clean_tail("".join(out), _drops_space_before(answer[pos : pos + 1]))]
    out.append(answer[pos:])
    return "".join(out)


def cited_ids(answer: str) -> list[str]:
    """Every marker id in ``answer``, de-duplicated in first-appearance order."""
    return list(dict.fromkeys(m.group(1) for m in MARKER.finditer(answer)))


def extract_citations(answer: str, retrieved: Mapping[str, ChunkInfo]) -> CitationResult:
    """Resolve the answer's markers against the chunks retrieved during this run."""
    citations: list[Citation] = []
    hallucinated: list[str] = []
    for chunk_id in cited_ids(answer):
        chunk = retrieved.get(chunk_id)
        if chunk is None:
            hallucinated.append(chunk_id)
        else:
            citations.append(Citation(chunk_id, chunk.source, chunk.section, snippet(chunk.text)))
    return CitationResult(
        citations=citations,
        hallucinated=hallucinated,
        answer=strip_hallucinated(answer, retrieved.keys()) if hallucinated else answer,
    )


@dataclass
class CitationStreamFilter:
    """Streaming :func:`strip_hallucinated`: ``feed`` each text delta and send what it
    returns; ``flush`` at the end. Valid markers pass through as soon as their ``]`` arrives;
    invented ones are never emitted.

    What it holds back: a trailing run of spaces/tabs and of text proven not to be a marker
    but shaped like the start of one (``[``, ``[^ab`` followed by a space or a ``[``) - an
    invented marker right after them may delete them -, and the partial marker being read
    (``[``, ``[^``, ``[^ab``). Anything else is emitted at once.

    ``pop_citations()`` returns the valid chunk ids whose marker was emitted since the last
    call, each id once per stream (for ``citation`` events); ``cited`` and ``hallucinated``
    list all of them, in first-appearance order.
    """

    valid_ids: Collection[str]
    cited: list[str] = field(default_factory=list)
    hallucinated: list[str] = field(default_factory=list)
    _held: str = field(default="", init=False, repr=False)  # spaces and fragments
    _marker: str = field(default="", init=False, repr=False)  # "", "[", "[^", "[^ab", ...
    _after_invented: bool = field(default=False, init=False, repr=False)
    _new: list[str] = field(default_factory=list, init=False, repr=False)
    _flushed: bool = field(default=False, init=False, repr=False)

    def feed(self, delta: str) -> str:
        if self._flushed:
            raise RuntimeError("feed() after flush()")
        out: list[str] = []
        for char in delta:
            self._char(char, out)
        return "".join(out)

    def flush(self) -> str:
        """End of text: a pending partial marker is plain text; what an invented marker at
        the very end may delete is deleted."""
        self._flushed = True
        if self._after_invented:
            self._held = _clean_tail(self._held, drop_spaces=True)
        text = self._held + self._marker
        self._held, self._marker, self._after_invented = "", "", False
        return text

    def pop_citations(self) -> list[str]:
        new, self._new = self._new, []
        return new

    # --- the state machine -------------------------------------------------------------------

    def _char(self, char: str, out: list[str]) -> None:
        if self._marker:
            self._marker_char(char, out)
            return
        if self._after_invented:
            self._after_invented = False
            self._held = _clean_tail(self._held, _drops_space_before(char))
        self._plain_char(char, out)

    def _plain_char(self, char: str, out: list[str]) -> None:
        if char in _HELD_SPACE:
            self._held += char
        elif char == "[":
            self._marker = "["
        else:
            out.append(self._held + char)
            self._held = ""

    def _marker_char(self, char: str, out: list[str]) -> None:
        marker = self._marker
        if marker == "[":
            if char == "^":
                self._marker = "[^"
                return
        elif char == "]" and len(marker) > 2:
            self._close_marker(marker[2:], out)
            return
        elif char in _ID_CHARS and len(marker) - 2 < MAX_ID_LENGTH:
            self._marker += char
            return
        # Not a marker after all (its text holds no other "["); this character starts over.
        self._marker = ""
        if char in _HELD_SPACE or char == "[":
            self._held += marker  # a fragment an invented marker may still delete
        else:
            out.append(self._held + marker)
            self._held = ""
        self._plain_char(char, out)

    def _close_marker(self, chunk_id: str, out: list[str]) -> None:
        self._marker = ""
        if chunk_id in self.valid_ids:
            out.append(self._held + f"[^{chunk_id}]")
            self._held = ""
            if chunk_id not in self.cited:
                self.cited.append(chunk_id)
                self._new.append(chunk_id)
            return
        if chunk_id not in self.hallucinated:
            self.hallucinated.append(chunk_id)
        self._after_invented = True  # what is held waits for the next character
